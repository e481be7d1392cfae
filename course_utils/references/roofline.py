"""The roofline: FLOPs, bytes, arithmetic intensity and the time lower bounds they set.

A kernel that does F FLOPs and moves B bytes of HBM traffic on hardware with peak P FLOP/s and
bandwidth W B/s takes at least max(F / P, B / W) seconds. Its arithmetic intensity F / B decides
which bound wins: below the ridge point P / W it is memory-bound. Attention does 4N^2 d FLOPs per
head in both versions; only the bytes differ (references.memory has the traffic formulas). The
numbers of each GPU (Hardware, H100_SXM, A100, H200) are hardware facts: harness.hardware.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_utils._validate import positive_int, positive_real
from course_utils.harness.hardware import H100_SXM, GiB, Hardware, MiB
from course_utils.references.memory import flash_attention_traffic, standard_attention_traffic


def _check_bool(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def attention_flops(N: int, d: int, causal: bool = False, batch: int = 1, heads: int = 1) -> int:
    """Forward FLOPs of attention: 4N^2 d per head (Q K^T and P V, 2N^2 d each); half if causal.

    The softmax is not counted, and causal counts exactly half, as the FlashAttention
    benchmarks do (the diagonal adds a lower-order N d).

    Args:
        N: sequence length.  d: head dimension.  causal: only keys j <= i.
        batch, heads: multiply the per-head count.

    Returns:
        An int.
    """
    N, d = positive_int(N, "N"), positive_int(d, "d")
    batch, heads = positive_int(batch, "batch"), positive_int(heads, "heads")
    per_head = (2 if _check_bool(causal, "causal") else 4) * N * N * d
    return per_head * batch * heads


def arithmetic_intensity(flops: float, nbytes: float) -> float:
    """flops / nbytes, in FLOP/byte.

    Args:
        flops: work, positive.  nbytes: HBM bytes moved, positive.
    """
    return positive_real(flops, "flops") / positive_real(nbytes, "nbytes")


@dataclass(frozen=True)
class TimeBounds:
    """The roofline bounds of one kernel; all times in seconds."""

    flops: float
    nbytes: float  # HBM bytes read + written
    intensity: float  # FLOP/byte
    compute_s: float  # flops / peak_flops
    memory_s: float  # nbytes / hbm_bandwidth
    bound: str  # "compute" or "memory": whichever time is larger
    lower_bound_s: float  # max(compute_s, memory_s)


def time_lower_bounds(flops: float, nbytes: float, hw: Hardware) -> TimeBounds:
    """max(flops / peak_flops, nbytes / hbm_bandwidth): no kernel runs faster on `hw`.

    Args:
        flops: work, positive.  nbytes: HBM traffic in bytes, positive.  hw: the Hardware.

    Returns:
        TimeBounds; bound is "memory" when nbytes / bandwidth exceeds flops / peak, i.e. when the
        intensity is below hw.ridge_point, else "compute".
    """
    if not isinstance(hw, Hardware):
        raise TypeError(f"hw must be a Hardware, got {type(hw).__name__}")
    flops, nbytes = positive_real(flops, "flops"), positive_real(nbytes, "nbytes")
    compute_s, memory_s = flops / hw.peak_flops, nbytes / hw.hbm_bandwidth
    bound = "memory" if memory_s > compute_s else "compute"
    return TimeBounds(
        flops, nbytes, flops / nbytes, compute_s, memory_s, bound, max(compute_s, memory_s)
    )


@dataclass(frozen=True)
class AttentionRoofline:
    """Standard attention and FlashAttention of one head on one GPU, side by side."""

    N: int
    d: int
    Br: int
    hw: Hardware
    standard: TimeBounds
    flash: TimeBounds

    @property
    def traffic_ratio(self) -> float:
        """Standard bytes / FlashAttention bytes (about 2 Br / d without L2)."""
        return self.standard.nbytes / self.flash.nbytes

    @property
    def speedup(self) -> float:
        """Ratio of the two time lower bounds, standard / FlashAttention."""
        return self.standard.lower_bound_s / self.flash.lower_bound_s


def attention_roofline(
    N: int,
    d: int,
    Br: int,
    hw: Hardware = H100_SXM,
    bytes_per_element: int = 2,
    l2_serves_rereads: bool = False,
) -> AttentionRoofline:
    """Roofline bounds of one head's forward pass, standard vs FlashAttention (FA2 order).

    Both do 4N^2 d FLOPs. Standard moves 4N^2 + 4Nd elements; FlashAttention moves
    2Nd + ceil(N/Br) 2Nd (lse not counted), or, with l2_serves_rereads=True, only 4Nd: Q, K, V
    read once and O written once, every K/V re-read served by L2 (the ideal case; it needs K
    and V of the head, 2Nd elements, to fit in hw.l2_bytes).

    Args:
        N: sequence length.  d: head dimension.  Br: query tile rows.  hw: the Hardware.
        bytes_per_element: 2 for bf16/fp16.
        l2_serves_rereads: count FlashAttention's K/V re-reads as L2 hits.

    Returns:
        AttentionRoofline with .standard and .flash TimeBounds (bytes, intensity, times).
    """
    b = positive_int(bytes_per_element, "bytes_per_element")
    flops = attention_flops(N, d)
    standard = standard_attention_traffic(N, d)
    Br = positive_int(Br, "Br")
    if _check_bool(l2_serves_rereads, "l2_serves_rereads"):
        flash = 4 * N * d
    else:
        flash = flash_attention_traffic(N, d, Br)
    return AttentionRoofline(
        N,
        d,
        Br,
        hw,
        time_lower_bounds(flops, standard * b, hw),
        time_lower_bounds(flops, flash * b, hw),
    )


@dataclass(frozen=True)
class BackwardMemory:
    """Bytes kept from the forward pass for the backward pass (besides Q, K, V)."""

    p_bytes: int  # standard: the probabilities P, N^2 per head
    o_bytes: int  # FlashAttention: the output O, N d per head
    lse_bytes: int  # FlashAttention: one fp32 logsumexp per row, N per head

    @property
    def standard_bytes(self) -> int:
        return self.p_bytes

    @property
    def flash_bytes(self) -> int:
        return self.o_bytes + self.lse_bytes


def backward_memory_bytes(
    N: int, d: int, bytes_per_element: int = 2, heads: int = 1, batch: int = 1
) -> BackwardMemory:
    """What each version stores for the backward pass: standard N^2 b, FlashAttention N d b + 4N.

    Standard autograd keeps P (N x N) to form dV = P^T dO and the softmax gradient; FlashAttention
    keeps O (for D_i = dO_i . O_i) and the fp32 lse (to recompute P tile by tile).

    Args:
        N: sequence length.  d: head dimension.  bytes_per_element: of P and O (2: bf16).
        heads, batch: multiply the per-head bytes.

    Returns:
        BackwardMemory with p_bytes, o_bytes, lse_bytes and the totals standard_bytes, flash_bytes.
    """
    N, d = positive_int(N, "N"), positive_int(d, "d")
    b = positive_int(bytes_per_element, "bytes_per_element")
    n = positive_int(heads, "heads") * positive_int(batch, "batch")
    return BackwardMemory(n * N * N * b, n * N * d * b, n * N * 4)


def max_tile_rows(sram_bytes: int, d: int, bytes_per_element: int = 4, arrays: int = 4) -> int:
    """The largest tile B whose `arrays` B x d tiles fit in SRAM: floor(sram / (arrays b d)).

    With the defaults (Q, K, V tiles and the output accumulator in fp32) a tile takes 16 B d
    bytes: B = 96 for d = 128 and B = 192 for d = 64 in 192 KB (196,608 bytes).

    Args:
        sram_bytes: on-chip memory per SM, bytes.  d: head dimension.
        bytes_per_element: 4 for fp32.  arrays: how many B x d arrays are on chip.

    Returns:
        An int >= 0; 0 means not even one row fits.
    """
    sram_bytes, d = positive_int(sram_bytes, "sram_bytes"), positive_int(d, "d")
    b, arrays = positive_int(bytes_per_element, "bytes_per_element"), positive_int(arrays, "arrays")
    return sram_bytes // (arrays * b * d)


@dataclass(frozen=True)
class AtScale:
    """The at-scale example (N = 16,384, one H100): one attention layer. Bytes, FLOPs, seconds."""

    N: int
    d: int
    Br: int
    heads: int
    hw: Hardware
    bytes_per_element: int
    s_bytes_per_head: int  # the N x N score matrix of one head
    s_bytes_all_heads: int
    lse_bytes_all_heads: int  # what FlashAttention keeps instead (fp32)
    flops_per_head: int  # 4 N^2 d
    compute_s: float
    standard_elements: int  # 4N^2 + 4Nd
    standard_bytes: int
    standard_s: float  # standard_bytes / bandwidth (the bound: larger than compute_s here)
    flash_elements: int  # 2Nd + 2N^2 d / Br, no cache
    flash_bytes: int
    flash_s: float
    kv_bytes_per_head: int  # K and V of one head: what L2 must hold to serve the re-reads
    l2_elements: int  # 4Nd: Q, K, V read once, O written once
    l2_bytes: int
    l2_s: float

    @property
    def standard_over_compute(self) -> float:
        """How many times the compute time standard attention's memory time is."""
        return self.standard_s / self.compute_s

    @property
    def traffic_ratio(self) -> float:
        """Standard / FlashAttention traffic without cache, about 2 Br / d."""
        return self.standard_elements / self.flash_elements

    @property
    def kv_fits_l2(self) -> bool:
        return self.kv_bytes_per_head <= self.hw.l2_bytes

    def summary(self) -> str:
        """The five steps of the worked example, as lines of text."""
        us = 1e6
        bound = "compute" if self.compute_s >= self.l2_s else "memory"
        fits = "fit" if self.kv_fits_l2 else "do not fit"
        return "\n".join(
            [
                f"N = {self.N:,}, d = {self.d}, {self.heads} heads, {self.bytes_per_element} B "
                f"per element, Br = {self.Br}, on {self.hw.name}",
                f"1. memory: S is {self.s_bytes_per_head / MiB:,.0f} MiB per head, "
                f"{self.s_bytes_all_heads / GiB:,.0f} GiB for {self.heads} heads; "
                f"FlashAttention keeps {self.lse_bytes_all_heads / MiB:,.0f} MiB of lse",
                f"2. compute per head: {self.flops_per_head:.3g} FLOP, "
                f">= {self.compute_s * us:.0f} us",
                f"3. standard traffic: {self.standard_elements:.3g} elements = "
                f"{self.standard_bytes / 1e9:.2f} GB, >= {self.standard_s * us:.0f} us "
                f"({self.standard_over_compute:.1f}x the compute time)",
                f"4. FlashAttention traffic, no cache: {self.flash_elements:.3g} elements = "
                f"{self.flash_bytes / 1e6:.0f} MB, >= {self.flash_s * us:.0f} us, "
                f"{self.traffic_ratio:.1f}x less (2 Br / d = {2 * self.Br / self.d:g})",
                f"5. with L2: K and V of one head are {self.kv_bytes_per_head / MiB:g} MiB and "
                f"{fits} in the {self.hw.l2_bytes / MiB:g} MiB L2; traffic 4Nd = "
                f"{self.l2_bytes / 1e6:.1f} MB, {self.l2_s * us:.1f} us: {bound}-bound",
            ]
        )


def at_scale_example(
    N: int = 16384,
    d: int = 64,
    Br: int = 128,
    heads: int = 16,
    hw: Hardware = H100_SXM,
    bytes_per_element: int = 2,
) -> AtScale:
    """The at-scale example (N = 16,384, one H100): memory, compute and traffic bounds of a layer.

    With the defaults (bf16, H100 SXM): S is 512 MiB per head, 8 GiB for 16 heads, lse 1 MiB;
    4N^2 d = 6.87e10 FLOP >= 69 us; standard 1.08e9 elements = 2.16 GB >= 644 us;
    FlashAttention 2.71e8 elements = 541 MB >= 162 us, 4x less; with L2 4Nd = 8.4 MB, 2.5 us.
    Times are per head and not rounded.

    Args:
        N: sequence length.  d: head dimension.  Br: query tile rows.  heads: heads per layer.
        hw: the Hardware.  bytes_per_element: 2 for bf16.

    Returns:
        AtScale with every number as a field (bytes, FLOPs, seconds); .summary() prints them.
    """
    N, d, Br = positive_int(N, "N"), positive_int(d, "d"), positive_int(Br, "Br")
    heads, b = positive_int(heads, "heads"), positive_int(bytes_per_element, "bytes_per_element")
    if not isinstance(hw, Hardware):
        raise TypeError(f"hw must be a Hardware, got {type(hw).__name__}")
    flops = attention_flops(N, d)
    standard = standard_attention_traffic(N, d)
    flash = flash_attention_traffic(N, d, Br)
    l2 = 4 * N * d
    return AtScale(
        N=N,
        d=d,
        Br=Br,
        heads=heads,
        hw=hw,
        bytes_per_element=b,
        s_bytes_per_head=N * N * b,
        s_bytes_all_heads=heads * N * N * b,
        lse_bytes_all_heads=heads * N * 4,
        flops_per_head=flops,
        compute_s=flops / hw.peak_flops,
        standard_elements=standard,
        standard_bytes=standard * b,
        standard_s=standard * b / hw.hbm_bandwidth,
        flash_elements=flash,
        flash_bytes=flash * b,
        flash_s=flash * b / hw.hbm_bandwidth,
        kv_bytes_per_head=2 * N * d * b,
        l2_elements=l2,
        l2_bytes=l2 * b,
        l2_s=l2 * b / hw.hbm_bandwidth,
    )
