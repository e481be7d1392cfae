"""What one thread block keeps on chip: one model for every tile-size estimate of the course.

A FlashAttention thread block holds a few tiles at a time. Notebooks 03, 04 and 07 size them in
three ways, and this module is the one place that says what each way counts:

    bytes, forward (03)     Q_i, K_j, V_j in the input dtype (bf16: 2 bytes); the score tile
                            S_ij, the accumulator acc and the row state m_i, l_i in fp32.
    elements (04)           the same parts counted in elements, against an on-chip memory of
                            M elements: with Br = M // (6 d) and Bc = min(Br, d) they fill at
                            most 0.875 M (for d >= 8), whatever the dtype.
    rule of thumb 16 B d    four B x d tiles in fp32 (Q, K, V, acc): leaves out the B x B score
                            tile and m_i, l_i, so it overestimates the largest B that fits.
    bytes, backward (07)    K_j, V_j and their fp32 gradient accumulators dK_j, dV_j stay;
                            Q_i and dO_i stream; lse_i and D_i; two score-sized tiles (P_ij and
                            dS_ij).

`TileBudget.over(hw)` says when a budget exceeds one SM's shared memory: real kernels then keep
part of it (the accumulators) in the register file, or use smaller tiles. Memory sizes follow
NVIDIA's spec sheets, whose "KB" and "MB" are binary: 228 KB of shared memory is 228 KiB.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from course_utils._validate import positive_int

KiB = 1024


@dataclass(frozen=True)
class Part:
    """One array on chip: `elements` numbers of `bytes_per_element` bytes each."""

    name: str
    elements: int
    bytes_per_element: int

    @property
    def bytes(self) -> int:
        return self.elements * self.bytes_per_element


@dataclass(frozen=True)
class TileBudget:
    """The parts one thread block keeps on chip, and what they add up to."""

    what: str  # e.g. "forward, Br = Bc = 128, d = 64"
    parts: tuple[Part, ...]

    @property
    def elements(self) -> int:
        return sum(p.elements for p in self.parts)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.parts)

    def without(self, *names: str) -> TileBudget:
        """The same budget with some parts left out (to see what a rougher estimate drops)."""
        unknown = set(names) - {p.name for p in self.parts}
        if unknown:
            raise ValueError(f"names: no part called {sorted(unknown)} in {self.what}")
        kept = tuple(p for p in self.parts if p.name not in names)
        return replace(self, what=f"{self.what}, without {', '.join(names)}", parts=kept)

    def over(self, hw) -> str | None:
        """None when the budget fits in one SM's shared memory of hw; else a one-line flag."""
        if self.bytes <= hw.sram_per_sm:
            return None
        return (
            f"exceeds the {hw.sram_per_sm / KiB:.0f} KiB of shared memory of one {hw.name} SM by "
            f"{(self.bytes - hw.sram_per_sm) / KiB:.0f} KiB: a real kernel keeps the accumulators "
            f"in registers or uses smaller tiles"
        )

    def table(self, hw=None) -> str:
        """A printable table: each part in elements and KiB, the total, and the flag for hw."""
        width = max(len(p.name) for p in self.parts) + 2
        lines = [f"{self.what}:"]
        for p in self.parts:
            lines.append(
                f"{p.name:>{width}}: {p.elements:>7,} elements x {p.bytes_per_element} B "
                f"= {p.bytes / KiB:6.1f} KiB"
            )
        lines.append(
            f"{'total':>{width}}: {self.elements:>7,} elements      = {self.bytes / KiB:6.1f} KiB"
        )
        if hw is not None:
            fits = f"fits in the {hw.sram_per_sm / KiB:.0f} KiB of one {hw.name} SM"
            lines.append(f"{'':>{width}}  {self.over(hw) or fits}")
        return "\n".join(lines)


def _sizes(Br, Bc, d, input_bytes, accum_bytes):
    return (
        positive_int(Br, "Br"),
        positive_int(Bc, "Bc"),
        positive_int(d, "d"),
        positive_int(input_bytes, "input_bytes"),
        positive_int(accum_bytes, "accum_bytes"),
    )


def forward_budget(
    Br: int, Bc: int, d: int, input_bytes: int = 2, accum_bytes: int = 4
) -> TileBudget:
    """The forward pass of one thread block: Q_i, K_j, V_j, S_ij, acc, m_i and l_i.

    Args:
        Br: query rows of the tile.  Bc: keys of a K/V tile.  d: head dimension.
        input_bytes: bytes per element of Q, K, V (2 for bf16; 1 to count elements).
        accum_bytes: bytes per element of S_ij, acc, m_i, l_i (4 for fp32; 1 to count elements).
    """
    Br, Bc, d, b_in, b_acc = _sizes(Br, Bc, d, input_bytes, accum_bytes)
    return TileBudget(
        f"forward, Br = {Br}, Bc = {Bc}, d = {d}",
        (
            Part("Q_i", Br * d, b_in),
            Part("K_j and V_j", 2 * Bc * d, b_in),
            Part("score tile S_ij", Br * Bc, b_acc),
            Part("acc", Br * d, b_acc),
            Part("m_i and l_i", 2 * Br, b_acc),
        ),
    )


def backward_budget(
    Br: int, Bc: int, d: int, input_bytes: int = 2, accum_bytes: int = 4
) -> TileBudget:
    """The backward pass of one thread block (FlashAttention-2 order: K_j, V_j stay, Q_i streams).

    Args as forward_budget; the parts: K_j and V_j, dK_j and dV_j (accumulated), Q_i and dO_i
    (streamed), lse_i and D_i, and two score-sized tiles (P_ij, then dS_ij).
    """
    Br, Bc, d, b_in, b_acc = _sizes(Br, Bc, d, input_bytes, accum_bytes)
    return TileBudget(
        f"backward, Br = {Br}, Bc = {Bc}, d = {d}",
        (
            Part("K_j and V_j", 2 * Bc * d, b_in),
            Part("dK_j and dV_j", 2 * Bc * d, b_acc),
            Part("Q_i and dO_i", 2 * Br * d, b_in),
            Part("lse_i and D_i", 2 * Br, b_acc),
            Part("P_ij and dS_ij", 2 * Br * Bc, b_acc),
        ),
    )


def rule_of_thumb(B: int, d: int) -> TileBudget:
    """16 B d bytes: Q, K, V and acc as four B x d tiles in fp32, nothing else."""
    return forward_budget(B, B, d, input_bytes=4, accum_bytes=4).without(
        "score tile S_ij", "m_i and l_i"
    )


def largest_square_tile(sram_bytes: int, d: int, budget=forward_budget, **sizes) -> int:
    """The largest B with budget(B, B, d, **sizes).bytes <= sram_bytes (0 if none fits).

    budget: forward_budget, backward_budget, or any function (B, B, d, **sizes) -> TileBudget,
    e.g. `lambda Br, Bc, d: rule_of_thumb(Br, d)`.
    """
    sram_bytes, d = positive_int(sram_bytes, "sram_bytes"), positive_int(d, "d")
    lo, hi = 0, 1
    while budget(hi, hi, d, **sizes).bytes <= sram_bytes:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:  # the budget grows with B: bisect
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if budget(mid, mid, d, **sizes).bytes <= sram_bytes else (lo, mid)
    return lo


def elements_tiles(M: int, d: int) -> tuple[int, int]:
    """The tile sizes of the element model (notebook 04): Br = max(1, M // (6 d)), Bc = min(Br, d).

    For M >= 6 d and d >= 8 forward_budget(Br, Bc, d, 1, 1).elements <= 0.875 M.
    """
    M, d = positive_int(M, "M"), positive_int(d, "d")
    Br = max(1, M // (6 * d))
    return Br, min(Br, d)
