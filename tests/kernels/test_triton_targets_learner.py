"""The learner-facing Triton kernels compile for a Tesla T4 (sm_75) and an H100/H200 (sm_90),
on a machine with neither: the kernels of notebooks 06, 08 and 09 as their solutions write them,
in the skeletons they are launched in, with the dtypes and tiles a real launch on that chip uses.

Why on a CPU machine: Triton's interpreter runs code a GPU refuses. A kernel that reads a plain
Python global (`LN2 = 0.69`) runs in the interpreter and is a compile error on every GPU; only a
compile shows it (test_a_plain_global_fails_naming_the_kernel). Each kernel below is compiled for
sm_75 in float16 and for sm_90 in the dtype the notebook uses there (bfloat16 for the forward,
backward and decode), and the test asserts: it compiles, its cubin is not empty, its shared
memory fits the chip (config.CHIPS). Registers and spilled bytes are reported (`pytest -s`
prints the table), not asserted: these kernels are the learner's, not tuned.

The solutions are written to importable modules first (the compile runs in a child process that
imports each kernel by module and name; cross_compile.py puts the module's folder on its path):
notebook 06's puzzles are
tests/checks/triton06_answers.py; its whole forward kernel and notebook 08's
and 09's kernels come from the solution notebooks' answer cells
(benchmarks/learner_solutions.module_source).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import course_utils.triton_attention as ta  # noqa: F401  (the interpreter, before triton)
from benchmarks import learner_solutions
from course_utils.triton_attention import config as T
from course_utils.triton_attention import cross_compile as C

pytestmark = [
    pytest.mark.skipif(
        C.ptxas_path() is None, reason="no ptxas: Triton's compiler cannot make a cubin here"
    ),
    # one worker compiles the whole set (its session fixture): tests of the file on both
    # workers compiled it twice at once, 40 s of two cores each time (2026-12-06)
    pytest.mark.xdist_group("sm75-learner"),
]

REPO = Path(__file__).resolve().parents[2]
ANSWERS = Path(__file__).resolve().parents[1] / "checks"  # triton06_answers.py


HEAD = (
    "import torch\nimport course_utils.triton_attention as ta\nimport triton\n"
    "import triton.language as tl\n"
)
SOURCES = {
    "sol08": learner_solutions.module_source(
        "08_triton_backward", ("bwd_preprocess", "bwd_dkdv", "bwd_dq")
    ),
    "sol09": learner_solutions.module_source("09_flash_decoding", ("attend_chunk",)),
    "sol06": learner_solutions.module_source("06_triton_forward", ("attention_fwd",)),
    # A right step and finalize for learner.py's skeleton (the old notebook 06 exercise).
    "sol06_skeleton": HEAD
    + """
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def online_softmax_step(acc, m_i, l_i, q, k, v, offs_m, offs_n, seqlen_k, qk_scale,
                        CAUSAL: tl.constexpr):
    s = tl.dot(q, tl.trans(k)) * qk_scale
    visible = offs_n[None, :] < seqlen_k
    if CAUSAL:
        visible = visible & (offs_n[None, :] <= offs_m[:, None])
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new[:, None])
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def finalize_rows(acc, m_i, l_i):
    return acc / l_i[:, None], (m_i + tl.math.log2(l_i)) * LN2
""",
    # What the brief's bug looked like: a plain float read inside a kernel.
    "plain_global": HEAD
    + """
LN2 = 0.6931471805599453


@triton.jit
def lse_kernel(m_ptr, l_ptr, lse_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = tl.load(m_ptr + offs)
    tl.store(lse_ptr + offs, (m + tl.math.log2(tl.load(l_ptr + offs))) * LN2)
""",
}


@pytest.fixture(scope="session")
def modules(tmp_path_factory):
    """{name: module} of every solution source, written under a fresh folder and imported."""
    folder = tmp_path_factory.mktemp("learner_kernels")
    found = {}
    for name, source in SOURCES.items():
        path = folder / f"{name}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # Triton resolves a jit function's globals through it
        spec.loader.exec_module(module)
        found[name] = module
    if str(ANSWERS) not in sys.path:
        sys.path.insert(0, str(ANSWERS))
    import triton06_answers

    found["answers06"] = triton06_answers
    return found


def _bd(d: int) -> int:
    return max(16, 1 << (d - 1).bit_length())


def _sig(fn, types: dict, constexprs: dict) -> dict:
    """Every runtime argument's type: `types` by name, else i32 (ints: sizes and strides)."""
    names = list(getattr(fn, "arg_names", None) or fn.fn.__code__.co_varnames)
    return {n: types.get(n, "i32") for n in names if n not in constexprs}


def _jobs(m: dict) -> list[tuple[str, str, str, dict]]:
    """(notebook, kernel, target, job) for every learner-facing kernel and target."""
    from course_utils.harness import decode_learner
    from course_utils.harness import triton_learner as learner
    from course_utils.harness import triton_learner_backward as learner_backward
    from course_utils.triton_attention import decode

    out = []

    def add(nb, label, fn, types, constexprs, cap, warps=4, stages=3, maxnreg=None):
        sig = _sig(fn, types, constexprs)
        job = C._job(fn, sig, constexprs, cap, warps, stages, maxnreg, None)
        out.append((nb, label, f"sm_{T.chip(cap).sm}", job))

    a06 = m["answers06"]
    for cap in ((7, 5), (9, 0)):
        # Puzzles 1-4: the checks' dtypes are the same on every GPU (float32; float16 for dot).
        add(
            "06",
            "scale_tile_kernel",
            a06.scale_tile_kernel,
            {"x_ptr": "*fp32", "y_ptr": "*fp32", "alpha": "fp32"},
            {"BLOCK_R": 16, "BLOCK_C": 32},
            cap,
        )
        add(
            "06",
            "softmax_rows_kernel",
            a06.softmax_rows_kernel,
            {"x_ptr": "*fp32", "y_ptr": "*fp32"},
            {"BLOCK": 64},
            cap,
        )
        add(
            "06",
            "matmul_kernel",
            a06.matmul_kernel,
            {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32"},
            {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32},
            cap,
        )
        add(
            "06",
            "row_block_attention_kernel",
            a06.row_block_attention_kernel,
            {f"{x}_ptr": "*fp16" for x in "qkv"} | {"out_ptr": "*fp32", "qk_scale": "fp32"},
            {"BLOCK_M": 32, "BLOCK_N": 16, "HEAD_DIM": 32},
            cap,
        )
        dt = T.pick_dtype(cap)
        t = C._TORCH_TO_TRITON[dt]
        attn = {f"{x}_ptr": f"*{t}" for x in ("q", "k", "v", "out")}
        attn |= {"lse_ptr": "*fp32", "qk_scale": "fp32"}
        for d in (64, 128):
            config = T.tile_config(cap, d, dt)  # the solution launcher's launch on that GPU
            bm, bn, w, st = config
            for causal in (False, True):
                add(
                    "06",
                    f"attention_fwd_kernel d={d} causal={causal} {t}",
                    m["sol06"].attention_fwd_kernel,
                    attn,
                    dict(HEAD_DIM=d, BLOCK_D=_bd(d), BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal),
                    cap,
                    w,
                    st,
                    config.maxnreg,
                )
        # learner.py's skeleton with a right step and finalize
        s06 = m["sol06_skeleton"]
        for d in (64, 128):
            bm, bn, w, st = learner.default_blocks(d, dt, capability=cap)
            add(
                "06",
                f"learner_attention_kernel d={d} {t}",
                learner.learner_attention_kernel,
                attn,
                dict(
                    STEP=s06.online_softmax_step,
                    FINALIZE=s06.finalize_rows,
                    HEAD_DIM=d,
                    BLOCK_D=_bd(d),
                    BLOCK_M=bm,
                    BLOCK_N=bn,
                    CAUSAL=True,
                ),
                cap,
                w,
                st,
            )
        # Notebook 08: the solution's three kernels, as learner_backward launches them.
        s08 = m["sol08"]
        grads = {f"{x}_ptr": f"*{t}" for x in ("q", "k", "v", "do", "dk", "dv", "dq", "out")}
        grads |= {"lse_ptr": "*fp32", "delta_ptr": "*fp32", "softmax_scale": "fp32"}
        for d in (64, 128):
            add(
                "08",
                f"bwd_preprocess_kernel d={d} {t}",
                s08.bwd_preprocess_kernel,
                grads,
                dict(HEAD_DIM=d, BLOCK_D=_bd(d), BLOCK_M=learner_backward.PREPROCESS_BLOCK_M),
                cap,
            )
            for kernel in (s08.bwd_dkdv_kernel, s08.bwd_dq_kernel):
                bm, bn, w, st = learner_backward.default_blocks(
                    d, dt, capability=cap, pass_=kernel.__name__.split("_")[1]
                )
                add(
                    "08",
                    f"{kernel.__name__} d={d} causal {t}",
                    kernel,
                    grads,
                    dict(HEAD_DIM=d, BLOCK_D=_bd(d), BLOCK_M=bm, BLOCK_N=bn, CAUSAL=True),
                    cap,
                    w,
                    st,
                )
        # Notebook 09: the skeleton with the solution's attend_chunk; the course's two kernels.
        dec = {f"{x}_ptr": f"*{t}" for x in ("q", "k", "v", "out")}
        dec |= {
            "table_ptr": "*i32",
            "seq_lens_ptr": "*i32",
            "out_part_ptr": "*fp32",
            "lse_part_ptr": "*fp32",
            "lse_ptr": "*fp32",
            "qk_scale": "fp32",
        }
        group, d, page = 4, 128, 16
        add(
            "09",
            f"learner_decode_partials_kernel {t}",
            decode_learner.learner_decode_partials_kernel,
            dec,
            dict(
                ATTEND=m["sol09"].attend_chunk,
                GROUP=group,
                BLOCK_H=max(16, group),
                HEAD_DIM=d,
                BLOCK_D=d,
                PAGE_SIZE=page,
            ),
            cap,
        )
        for regime, tune, tune_page in (
            ("", decode.DEFAULT_TUNING, page),
            (" few-sequences", decode.FEW_SEQUENCES_TUNING, page),
            (" few-sequences large pages", decode.FEW_SEQUENCES_LARGE_PAGES_TUNING, 64),
        ):
            add(
                "09",
                f"_decode_partials_kernel{regime} {t}",
                decode._decode_partials_kernel,
                dec,
                dict(
                    GROUP=group,
                    BLOCK_H=max(16, group),
                    HEAD_DIM=d,
                    BLOCK_D=d,
                    PAGE_SIZE=tune_page,
                    BLOCK_N=tune_page * max(1, tune["tile_tokens"] // tune_page),
                    USE_PDL=decode.pdl_capable(cap),  # what flash_decode passes on that chip
                ),
                cap,
                tune["num_warps"],
                tune["num_stages"],
            )
        add(
            "09",
            f"_decode_merge_kernel {t}",
            decode._decode_merge_kernel,
            dec,
            dict(HEAD_DIM=d, BLOCK_D=d, BLOCK_S=16, USE_PDL=decode.pdl_capable(cap)),
            cap,
        )
    return out  # fmt: skip


@pytest.fixture(scope="session")
def compiled(modules):
    """{(kernel label, target): Compiled or CompileError}, compiled once in two processes."""
    jobs = _jobs(modules)
    results = C.compile_many([j for *_, j in jobs], processes=2, on_error="return")
    table = {(label, target): r for (_, label, target, _), r in zip(jobs, results, strict=True)}
    print(f"\n{'kernel':58s} target  shared bytes  regs  spill bytes")
    for (label, target), r in table.items():
        if isinstance(r, C.CompileError):
            print(f"{label:58s} {target}  DOES NOT COMPILE")
        else:
            print(
                f"{label:58s} {target}  {r.shared_bytes:12,d}  {r.n_regs!s:>4}  "
                f"{r.spill_bytes!s:>11}"
            )
    return table


def test_every_learner_kernel_compiles_and_fits(compiled):
    failures = [
        f"{label} for {target}:\n  {r}"
        for (label, target), r in compiled.items()
        if isinstance(r, C.CompileError)
    ]
    assert not failures, "these learner kernels do not compile:\n" + "\n".join(failures)
    for (label, target), c in compiled.items():
        cap = divmod(int(target[3:]), 10)
        assert c.cubin_bytes > 0, f"{label} {target}: empty cubin"
        assert f".target {target}" in c.ptx
        budget = T.chip(cap).shared_optin
        assert c.shared_bytes <= budget, (
            f"{label} needs {c.shared_bytes} bytes of shared memory, {target} has {budget}"
        )
        if cap < (8, 0):
            assert "bf16" not in label, f"{label}: bfloat16 on {target}"


def test_the_solution_forward_keeps_to_its_register_cap_on_hopper(compiled):
    """Notebook 06's launcher passes tile_config's cap: on sm_90 the kernel is built within it
    (so two programs share an SM), without it it would take about 190 registers a thread."""
    for d in (64, 128):
        cap = T.tile_config((9, 0), d, torch.bfloat16).maxnreg
        assert cap is not None
        for causal in (False, True):
            c = compiled[(f"attention_fwd_kernel d={d} causal={causal} bf16", "sm_90")]
            if c.n_regs is None:
                pytest.skip("no cuobjdump: the register count is unknown")
            assert c.n_regs <= cap, (d, causal, c.n_regs, cap)


def test_notebooks_kernels_are_all_there(compiled):
    names = {label.split()[0] for label, _ in compiled}
    assert names >= {
        "scale_tile_kernel", "softmax_rows_kernel", "matmul_kernel", "row_block_attention_kernel",
        "attention_fwd_kernel", "learner_attention_kernel", "bwd_preprocess_kernel",
        "bwd_dkdv_kernel", "bwd_dq_kernel", "learner_decode_partials_kernel",
        "_decode_partials_kernel", "_decode_merge_kernel",
    }  # fmt: skip
    assert {t for _, t in compiled} == {"sm_75", "sm_90"}


def test_a_plain_global_fails_naming_the_kernel(modules):
    fn = modules["plain_global"].lse_kernel
    sig = {"m_ptr": "*fp32", "l_ptr": "*fp32", "lse_ptr": "*fp32"}
    with pytest.raises(C.CompileError, match=r"lse_kernel \(module plain_global\) does not "
                       r"compile for sm_75") as info:  # fmt: skip
        C.compile_for(fn, sig, {"BLOCK": 16}, T.SM75)
    assert "LN2" in str(info.value)  # Triton's message names the global
    got = C.compile_many(
        [C._job(fn, sig, {"BLOCK": 16}, T.SM90, 4, 3, None, None)], on_error="return"
    )
    assert isinstance(got[0], C.CompileError) and "sm_90" in str(got[0])
