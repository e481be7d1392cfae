"""Compile the course kernels for a GPU that is not there, and pick tiles that fit a given chip.

Three questions a learner on an older GPU (Colab's free Tesla T4, sm_75) runs into, answered
without the card:

    pick_dtype(capability)          float16 below sm_80 (no bfloat16 there), bfloat16 from sm_80
    tile_config(capability, d, dtype, pass_)
                                    (BLOCK_M, BLOCK_N, num_warps, num_stages) for one kernel whose
                                    shared memory fits the chip (sm_75: 64 KiB per block)
    compile_for(kernel, signature, constexprs, target)
                                    Triton's compiler run for that chip: PTX, cubin, shared bytes,
                                    registers per thread and spilled bytes

`compile_for` needs ptxas (Triton's wheel ships it) but no GPU and no driver: Triton compiles for
any `GPUTarget("cuda", capability, 32)`. One catch: a process that runs Triton's interpreter
(TRITON_INTERPRET=1, which `course_utils.triton_attention` switches on where there is no CUDA
GPU) has no compiler front end, because `triton.jit` then makes interpreted functions and
triton.language's own helpers (tl.max, tl.sum, ...) are interpreted too. There the compile runs in
a child Python process started without TRITON_INTERPRET and with COURSE_TRITON_COMPILE_ONLY=1
(which tells `course_utils.triton_attention` to leave the interpreter off: it compiles, it never
launches); the kernel is named there by its module and name, so it must live in an importable
module. Where kernels are real JITFunctions (a GPU machine) the compile runs in this process.

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

import base64
import functools
import importlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
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
    if c.pipelined:
        return shared_budget(pass_, block_m, block_n, _block_d(d), dtype.itemsize, num_stages)
    return shared_budget(pass_, block_m, block_n, _block_d(d), 4, 1, fma=True)


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


def _block_d(d: int) -> int:
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
    autotuning family (forward.CONFIG_FAMILIES, backward.DKDV_FAMILIES / DQ_FAMILIES, the sets
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
    block_d = _block_d(d)
    if not c.pipelined:
        if d > SM75_MAX_HEAD_DIM:
            raise ValueError(
                f"d must be at most {SM75_MAX_HEAD_DIM} on sm_{c.sm} ({c.name}), got {d}: "
                "the tiles of a larger head do not fit its shared memory (see SM75_MAX_HEAD_DIM)"
            )
        table = SM75_TILES[pass_]
        bm, bn, w = table[min(k for k in table if k >= block_d)]
        return TileConfig(bm, bn, w, 1)  # float32 too: the FMA products are fp32 in any dtype

    from course_utils.triton_attention import backward, forward

    if pass_ == "fwd":
        family = forward.CONFIG_FAMILIES[forward._family(d, dtype)]
    else:
        families = backward.DKDV_FAMILIES if pass_ == "dkdv" else backward.DQ_FAMILIES
        family = families[backward._family(d, dtype)]

    def shared(cfg):
        return chip_shared_budget(c, pass_, cfg[0], cfg[1], d, dtype, cfg[3]).bytes

    fits = [cfg for cfg in family if shared(cfg) <= c.shared_optin]
    if fits:
        return TileConfig(*fits[0][:5])  # the register cap too, where the family has one
    # None fits (a chip with less shared memory than Hopper): from the smallest tiles of the
    # family, one stage fewer, then the streamed tile halved, then the resident one, down to 16.
    bm, bn, w, s = min(family, key=lambda f: (f[0] * f[1], f[3]))[:4]
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


# ---------------------------------------------------------------------------------------------
# Compiling for a target
# ---------------------------------------------------------------------------------------------

COMPILE_ONLY_ENV = "COURSE_TRITON_COMPILE_ONLY"
_TORCH_TO_TRITON = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


@dataclass(frozen=True)
class Compiled:
    """What Triton's compiler made of one kernel for one target."""

    name: str
    capability: tuple[int, int]
    num_warps: int
    num_stages: int
    shared_bytes: int  # dynamic shared memory per program (Triton's metadata.shared)
    n_regs: int | None  # registers per thread (cuobjdump's REG), None without cuobjdump
    spill_bytes: int | None  # stack frame per thread (cuobjdump's STACK): spilled registers
    ptx: str = field(repr=False)
    cubin: bytes = field(repr=False)

    @property
    def cubin_bytes(self) -> int:
        return len(self.cubin)

    @property
    def tensor_cores(self) -> bool:
        """The PTX holds mma instructions (tensor cores); False where tl.dot became FMA."""
        return bool(re.search(r"\b(w?gmma|mma)\.", self.ptx))


def ptxas_path() -> str | None:
    """Triton's ptxas, or None where there is none (then nothing can be compiled)."""
    import triton

    candidates = [os.environ.get("TRITON_PTXAS_PATH", "")]
    candidates.append(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas"))
    candidates.append(shutil.which("ptxas") or "")
    return next((p for p in candidates if p and os.path.isfile(p)), None)


def _cuobjdump_path() -> str | None:
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    return path if os.path.isfile(path) else shutil.which("cuobjdump")


def _resource_usage(cubin: bytes) -> tuple[int | None, int | None]:
    """(registers, stack bytes) per thread of the cubin's kernel, read by cuobjdump."""
    tool = _cuobjdump_path()
    if tool is None:
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run(
            [tool, "--dump-resource-usage", f.name], capture_output=True, text=True, check=False
        ).stdout
    regs, stack = re.search(r"REG:(\d+)", text), re.search(r"STACK:(\d+)", text)
    return (int(regs.group(1)) if regs else None, int(stack.group(1)) if stack else None)


class CompileError(RuntimeError):
    """A kernel that Triton's compiler (or ptxas) refused for a target; the message names both."""


def _import_root(fn) -> str | None:
    """The sys.path entry from which fn's module imports: its file's folder, less one folder per
    dot of the module's name (None for a module without a file). A module made from a file
    (importlib.util.spec_from_file_location, as the tests do with a notebook's answer cells)
    imports in the compile process from the same folder; so does tests/triton06_answers."""
    module = sys.modules.get(fn.__module__)
    path = getattr(module, "__file__", None)
    if not path:
        return None
    root = os.path.dirname(os.path.abspath(path))
    if os.path.basename(path) == "__init__.py":
        root = os.path.dirname(root)
    for _ in range(fn.__module__.count(".")):
        root = os.path.dirname(root)
    return root


def _import_object(module: str, name: str, root: str | None):
    if root and root not in sys.path:
        sys.path.append(root)  # after the installed packages: never shadows them
    return getattr(importlib.import_module(module), name)


def _kernel_of(job: dict):
    """The object a job names; an autotuner or heuristics wrapper is unwrapped to its kernel."""
    import triton

    kernel = _import_object(job["module"], job["name"], job.get("root"))
    while hasattr(kernel, "fn") and not isinstance(kernel, triton.runtime.jit.JITFunction):
        kernel = kernel.fn
    return kernel


def _compilable_here(job: dict) -> bool:
    """False where triton.jit made an interpreted function (TRITON_INTERPRET=1 at its import)."""
    import triton

    kernel = _kernel_of(job)
    if getattr(kernel, "is_gluon", lambda: False)():
        # gluon.jit ignores the interpreter, but the gl.* helpers it calls were interpreted
        return os.environ.get("TRITON_INTERPRET") != "1"
    return isinstance(kernel, triton.runtime.jit.JITFunction)


def _make_source(kernel, signature: dict, constexprs: dict, divisible: tuple, backend):
    """triton.compiler.ASTSource on Triton 3.6 and 3.9 (and the older `constants` spelling).

    Constexprs are given by argument name; they are passed as (index,) paths, which both
    versions accept. Every constexpr also appears in the signature as "constexpr". `divisible`
    names the arguments that a launch would specialize as multiples of 16 (aligned pointers).
    """
    from triton.compiler import ASTSource

    if getattr(kernel, "is_gluon", lambda: False)():  # a @gluon.jit kernel (forward_ws)
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    names = list(kernel.arg_names)
    full = {n: ("constexpr" if n in constexprs else signature[n]) for n in names}
    consts = {(names.index(n),): v for n, v in constexprs.items()}
    attrs = {(names.index(n),): backend.parse_attr("D") for n in divisible}
    params = inspect.signature(ASTSource.__init__).parameters
    if "constexprs" in params:
        return ASTSource(kernel, full, constexprs=consts, attrs=attrs)
    return ASTSource(kernel, full, constants=consts, attrs=attrs)  # Triton before 3.3


def _compile_here(job: dict) -> Compiled:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    kernel = _kernel_of(job)
    cap = tuple(job["capability"])
    target = GPUTarget("cuda", 10 * cap[0] + cap[1], 32)
    backend = make_backend(target)
    constexprs = {
        n: (_import_object(*v[_JIT_REF]) if isinstance(v, dict) and _JIT_REF in v else v)
        for n, v in job["constexprs"].items()
    }  # a @triton.jit function passed as a tl.constexpr (notebook 09's ATTEND) is named
    src = _make_source(kernel, job["signature"], constexprs, job["divisible"], backend)
    options = {"num_warps": job["num_warps"], "num_stages": job["num_stages"]}
    if job.get("maxnreg") is not None:
        options["maxnreg"] = job["maxnreg"]
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
            compiled = triton.compile(src, target=target, options=options)
    except Exception as e:  # Triton's CompilationError names the line; say which kernel it is
        shown = {n: v for n, v in job["constexprs"].items() if not isinstance(v, dict)}
        raise CompileError(
            f"{job['name']} (module {job['module']}) does not compile for sm_{target.arch} with "
            f"{shown}: {type(e).__name__}: {str(e).strip()[-3000:]}"
        ) from e
    cubin = compiled.asm["cubin"]
    regs, stack = _resource_usage(cubin)
    return Compiled(
        name=job["name"], capability=cap, num_warps=job["num_warps"],
        num_stages=job["num_stages"], shared_bytes=int(compiled.metadata.shared), n_regs=regs,
        spill_bytes=stack, ptx=compiled.asm["ptx"], cubin=cubin,
    )  # fmt: skip


_JIT_REF = "__jit__"


def _python_function(kernel):
    fn = getattr(kernel, "fn", kernel)
    while hasattr(fn, "fn"):  # Autotuner -> JITFunction / InterpretedFunction -> function
        fn = fn.fn
    return fn


def _constexpr_value(value):
    """A constexpr as JSON: a @triton.jit function becomes {"__jit__": [module, name, root]}."""
    from triton.runtime.jit import KernelInterface

    if isinstance(value, KernelInterface):
        fn = _python_function(value)
        return {_JIT_REF: [fn.__module__, fn.__name__, _import_root(fn)]}
    return value


def _job(kernel, signature, constexprs, target, num_warps, num_stages, maxnreg, divisible):
    fn = _python_function(kernel)
    module, name = fn.__module__, fn.__name__
    names = list(inspect.signature(fn).parameters)
    unknown = (set(signature) | set(constexprs)) - set(names)
    if unknown:
        raise ValueError(f"signature/constexprs: {name} has no argument {sorted(unknown)}")
    missing = [n for n in names if n not in signature and n not in constexprs]
    if missing:
        raise ValueError(f"signature: give a type for every argument of {name}, missing {missing}")
    for arg, t in signature.items():
        if isinstance(t, torch.dtype):
            raise TypeError(f"signature[{arg!r}]: give Triton's type string, e.g. '*fp16'")
    c = chip(target)
    for arg, t in signature.items():  # bfloat16 pointers on a chip without bfloat16
        if t == "*bf16":
            check_dtype_for(c, torch.bfloat16, name=f"signature[{arg!r}]")
    if divisible is None:
        divisible = tuple(a for a, t in signature.items() if str(t).startswith("*"))
    return {
        "module": module, "name": name, "root": _import_root(fn), "signature": dict(signature),
        "constexprs": {n: _constexpr_value(v) for n, v in constexprs.items()},
        "capability": list(c.capability),
        "num_warps": num_warps, "num_stages": num_stages, "maxnreg": maxnreg,
        "divisible": list(divisible),
    }  # fmt: skip


def compile_many(
    jobs: list[dict], processes: int = 1, on_error: str = "raise"
) -> list[Compiled | CompileError]:
    """Compile job dicts (see `_job`) here, or in `processes` child processes when interpreting.

    A kernel that does not compile gives a CompileError naming the kernel, the target and
    Triton's message (e.g. a plain Python global read in the kernel): raised (on_error="raise",
    the first one) or put in the list in that job's place (on_error="return").
    """
    if on_error not in ("raise", "return"):
        raise ValueError(f"on_error must be 'raise' or 'return', got {on_error!r}")
    if not jobs:
        return []
    if ptxas_path() is None:
        raise RuntimeError("no ptxas: Triton's wheel ships one; set TRITON_PTXAS_PATH to another")
    if all(_compilable_here(j) for j in jobs):
        ordered = [_compile_or_error(j) for j in jobs]
    else:
        ordered = _compile_in_children(jobs, processes)
    if on_error == "raise":
        for r in ordered:
            if isinstance(r, CompileError):
                raise r
    return ordered


def _compile_or_error(job: dict) -> Compiled | CompileError:
    try:
        return _compile_here(job)
    except CompileError as e:
        return e


def _compile_in_children(jobs: list[dict], processes: int) -> list:
    processes = max(1, min(processes, len(jobs)))
    chunks = [jobs[i::processes] for i in range(processes)]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env[COMPILE_ONLY_ENV] = "1"
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default, said: no warning
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for i, chunk in enumerate(chunks):
            path = os.path.join(tmp, f"jobs{i}.json")
            with open(path, "w") as f:
                json.dump(chunk, f)
            cmd = [sys.executable, "-m", "course_utils.triton_attention.targets", path]
            procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True))
        for p in procs:
            err = p.communicate()[1]
            if p.returncode:
                raise RuntimeError(f"the compile process failed:\n{err[-4000:]}")
        results = []
        for i in range(len(chunks)):
            with open(os.path.join(tmp, f"jobs{i}.json.out")) as f:
                results.append([_from_json(r) for r in json.load(f)])
    ordered = [None] * len(jobs)
    for i, chunk_results in enumerate(results):
        ordered[i::processes] = chunk_results
    return ordered


def _to_json(c: Compiled | CompileError) -> dict:
    if isinstance(c, CompileError):
        return {"error": str(c)}
    d = {k: getattr(c, k) for k in Compiled.__dataclass_fields__}
    d["cubin"] = base64.b64encode(c.cubin).decode()
    return d


def _from_json(d: dict) -> Compiled | CompileError:
    if "error" in d:
        return CompileError(d["error"])
    d = dict(d, capability=tuple(d["capability"]), cubin=base64.b64decode(d["cubin"]))
    return Compiled(**d)


def compile_for(
    kernel,
    signature: dict[str, str],
    constexprs: dict,
    target=SM75,
    num_warps: int = 4,
    num_stages: int = 2,
    *,
    maxnreg: int | None = None,
    divisible: tuple[str, ...] | None = None,
) -> Compiled:
    """Compile a @triton.jit kernel for `target` (a Chip, (major, minor) or 75) without its GPU.

    Args:
        kernel: a @triton.jit function defined in an importable module (or an autotuned one).
        signature: Triton's type of every runtime argument: "*fp16", "*fp32", "i32", "fp32", ...
        constexprs: the value of every tl.constexpr argument, by name.
        num_warps, num_stages, maxnreg: as in a launch.
        divisible: arguments a launch would see as multiples of 16; default every pointer.

    Returns:
        Compiled: shared_bytes, n_regs, spill_bytes, ptx, cubin (and cubin_bytes).

    Raises TypeError naming the argument for a bfloat16 pointer on a chip without bfloat16.
    """
    job = _job(kernel, signature, constexprs, target, num_warps, num_stages, maxnreg, divisible)
    return compile_many([job])[0]


# ---------------------------------------------------------------------------------------------
# The course kernels
# ---------------------------------------------------------------------------------------------

KERNELS = {
    "fwd": ("course_utils.triton_attention.forward", "_attn_fwd_kernel"),
    "preprocess": ("course_utils.triton_attention.backward", "_attn_bwd_preprocess_kernel"),
    "dkdv": ("course_utils.triton_attention.backward", "_attn_bwd_dkdv_kernel"),
    "dq": ("course_utils.triton_attention.backward", "_attn_bwd_dq_kernel"),
}
"""The course's four kernels: the forward and the backward's three (D, then dK dV, then dQ)."""

_FP32_ARGS = ("lse_ptr", "delta_ptr")  # fp32 whatever the input dtype
_FLOAT_ARGS = ("qk_scale", "softmax_scale")


def course_kernel_job(
    kernel: str, d: int, causal: bool, dtype: torch.dtype, target=SM75, config=None
) -> dict:
    """The compile job of one course kernel as a launch on `target` would make it.

    The signature follows the arguments' names (pointers `*_ptr` in `dtype`, lse and D in fp32,
    the scales fp32, every other runtime argument i32); pointers are 16-byte aligned, and so are
    the strides when d is a multiple of 16 (contiguous tensors). `config`: a TileConfig or
    (BLOCK_M, BLOCK_N, num_warps, num_stages); None asks `tile_config` (the preprocess kernel has
    one fixed tile, backward.PREPROCESS_BLOCK_M, and Triton's default warps).
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {sorted(KERNELS)}, got {kernel!r}")
    if dtype not in _TORCH_TO_TRITON:
        raise TypeError(
            f"dtype must be torch.float16, torch.bfloat16 or torch.float32, got {dtype}"
        )
    check_dtype_for(target, dtype)
    module, name = KERNELS[kernel]
    fn = getattr(importlib.import_module(module), name)
    block_d = _block_d(d)
    constexprs = {"HEAD_DIM": d, "BLOCK_D": block_d}
    if kernel == "preprocess":
        from course_utils.triton_attention.backward import PREPROCESS_BLOCK_M

        constexprs["BLOCK_M"] = PREPROCESS_BLOCK_M
        warps, stages = 4, 3  # Triton's defaults: the launch gives none
    else:
        bm, bn, warps, stages = (
            config if config is not None else tile_config(target, d, dtype, kernel)
        )
        constexprs.update(BLOCK_M=bm, BLOCK_N=bn, CAUSAL=bool(causal))
        if kernel == "fwd":
            constexprs["USE_TMA"] = False  # pointer loads: the only path below Hopper
    t = _TORCH_TO_TRITON[dtype]
    signature = {}
    for arg in fn.arg_names:
        if arg in constexprs:
            continue
        if arg.endswith("_ptr"):
            signature[arg] = "*fp32" if arg in _FP32_ARGS else f"*{t}"
        else:
            signature[arg] = "fp32" if arg in _FLOAT_ARGS else "i32"
    divisible = [a for a in signature if a.endswith("_ptr")]
    if d % 16 == 0:
        divisible += [a for a in signature if a.startswith("stride")]
    return _job(fn, signature, constexprs, target, warps, stages, None, tuple(divisible))


def _main(path: str) -> None:
    with open(path) as f:
        jobs = json.load(f)
    with open(path + ".out", "w") as f:
        json.dump([_to_json(_compile_or_error(j)) for j in jobs], f)


if __name__ == "__main__":
    _main(sys.argv[1])
