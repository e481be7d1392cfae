"""Compile a Triton kernel for a GPU that is not there: the course's compile tooling.

    compile_for(kernel, signature, constexprs, target)
                            Triton's compiler run for that chip: PTX, cubin, shared bytes,
                            registers per thread and spilled bytes (a `Compiled`)
    compile_many(jobs, processes)
                            several at once, in child processes where this one interprets
    course_kernel_job(kernel, d, causal, dtype, target)
                            the job of one of the course's four kernels as a launch makes it

Why a module apart from the kernels: this is tooling, not a kernel. It runs Triton's compiler
(`triton.compile(ASTSource(...), target=GPUTarget(...))`), reads cubins with cuobjdump and spawns
compile-only Python processes, and no launch of a kernel ever goes through it. The kernels do not
import it; it names them by module and name (`KERNELS`) and asks `config` for the tiles a launch
would use. The Hopper kernels' `compile_for_sm90` (inside the function), the tests and notebook
06's sm_90 build call it. It lives in triton_attention, beside the kernels it names, in a module of
its own that the interface (`__init__`) does not import.

`compile_for` needs ptxas (Triton's wheel ships it) but no GPU and no driver: Triton compiles for
any `GPUTarget("cuda", capability, 32)`. One catch: a process that runs Triton's interpreter
(TRITON_INTERPRET=1, which `course_utils.triton_attention` switches on where there is no CUDA
GPU) has no compiler front end, because `triton.jit` then makes interpreted functions and
triton.language's own helpers (tl.max, tl.sum, ...) are interpreted too. There the compile runs in
a child Python process (`python -m course_utils.triton_attention.cross_compile --serve`, a
`compile_server` kept for the next compile) started without TRITON_INTERPRET and with
COURSE_TRITON_COMPILE_ONLY=1 (which tells `harness.triton_interpreter` to leave the interpreter
off: it compiles, it never launches); the kernel is named there by its module and name, so it
must live in an importable module. Where kernels are real JITFunctions (a GPU machine) the compile
runs in this process.
"""

from __future__ import annotations

import base64
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

import torch

from course_utils.harness.triton_interpreter import COMPILE_ONLY_ENV
from course_utils.triton_attention import compile_server
from course_utils.triton_attention.config import (
    SM75,
    check_dtype_for,
    chip,
    padded_head_dim,
    tile_config,
)

# ---------------------------------------------------------------------------------------------
# Compiling for a target
# ---------------------------------------------------------------------------------------------

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
    """The jobs in `processes` batches, each run by a compile server (`compile_server`: a child
    Python without TRITON_INTERPRET that imported torch and Triton once, kept for the next call)."""
    processes = max(1, min(processes, len(jobs)))
    chunks = [jobs[i::processes] for i in range(processes)]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env[COMPILE_ONLY_ENV] = "1"
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default, said: no warning
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, chunk in enumerate(chunks):
            paths.append(os.path.join(tmp, f"jobs{i}.json"))
            with open(paths[-1], "w") as f:
                json.dump(chunk, f)
        command = [sys.executable, "-m", "course_utils.triton_attention.cross_compile"]
        compile_server.run_batches(paths, env, command)
        results = []
        for path in paths:
            with open(path + ".out") as f:
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
    constexprs = {"HEAD_DIM": d, "BLOCK_D": padded_head_dim(d)}
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


def _serve() -> None:
    """A compile server (`compile_server.serve`): Triton's compiler imported once, then a batch a
    line."""
    import triton.compiler.compiler  # noqa: F401  (what every batch needs, imported once)

    try:
        from triton.experimental import gluon  # noqa: F401  (the Hopper kernels' front end)
    except ImportError:
        pass
    compile_server.serve(_main)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        _serve()
    else:
        _main(sys.argv[1])
