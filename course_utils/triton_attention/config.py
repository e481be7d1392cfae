"""Kernel configuration: the dtype and the tiles a chip takes, without the chip being there.

What the teaching kernels (forward.py, backward.py) and the notebooks ask before a launch:

    pick_dtype(capability)          float16 below sm_80 (no bfloat16 there), bfloat16 from sm_80
    check_dtype_for(capability, dtype, name)
                                    the TypeError of bfloat16 on a chip without it
    tile_config(capability, d, dtype, pass_)
                                    (BLOCK_M, BLOCK_N, num_warps, num_stages) for one kernel whose
                                    shared memory fits the chip (sm_75: 64 KiB per block)
    FWD_FAMILIES, DKDV_FAMILIES, DQ_FAMILIES, family(d, dtype)
                                    the kernels' autotuning sets, tuned on an H200: the autotuners
                                    of forward.py and backward.py try them, `tile_config` picks
                                    from them on chips from sm_80 on

Plain data and arithmetic: it imports no kernel and no triton, so the kernels import it (and not
the other way round) and a notebook may ask it on any machine. Compiling a kernel for a chip that
is not there is `cross_compile`'s job.

Facts behind the choices (Triton 3.6 on the course's GPU machine, 3.9 on CPU machines):

- Since Triton 3.2 (pull request 5066) `tl.dot` becomes tensor-core instructions (mma) only from
  sm_80 on; below it is lowered to fp32 FMA on the CUDA cores. On a T4 the kernels therefore run
  without tensor cores in every dtype, the dot operands pass through shared memory, and the
  accumulators and score tiles are held in registers: so tiles are smaller there, and one pipeline
  stage is all there is (Triton pipelines loads with cp.async from sm_80 on).
- bfloat16 on sm_75: the T4 has no bfloat16 arithmetic and no bfloat16 tensor cores, and this
  course cannot check bfloat16 results on such a card. The kernels refuse bfloat16 below sm_80
  with an error that names q and points to `pick_dtype`; the notebooks call `pick_dtype` and run
  in float16 there (a choice of dtype, not a silent cast: float16 has a smaller range, 65504).
- Shared memory per block: 48 KiB without opt-in on every chip since Volta; with opt-in 64 KiB on
  sm_75, 163 KiB on sm_80, 99 KiB on sm_86 and sm_89, 227 KiB on sm_90. Triton opts in by itself
  when a kernel needs more than 48 KiB.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch

from course_utils.references.tile_budget import KiB, Part, TileBudget

# ---------------------------------------------------------------------------------------------
# Chips
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chip:
    """What tile choice needs to know of one NVIDIA GPU generation."""

    capability: tuple[int, int]  # (major, minor), as torch.cuda.get_device_capability gives it
    name: str
    shared_optin: int  # bytes of shared memory one block may use after opting in
    sms: int  # streaming multiprocessors of the course's example card
    shared_default: int = 48 * KiB  # without opt-in

    @property
    def sm(self) -> int:
        """75 for (7, 5): the number in sm_75 and in GPUTarget("cuda", 75, 32)."""
        return 10 * self.capability[0] + self.capability[1]

    @property
    def bfloat16(self) -> bool:
        """bfloat16 arithmetic and tensor cores: Ampere (sm_80) and newer."""
        return self.capability >= (8, 0)

    @property
    def pipelined(self) -> bool:
        """Triton overlaps loads with compute (cp.async, num_stages > 1) from sm_80 on."""
        return self.capability >= (8, 0)


CHIPS = {
    (7, 5): Chip((7, 5), "Turing (Tesla T4)", 64 * KiB, 40),
    (8, 0): Chip((8, 0), "Ampere (A100)", 163 * KiB, 108),
    (8, 6): Chip((8, 6), "Ampere (A10, RTX 30)", 99 * KiB, 72),
    (8, 9): Chip((8, 9), "Ada (L4, RTX 40)", 99 * KiB, 58),
    (9, 0): Chip((9, 0), "Hopper (H100, H200)", 227 * KiB, 132),
}
SM75, SM80, SM90 = CHIPS[(7, 5)], CHIPS[(8, 0)], CHIPS[(9, 0)]


def chip(capability) -> Chip:
    """The Chip of a capability: a Chip, (major, minor), or the sm number (75, 80, 90)."""
    if isinstance(capability, Chip):
        return capability
    if isinstance(capability, int) and not isinstance(capability, bool):
        capability = divmod(capability, 10)
    try:
        key = tuple(int(x) for x in capability)
    except (TypeError, ValueError):
        key = None
    if key not in CHIPS:
        known = ", ".join(f"{c.capability} ({c.name})" for c in CHIPS.values())
        raise ValueError(f"capability must be one of {known}, got {capability!r}")
    return CHIPS[key]


def pick_dtype(capability) -> torch.dtype:
    """torch.float16 below sm_80 (a T4 has no bfloat16), torch.bfloat16 from sm_80 on.

    In a notebook: `pick_dtype(torch.cuda.get_device_capability())` on a GPU.
    """
    return torch.bfloat16 if chip(capability).bfloat16 else torch.float16


def check_dtype_for(capability, dtype: torch.dtype, name: str = "dtype") -> None:
    """Raise a TypeError naming `name` when `dtype` is bfloat16 on a chip without bfloat16."""
    c = chip(capability)
    if dtype == torch.bfloat16 and not c.bfloat16:
        raise TypeError(
            f"{name} is bfloat16, but sm_{c.sm} ({c.name}) has no bfloat16 arithmetic or tensor "
            f"cores; use torch.float16 there: pick_dtype({c.capability}) gives it"
        )


# ---------------------------------------------------------------------------------------------
# Autotuning sets of the teaching kernels
# ---------------------------------------------------------------------------------------------

# Forward, (BLOCK_M, BLOCK_N, num_warps, num_stages, maxnreg), picked from sweeps on an H200
# (docs/journal.md). Each family is what suits one class of (d, dtype): `family`.
FWD_FAMILIES = {
    "d<=64": [
        (128, 128, 8, 2, 128),  # two programs per SM
        (128, 64, 4, 3, 168),  # three programs per SM
        (128, 64, 4, 3, None),
        (128, 64, 8, 3, None),
        (128, 128, 4, 3, None),
    ],
    "d<=128": [
        (128, 64, 8, 2, 128),  # two programs per SM: best at short N
        (128, 128, 8, 3, None),  # one program per SM, 230 KB of shared memory: best at long N
        (128, 64, 8, 3, None),
    ],
    # d > 128 or float32: 64-query tiles, or the accumulator and the tiles do not fit.
    "large": [(64, bn, w, s, None) for bn in (32, 64) for w in (4, 8) for s in (1, 2)],
}

# Backward, (BLOCK_M, BLOCK_N, num_warps, num_stages), one family per class of (d, dtype).
# Chosen by compiling for sm_90 on a CPU machine (triton 3.9): every bf16 config below runs
# without spilling registers except (64, 128, 8, 2) at d=128 (64 bytes of stack); those dropped
# spilled hundreds of bytes (a 64 x 128 key-query block with 4 warps: dK and dV alone take 128
# fp32 registers per thread at d=64). Not swept one by one on a GPU.
DKDV_FAMILIES = {
    "d<=64": [(64, 128, 8, 3), (32, 128, 8, 4), (64, 64, 4, 3), (32, 64, 4, 4)],
    "d<=128": [(32, 128, 8, 4), (64, 128, 8, 2), (32, 64, 4, 4), (32, 128, 8, 3)],
    # d > 128 or float32: the resident tiles and accumulators need small tiles.
    "large": [(32, 64, 4, 2), (32, 64, 8, 2), (16, 32, 4, 1)],
}
DQ_FAMILIES = {
    "d<=64": [(128, 32, 4, 4), (128, 64, 8, 3), (64, 64, 4, 3), (128, 32, 8, 4)],
    "d<=128": [(128, 32, 8, 4), (128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 4)],
    "large": [(64, 32, 4, 2), (64, 32, 8, 2), (32, 16, 4, 1)],
}


FAMILIES = {"fwd": FWD_FAMILIES, "dkdv": DKDV_FAMILIES, "dq": DQ_FAMILIES}
"""The autotuning sets by pass (see PASSES), each by `family`."""


def family(head_dim: int, dtype: torch.dtype) -> str:
    """The class of (d, dtype) that picks a family: "d<=64", "d<=128", or "large" (d > 128 or
    4-byte elements)."""
    if head_dim > 128 or dtype.itemsize > 2:
        return "large"
    return "d<=64" if head_dim <= 64 else "d<=128"


# ---------------------------------------------------------------------------------------------
# Shared-memory model and tiles
# ---------------------------------------------------------------------------------------------

PASSES = ("fwd", "dkdv", "dq")
"""fwd: the forward kernel; dkdv, dq: the two gradient kernels of the backward."""


def shared_budget(
    pass_: str,
    block_m: int,
    block_n: int,
    block_d: int,
    itemsize: int,
    num_stages: int = 1,
    fma: bool = False,
) -> TileBudget:
    """Shared memory of one program of `pass_`, as the kernels' autotune pruners count it.

    fwd: q once, k and v once per pipeline stage. dkdv (k, v stay) and dq (q, dO stay): the two
    resident tiles, the two streamed tiles once per stage, and one score-sized tile (P or dS staged
    for a product). It is the model the pruners of forward.py and backward.py use on every GPU
    (input dtype, num_stages deep). Registers are not counted: accumulators and scores live there.
    fma=True (below sm_80, where tl.dot runs on FMA) adds the forward's P tile, which that path
    also stages. `chip_shared_budget` applies the model to one chip.
    """
    if pass_ not in PASSES:
        raise ValueError(f"pass_ must be one of {PASSES}, got {pass_!r}")
    bm, bn, st = block_m, block_n, num_stages
    if pass_ == "fwd":
        parts = (
            Part("q", bm * block_d, itemsize),
            Part("k and v", 2 * st * bn * block_d, itemsize),
        )
        if fma:
            parts += (Part("P", bm * bn, itemsize),)
    else:
        resident, streamed = (bn, bm) if pass_ == "dkdv" else (bm, bn)
        names = ("k and v", "q and dO") if pass_ == "dkdv" else ("q and dO", "k and v")
        parts = (
            Part(names[0], 2 * resident * block_d, itemsize),
            Part(names[1], 2 * st * streamed * block_d, itemsize),
            Part("P or dS", bm * bn, itemsize),
        )
    what = f"{pass_}, BLOCK_M = {bm}, BLOCK_N = {bn}, BLOCK_D = {block_d}, {st} stage(s)"
    return TileBudget(what, parts)


def chip_shared_budget(
    capability, pass_: str, block_m: int, block_n: int, d: int, dtype: torch.dtype, num_stages: int
) -> TileBudget:
    """`shared_budget` of one config on one chip.

    From sm_80 on: the input dtype, num_stages deep. Below sm_80 Triton lowers tl.dot to FMA and
    stages the products' operands in shared memory as fp32, without pipelining: 4 bytes per
    element, one stage, and the forward's P tile too. tests/kernels/test_triton_targets.py
    checks that
    this bounds the shared bytes Triton's compiler reports for every sm_75 pick of `tile_config`.
    """
    c = chip(capability)
    bd = padded_head_dim(d)
    if c.pipelined:
        return shared_budget(pass_, block_m, block_n, bd, dtype.itemsize, num_stages)
    return shared_budget(pass_, block_m, block_n, bd, 4, 1, fma=True)


class _Tiles(NamedTuple):
    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int


class TileConfig(_Tiles):
    """A launch configuration: a tuple (BLOCK_M, BLOCK_N, num_warps, num_stages), and beside it
    `maxnreg`, the cap on registers per thread (None: no cap).

    The cap is not an item of the tuple, so `bm, bn, warps, stages = config` reads the four; it is
    what lets two or three programs share a multiprocessor (a program of 8 warps at 193
    registers a thread fills one SM of Hopper alone; at 128 two fit). Notebook 06's forward on an
    H200 ran 1.1 to 1.5 times as fast with it as without (docs/journal.md, "register
    cap"). Pass it to the launch with the rest: `kernel[grid](..., **config.launch_options())`.
    """

    maxnreg: int | None = None  # the class default, for tuples built without __new__ (_make)

    def __new__(cls, BLOCK_M, BLOCK_N, num_warps, num_stages, maxnreg=None):  # noqa: N803
        self = super().__new__(cls, BLOCK_M, BLOCK_N, num_warps, num_stages)
        self.maxnreg = maxnreg
        return self

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, maxnreg={self.maxnreg})"

    def _replace(self, **changes) -> TileConfig:
        """A copy with some fields changed, the cap (maxnreg=) among them; the cap is kept."""
        maxnreg = changes.pop("maxnreg", self.maxnreg)
        return TileConfig(*_Tiles._replace(self, **changes), maxnreg=maxnreg)

    def launch_options(self) -> dict:
        """num_warps, num_stages and maxnreg, as keyword arguments of a kernel launch."""
        return {"num_warps": self.num_warps, "num_stages": self.num_stages, "maxnreg": self.maxnreg}


# Tiles for chips without tensor cores in Triton (sm_75), (BLOCK_M, BLOCK_N, num_warps), by the
# padded head dimension BLOCK_D, chosen by compiling candidates for sm_75 on a CPU machine: the
# largest tiles whose fp32 FMA products leave the registers unspilled (with 255 registers per
# thread at most, most candidates spill: e.g. the forward's 64 x 64 tile at d = 64 spills 3.4 KB
# per thread), one stage. tests/kernels/test_triton_targets.py compiles every entry and
# prints the table.
SM75_TILES = {
    "fwd": {16: (64, 32, 8), 32: (64, 32, 8), 64: (64, 32, 8), 128: (64, 16, 8)},
    "dkdv": {16: (32, 64, 8), 32: (16, 32, 8), 64: (16, 32, 8), 128: (16, 16, 8)},
    "dq": {16: (64, 16, 8), 32: (32, 16, 4), 64: (64, 16, 8), 128: (16, 16, 8)},
}
SM75_MAX_HEAD_DIM = 128
"""Below sm_80 d = 256 is refused: its smallest tiles (16 x 16) exceed 64 KiB in the backward by
`chip_shared_budget`'s count, and no d = 256 compile for sm_75 has been checked."""


def padded_head_dim(d: int) -> int:
    """BLOCK_D: the head dimension d padded to a power of two, at least 16."""
    return max(16, 1 << (d - 1).bit_length())


def tile_config(capability, d: int, dtype: torch.dtype, pass_: str = "fwd") -> TileConfig:
    """Tiles, warps and stages for one kernel on one chip, within its shared memory.

    Every returned config also suits causal=True: BLOCK_M is a multiple of BLOCK_N for fwd and
    dq, BLOCK_N a multiple of BLOCK_M for dkdv.

    Args:
        capability: (major, minor), an sm number (75) or a Chip.
        d: head dimension, 16..256 (16..128 below sm_80).
        dtype: torch.float16, torch.bfloat16 or torch.float32 (bfloat16 refused below sm_80).
        pass_: "fwd", "dkdv" or "dq".

    Below sm_80: SM75_TILES, one stage. From sm_80 on: the first config of the kernel's own
    autotuning family (FAMILIES: FWD_FAMILIES, DKDV_FAMILIES, DQ_FAMILIES, the sets
    tuned on an H200) whose shared memory fits the chip, so on Hopper it is exactly what the
    autotuner may pick.
    """
    c = chip(capability)
    if pass_ not in PASSES:
        raise ValueError(f"pass_ must be one of {PASSES}, got {pass_!r}")
    if not isinstance(d, int) or isinstance(d, bool) or not 16 <= d <= 256:
        raise ValueError(f"d must be an int in 16..256, got {d!r}")
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(
            f"dtype must be torch.float16, torch.bfloat16 or torch.float32, got {dtype}"
        )
    check_dtype_for(c, dtype)
    return _fitting_config(c, d, dtype, pass_)


@functools.cache  # a launcher asks on every call: the budgets below cost more than a launch
def _fitting_config(c: Chip, d: int, dtype: torch.dtype, pass_: str) -> TileConfig:
    """tile_config's choice, for arguments it has checked."""
    padded = padded_head_dim(d)
    if not c.pipelined:
        if d > SM75_MAX_HEAD_DIM:
            raise ValueError(
                f"d must be at most {SM75_MAX_HEAD_DIM} on sm_{c.sm} ({c.name}), got {d}: "
                "the tiles of a larger head do not fit its shared memory (see SM75_MAX_HEAD_DIM)"
            )
        table = SM75_TILES[pass_]
        bm, bn, w = table[min(k for k in table if k >= padded)]
        return TileConfig(bm, bn, w, 1)  # float32 too: the FMA products are fp32 in any dtype

    tuned = FAMILIES[pass_][family(d, dtype)]

    def shared(cfg):
        return chip_shared_budget(c, pass_, cfg[0], cfg[1], d, dtype, cfg[3]).bytes

    fits = [cfg for cfg in tuned if shared(cfg) <= c.shared_optin]
    if fits:
        return TileConfig(*fits[0][:5])  # the register cap too, where the family has one
    # None fits (a chip with less shared memory than Hopper): from the smallest tiles of the
    # family, one stage fewer, then the streamed tile halved, then the resident one, down to 16.
    bm, bn, w, s = min(tuned, key=lambda f: (f[0] * f[1], f[3]))[:4]
    streamed_is_m = pass_ == "dkdv"
    while shared((bm, bn, w, s)) > c.shared_optin:
        streamed, resident = (bm, bn) if streamed_is_m else (bn, bm)
        if s > 1:
            s -= 1
        elif streamed > 16:
            streamed //= 2
        elif resident > 16:
            resident //= 2
        else:
            raise ValueError(
                f"d = {d} in {dtype} does not fit sm_{c.sm} ({c.name}) even in 16 x 16"
            )
        bm, bn = (streamed, resident) if streamed_is_m else (resident, streamed)
    return TileConfig(bm, bn, w, s)
