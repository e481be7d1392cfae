"""The course's Triton kernels compile for a Tesla T4 (sm_75), an A100 (sm_80) and an H100/H200
(sm_90) on a machine with none of them: Triton's compiler and ptxas run for a named target.

Every kernel (forward, and the backward's preprocess, dK/dV and dQ kernels), every d in
{16, 32, 64, 128}, causal and not, is compiled for sm_75 in float16 with the tiles
`tile_config` picks; the checks: a non-empty cubin, the shared memory within the T4's 64 KiB
(and within the 48 KiB a kernel gets without opt-in), no spilled registers, and the model of
`chip_shared_budget` an upper bound of what the compiler reports (and within 64 KiB). A smaller
grid compiles for sm_80 and sm_90 in bfloat16. All compiles run once per session (in two child
processes on a machine without a GPU, where this process runs Triton's interpreter; see
cross_compile.py), and Triton keeps them in its on-disk cache, so a second run takes seconds.
`pytest -s` prints the table of shared bytes and registers.
"""

from __future__ import annotations

import pytest
import torch

from course_utils.triton_attention import config as T
from course_utils.triton_attention import cross_compile as C

pytestmark = [
    pytest.mark.skipif(
        C.ptxas_path() is None, reason="no ptxas: Triton's compiler cannot make a cubin here"
    ),
    # one worker compiles the whole set (its session fixture): tests of the file on both
    # workers compiled it twice at once, 40 s of two cores each time (2026-12-06)
    pytest.mark.xdist_group("sm75-targets"),
]

D_VALUES = (16, 32, 64, 128)
SM75_CASES = [
    (kernel, d, causal)
    for kernel in ("fwd", "dkdv", "dq")
    for d in D_VALUES
    for causal in (False, True)
] + [("preprocess", d, False) for d in D_VALUES]
SANITY_CASES = [  # (capability, kernel, d, causal), bfloat16: the largest tiles of each family
    (cap, kernel, d, causal)
    for cap in ((8, 0), (9, 0))
    for kernel, d, causal in (
        ("fwd", 64, False),
        ("fwd", 128, True),
        ("dkdv", 128, True),
        ("dq", 128, True),
    )
]


def _case_id(case) -> str:
    return "-".join(str(x) for x in case).replace(" ", "").replace("(", "").replace(")", "")


@pytest.fixture(scope="session")
def compiled():
    """{case: Compiled} for every case of SM75_CASES and SANITY_CASES, compiled once."""
    jobs, keys = [], []
    for kernel, d, causal in SM75_CASES:
        jobs.append(C.course_kernel_job(kernel, d, causal, torch.float16, T.SM75))
        keys.append(((7, 5), kernel, d, causal))
    for cap, kernel, d, causal in SANITY_CASES:
        jobs.append(C.course_kernel_job(kernel, d, causal, T.pick_dtype(cap), cap))
        keys.append((cap, kernel, d, causal))
    results = dict(zip(keys, C.compile_many(jobs, processes=2), strict=True))
    print(
        "\nkernel      d  causal  BLOCK_M x BLOCK_N  warps  shared bytes  registers  (sm_75, fp16)"
    )
    for (cap, kernel, d, causal), c in results.items():
        if cap == (7, 5):
            bm, bn = (
                (T.tile_config(cap, d, torch.float16, kernel)[:2])
                if kernel != "preprocess"
                else (64, "-")
            )
            print(
                f"{kernel:10s} {d:3d}  {causal!s:6s}  {bm:>7} x {bn:<7}  {c.num_warps:5d}  "
                f"{c.shared_bytes:12,d}  {c.n_regs}"
            )
    return results


@pytest.mark.parametrize("case", SM75_CASES, ids=[_case_id(c) for c in SM75_CASES])
def test_compiles_for_sm75_within_its_shared_memory(compiled, case):
    kernel, d, causal = case
    c = compiled[((7, 5), kernel, d, causal)]
    assert c.capability == (7, 5) and c.cubin_bytes > 0 and ".target sm_75" in c.ptx
    assert c.shared_bytes <= T.SM75.shared_optin  # 64 KiB, what a T4 block may use
    assert c.shared_bytes <= T.SM75.shared_default  # 48 KiB: no opt-in needed at all
    if c.spill_bytes is not None:  # cuobjdump read the cubin
        assert c.spill_bytes == 0, f"{kernel} d={d} spills {c.spill_bytes} bytes per thread"
        assert c.n_regs <= 255
    assert not c.tensor_cores  # Triton lowers tl.dot to FMA below sm_80 (PR 5066, Triton 3.2)
    if kernel != "preprocess":
        bm, bn, _, stages = T.tile_config((7, 5), d, torch.float16, kernel)
        model = T.chip_shared_budget((7, 5), kernel, bm, bn, d, torch.float16, stages)
        assert c.shared_bytes <= model.bytes <= T.SM75.shared_optin, model.table()


@pytest.mark.parametrize("case", SANITY_CASES, ids=[_case_id(c) for c in SANITY_CASES])
def test_compiles_for_sm80_and_sm90(compiled, case):
    cap = case[0]
    c = compiled[case]
    assert c.cubin_bytes > 0 and c.tensor_cores  # mma (sm_80) or wgmma (sm_90)
    assert c.shared_bytes <= T.chip(cap).shared_optin


def test_pick_dtype():
    assert T.pick_dtype((7, 5)) == torch.float16
    assert T.pick_dtype(75) == torch.float16
    assert T.pick_dtype((8, 0)) == T.pick_dtype((9, 0)) == torch.bfloat16


def test_bfloat16_is_refused_on_sm75_naming_the_argument():
    with pytest.raises(TypeError, match=r"dtype is bfloat16, but sm_75 .*torch\.float16"):
        T.tile_config((7, 5), 64, torch.bfloat16, "fwd")
    with pytest.raises(TypeError, match=r"dtype is bfloat16, but sm_75"):
        C.course_kernel_job("fwd", 64, False, torch.bfloat16, T.SM75)
    job = C.course_kernel_job("fwd", 64, False, torch.float16, T.SM75)
    from course_utils.triton_attention.forward import _attn_fwd_kernel

    signature = dict(job["signature"], q_ptr="*bf16")
    with pytest.raises(TypeError, match=r"signature\['q_ptr'\] is bfloat16, but sm_75"):
        C.compile_for(_attn_fwd_kernel, signature, job["constexprs"], T.SM75)
    with pytest.raises(TypeError, match=r"^q is bfloat16, but sm_75"):
        T.check_dtype_for((7, 5), torch.bfloat16, name="q")
    T.check_dtype_for((8, 0), torch.bfloat16, name="q")  # fine from sm_80 on


@pytest.mark.parametrize("cap", sorted(T.CHIPS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("d", [16, 24, 32, 64, 96, 128, 256])
def test_tile_config_fits_and_suits_causal(cap, dtype, d):
    if dtype == torch.bfloat16 and cap < (8, 0):
        return  # refused, tested above
    if d > T.SM75_MAX_HEAD_DIM and cap < (8, 0):
        with pytest.raises(ValueError, match="d must be at most 128 on sm_75"):
            T.tile_config(cap, d, dtype)
        return
    for pass_ in T.PASSES:
        bm, bn, warps, stages = T.tile_config(cap, d, dtype, pass_)
        resident, streamed = (bn, bm) if pass_ == "dkdv" else (bm, bn)
        assert resident % streamed == 0  # the causal loops need it
        assert warps in (4, 8) and stages >= 1 and min(bm, bn) >= 16
        budget = T.chip_shared_budget(cap, pass_, bm, bn, d, dtype, stages)
        assert budget.bytes <= T.chip(cap).shared_optin, budget.table()
        if cap < (8, 0):
            assert stages == 1  # Triton does not pipeline below sm_80


def test_tile_config_on_hopper_is_the_autotuners_first_choice():
    """On sm_90 nothing changed: tile_config names the first config of each kernel's family."""
    from course_utils.triton_attention import backward, forward

    for d in (64, 128):
        fwd = forward.CONFIG_FAMILIES[forward._family(d, torch.bfloat16)][0]
        config = T.tile_config((9, 0), d, torch.bfloat16, "fwd")
        assert tuple(config) == fwd[:4]
        assert config.maxnreg == fwd[4]  # the register cap comes with it (two programs per SM)
        for pass_, families in (("dkdv", backward.DKDV_FAMILIES), ("dq", backward.DQ_FAMILIES)):
            first = families[backward._family(d, torch.bfloat16)][0]
            assert tuple(T.tile_config((9, 0), d, torch.bfloat16, pass_)) == first


def test_tile_config_unpacks_to_four_and_gives_its_launch_options():
    """bm, bn, warps, stages = config still works; the cap travels as an attribute and in
    launch_options(), and survives a copy (pickle: the autotuning workers)."""
    import pickle

    config = T.tile_config((9, 0), 64, torch.bfloat16)
    bm, bn, warps, stages = config
    assert config.launch_options() == {
        "num_warps": warps,
        "num_stages": stages,
        "maxnreg": config.maxnreg,
    }
    assert config.maxnreg is not None and "maxnreg=" in repr(config)
    assert pickle.loads(pickle.dumps(config)).maxnreg == config.maxnreg
    assert config._replace(BLOCK_N=64).maxnreg == config.maxnreg  # kept through a change
    assert config._replace(maxnreg=None).maxnreg is None
    t4 = T.tile_config((7, 5), 64, torch.float16)
    assert t4.maxnreg is None and t4.launch_options()["num_stages"] == 1


def test_tile_config_is_computed_once_per_question_and_errors_every_time():
    """Launchers ask on every call: the answer is cached, a refusal is not."""
    first = T.tile_config((9, 0), 64, torch.bfloat16, "fwd")
    hits = T._fitting_config.cache_info().hits
    assert T.tile_config((9, 0), 64, torch.bfloat16, "fwd") is first
    assert T._fitting_config.cache_info().hits == hits + 1
    for _ in range(2):
        with pytest.raises(ValueError, match="d must be at most 128 on sm_75"):
            T.tile_config((7, 5), 256, torch.float16)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="capability must be one of"):
        T.chip((6, 1))
    with pytest.raises(ValueError, match="pass_ must be one of"):
        T.tile_config((7, 5), 64, torch.float16, "bwd")
    with pytest.raises(ValueError, match="d must be an int in 16..256"):
        T.tile_config((7, 5), 8, torch.float16)
    with pytest.raises(TypeError, match="dtype must be"):
        T.tile_config((7, 5), 64, torch.int8)
    with pytest.raises(ValueError, match="kernel must be one of"):
        C.course_kernel_job("fwd2", 64, False, torch.float16)
    job = C.course_kernel_job("dq", 64, False, torch.float16)
    from course_utils.triton_attention.backward import _attn_bwd_dq_kernel

    with pytest.raises(ValueError, match="missing"):
        C.compile_for(_attn_bwd_dq_kernel, {"q_ptr": "*fp16"}, job["constexprs"])
