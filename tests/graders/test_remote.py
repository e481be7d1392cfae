"""Verdicts outside the student's kernel: the wire format, the stripped package, the agent.

The kernel tests start a real IPython kernel (jupyter_client) whose course_utils is the stripped
package a graded notebook sees, run a student's answer cell in it, then run the release's test
cell in this process through graders.isolation.remote: whatever the answer cell patches inside its
kernel, the values are compared here.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fixtures import kernels

from course_utils.checks.engine import wire as _wire
from course_utils.harness.key_parts import key_parts
from graders.isolation import student_build
from graders.isolation.remote import KernelChannel, RemoteError, run_test_cell

REPO = Path(__file__).resolve().parents[2]


# ---- the wire format -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        3,
        2**70,
        -0.0,
        float("inf"),
        "text",
        np.float64(1.5),
        np.int32(7),
        np.zeros(0),
        np.array(2.5),
        np.arange(12.0).reshape(3, 4),
        np.array([-np.inf, np.nan, 1.0], dtype=np.float32),
        (1, (2.0, np.ones(2)), [3, {"a": np.eye(2)}]),
        key_parts([0, 2], [], [1]),
    ],
    ids=repr,
)
def test_values_travel_unchanged(value, tmp_path):
    path = tmp_path / "v.npz"
    _wire.save(path, value)
    back = _wire.load(path)
    assert type(back) is type(value)
    if isinstance(value, np.ndarray) and value.dtype == object:
        assert [list(p) for p in back] == [list(p) for p in value]
    elif isinstance(value, np.ndarray | np.generic):
        assert back.dtype == value.dtype and back.shape == value.shape
        np.testing.assert_array_equal(back, value)
    elif isinstance(value, tuple):
        assert repr(back) == repr(value)
    else:
        assert back == value or (back != back and value != value)


def test_torch_tensors_keep_their_dtype(tmp_path):
    torch = pytest.importorskip("torch")
    t = torch.linspace(-1, 1, 6, dtype=torch.bfloat16).reshape(2, 3)
    _wire.save(tmp_path / "t.npz", t)
    back = _wire.load(tmp_path / "t.npz")
    assert back.dtype == torch.bfloat16 and torch.equal(back, t)


def test_objects_that_could_run_code_do_not_travel(tmp_path):
    class Sneaky:
        def __reduce__(self):
            return (os.system, ("echo hacked",))

    with pytest.raises(_wire.WireError, match="Sneaky"):
        _wire.save(tmp_path / "x.npz", Sneaky())
    # a pickled object array written by hand is refused when read, not unpickled
    pickled = pickle.dumps(np.array([Sneaky()], dtype=object))
    head = {"tree": {"__array__": "a0"}, "arrays": {"a0": ["|O", [1], 0, len(pickled)]}}
    evil = json.dumps(head).encode()
    (tmp_path / "evil").write_bytes(_wire._MAGIC + len(evil).to_bytes(8, "little") + evil + pickled)
    with pytest.raises(_wire.WireError, match="cannot travel"):
        _wire.load(tmp_path / "evil")
    # so are files the wire did not write, or cut short
    np.savez(tmp_path / "old.npz", a0=np.ones(3))
    with pytest.raises(_wire.WireError, match="not a file of the wire format"):
        _wire.load(tmp_path / "old.npz")
    _wire.save(tmp_path / "whole", (np.arange(6.0), "text"))
    (tmp_path / "cut").write_bytes((tmp_path / "whole").read_bytes()[:-8])
    with pytest.raises(_wire.WireError, match="does not fit"):
        _wire.load(tmp_path / "cut")
    for meta in (["<f8", [-2, -3], 0, 48], ["<f8", [6], "0", 48], ["<f8", [6], 0.5, 48]):
        head = json.dumps({"tree": {"__array__": "a0"}, "arrays": {"a0": meta}}).encode()
        body = _wire._MAGIC + len(head).to_bytes(8, "little") + head + bytes(48)
        (tmp_path / "odd").write_bytes(body)
        with pytest.raises(_wire.WireError):
            _wire.load(tmp_path / "odd")


# ---- the stripped package ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def stripped(tmp_path_factory):
    dest = tmp_path_factory.mktemp("student-build")
    student_build.build(dest)
    return dest


def _run_in(stripped: Path, code: str) -> str:
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(stripped)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=stripped
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_stripped_package_has_no_answers_but_keeps_the_api(stripped):
    out = _run_in(
        stripped,
        "import numpy as np, inspect, course_utils as cu\n"
        "from course_utils.checks.engine.failures import ReferenceUnavailable\n"
        f"assert cu.__file__.startswith({str(stripped)!r})\n"
        "for f in (cu.online_softmax_stats, cu.merge_partials, cu.flash_attention_forward,\n"
        "          cu.flash_attention_backward, cu.standard_attention_traffic):\n"
        "    try:\n"
        "        f(np.zeros(3), 1)\n"
        "    except ReferenceUnavailable as e:\n"
        "        print('stub', e)\n"
        "import course_utils.checks.online_softmax as chk\n"
        "import course_utils.checks.online_softmax.mistakes as replays\n"
        "import course_utils.widgets.tile_grid as tg\n"
        "for f in (replays._online_attention_reference, chk.check_online_softmax_stats,\n"
        "          tg.tile_kinds):\n"
        "    try:\n"
        "        f(1, 2, 3)\n"
        "    except ReferenceUnavailable:\n"
        "        print('stub')\n"
        "src = inspect.getsource(cu.online_softmax_stats)\n"
        "assert 'exp' not in src, src\n"
        "from course_utils.harness.key_parts import key_parts\n"
        "print(key_parts([0], [1, 2]))\n"
        "print(cu.H200.num_sms)\n"
        "mem = cu.CountingMemory(M=10_000)\n"
        "print(type(mem).__name__)\n",
    )
    assert out.count("stub") == 8, out
    assert "parts [0] | [1, 2]" in out and "132" in out and "CountingMemory" in out


def test_every_module_of_the_package_imports_stripped(stripped):
    modules = [
        "course_utils."
        + p.relative_to(REPO / "course_utils").with_suffix("").as_posix().replace("/", ".")
        for p in (REPO / "course_utils").rglob("*.py")
        if "triton_attention" not in p.parts and p.name != "__init__.py"
    ]
    _run_in(
        stripped,
        "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules),
    )


# ---- a real kernel: verdicts here, answers there -----------------------------------------


def _start_kernel(stripped, tmp_path, timeout: float = 60):
    """A kernel whose course_utils is the stripped package; (km, kc, execute, channel)."""
    env = {**os.environ, "PYTHONPATH": str(stripped)}
    km, kc = kernels.start_kernel(env=env, cwd=str(tmp_path))

    def execute(code: str) -> None:
        reply = kc.execute_interactive(code, timeout=60, output_hook=lambda m: None)
        if reply["content"]["status"] == "error":
            raise RuntimeError(reply["content"]["ename"])

    channel = KernelChannel(
        lambda code: kc.execute_interactive(
            code, timeout=timeout, output_hook=lambda m: None, store_history=False
        ),
        tmp_path / "io",
    )
    return km, kc, execute, channel


@pytest.fixture
def kernel(stripped, tmp_path):
    km, kc, execute, channel = _start_kernel(stripped, tmp_path)
    yield execute, channel
    kc.stop_channels()  # its sockets closed here, not by the garbage collector later
    km.shutdown_kernel(now=True)


GOOD_STATS = """
import numpy as np
def online_softmax_stats(x, block):
    x = np.asarray(x, dtype=np.float64)
    m = np.full(x.shape[:-1], -np.inf)
    l = np.zeros(x.shape[:-1])
    for s in range(0, x.shape[-1], block):
        xb = x[..., s:s + block]
        m_new = np.maximum(m, xb.max(axis=-1))
        shift = np.where(np.isneginf(m_new), 0.0, m_new)
        l = np.exp(m - shift) * l + np.exp(xb - shift[..., None]).sum(axis=-1)
        m = m_new
    return m, l
"""
WRONG_STATS = """
import numpy as np
def online_softmax_stats(x, block):
    x = np.asarray(x, dtype=np.float64)
    return x.max(axis=-1, initial=-np.inf), np.ones(x.shape[:-1])
"""
TEST_CELL = """from course_utils.checks.online_softmax import check_online_softmax_stats

check_online_softmax_stats(online_softmax_stats)
check_online_softmax_stats(online_softmax_stats, seed=None, trials=30)
"""


def _verdict(outputs) -> str:
    errors = [o for o in outputs if o.output_type == "error"]
    return "fail: " + errors[0].evalue if errors else "pass"


@pytest.mark.notebooks
def test_a_right_answer_passes_and_a_wrong_one_fails(kernel):
    execute, channel = kernel
    execute(GOOD_STATS)
    assert _verdict(run_test_cell(TEST_CELL, channel)) == "pass"
    execute(WRONG_STATS)
    assert _verdict(run_test_cell(TEST_CELL, channel)).startswith("fail")


CHEATS = {
    "patched check": "import course_utils.checks.online_softmax as m\n"
    "m.check_online_softmax_stats = lambda *a, **k: print('ok')\n",
    "patched numpy": "import numpy\nvars(numpy)['allclose'] = lambda *a, **k: True\n"
    "numpy.isclose = lambda *a, **k: True\n",
    "swallowing run_code": "ip = get_ipython()\nold = ip.run_code\n"
    "def run_code(code, *a, **k):\n"
    "    try:\n        return old(code, *a, **k)\n    except BaseException:\n        return False\n"
    "ip.run_code = run_code\n",
    "profile off": "import sys\nsys.setprofile(None)\nsys.setprofile = lambda f: None\n",
    "import hook": "import builtins\n_imp = builtins.__import__\n"
    "def hook(name, *a, **k):\n    return _imp(name, *a, **k)\nbuiltins.__import__ = hook\n",
    "del hook": "import course_utils.checks.engine.cases as c\n"
    "class X:\n    def __del__(self):\n        c.run_cases = lambda *a, **k: None\n"
    "x = X(); del x\n",
}


@pytest.mark.notebooks
@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_no_patch_in_the_kernel_turns_a_wrong_answer_into_points(kernel, cheat):
    execute, channel = kernel
    execute(WRONG_STATS + CHEATS[cheat])
    assert _verdict(run_test_cell(TEST_CELL, channel)).startswith("fail")


@pytest.mark.notebooks
def test_calling_the_reference_fails_even_with_the_watch_switched_off(kernel):
    execute, channel = kernel
    execute(
        "import sys, course_utils as cu\n"
        "def online_softmax_stats(x, block):\n"
        "    sys.setprofile(None)\n"
        "    return cu.online_softmax_stats(x, block)\n"
    )
    verdict = _verdict(run_test_cell(TEST_CELL, channel))
    assert "calls-reference" in verdict or "disables-check" in verdict, verdict


@pytest.mark.notebooks
def test_getsource_of_a_reference_gives_nothing_to_run(kernel):
    execute, channel = kernel
    execute(
        "import inspect, course_utils.references.softmax as s\n"
        "ns = {'__name__': 'course_utils.references.softmax', '__package__': 'course_utils'}\n"
        "exec(inspect.getsource(s), ns)\n"
        "online_softmax_stats = ns['online_softmax_stats']\n"
    )
    verdict = _verdict(run_test_cell(TEST_CELL, channel))
    assert verdict.startswith("fail") and "calls-reference" in verdict, verdict


@pytest.mark.notebooks
def test_a_mutated_input_is_named_from_the_kernel(kernel):
    execute, channel = kernel
    execute(GOOD_STATS.replace("x = np.asarray(x, dtype=np.float64)", "x = np.asarray(x); x -= 0"))
    verdict = _verdict(run_test_cell(TEST_CELL, channel))
    assert "mutates-input" in verdict and "`x`" in verdict, verdict


@pytest.mark.notebooks
def test_a_missing_answer_and_an_unanswerable_kernel(kernel):
    execute, channel = kernel
    verdict = _verdict(run_test_cell(TEST_CELL, channel))
    assert verdict.startswith("fail: name 'online_softmax_stats' is not defined"), verdict
    dead = KernelChannel(lambda code: None, channel.io_host)  # a kernel that never answers
    with pytest.raises(RemoteError):
        run_test_cell(TEST_CELL, dead)


@pytest.mark.notebooks
def test_a_test_cell_is_one_request_to_the_kernel_however_many_calls(kernel):
    """KernelChannel.serve: the check's 250-odd calls go over the serve loop's pipes, so the
    kernel runs one execute request for the whole cell (one per call cost 10 ms each)."""
    execute, channel = kernel
    execute(GOOD_STATS)
    sent = []
    real = channel.execute
    channel.execute = lambda code: (sent.append(code), real(code))[1]
    assert _verdict(run_test_cell(TEST_CELL, channel)) == "pass"
    assert len(sent) == 1 and "serve(" in sent[0], sent
    assert not list(channel.io_host.iterdir()), "the cell left files or pipes behind"


@pytest.mark.notebooks
def test_a_call_that_never_returns_stops_the_cell_and_the_next_cell_is_served(stripped, tmp_path):
    """The kernel's time limit covers the serve loop: a learner's function that hangs raises
    RemoteError (the executor turns it into the cell's timeout), no check thread is left behind,
    and once the kernel is interrupted the next test cell is answered as usual."""
    import threading

    km, kc, execute, channel = _start_kernel(stripped, tmp_path, timeout=3)
    try:
        execute("import time\ndef online_softmax_stats(x, block):\n    time.sleep(3600)\n")
        with pytest.raises(RemoteError):
            run_test_cell(TEST_CELL, channel)
        assert not [t for t in threading.enumerate() if t.name == "grader-check"]
        km.interrupt_kernel()
        time.sleep(0.5)
        execute(GOOD_STATS)
        assert _verdict(run_test_cell(TEST_CELL, channel)) == "pass"
    finally:
        kc.stop_channels()  # its sockets closed here, not by the garbage collector later
        km.shutdown_kernel(now=True)


@pytest.mark.notebooks
def test_quick_check_values_come_from_the_kernel(kernel):
    execute, channel = kernel
    cell = (
        "from course_utils.checks.online_softmax import check_quick_rescale\n\n"
        "check_quick_rescale(answer_rescale)\n"
    )
    execute("import numpy as np\nanswer_rescale = np.exp(3.0 - 5.0)\n")
    assert _verdict(run_test_cell(cell, channel)) == "pass"
    execute("answer_rescale = np.array([np.exp(3.0 - 5.0)])\n")
    assert "plain number" in _verdict(run_test_cell(cell, channel))
    execute(
        "class Liar(float):\n    def __eq__(self, o):\n        return True\n"
        "answer_rescale = Liar(7.0)\n"
    )
    assert _verdict(run_test_cell(cell, channel)).startswith("fail")


BLOCK = """
from course_utils.references import gpt
def attention_block(x, w_qkv, w_out, n_heads, attention):
    attn = gpt.resolve_attention(attention)
    B, N, D = x.shape
    q, k, v = (x @ w_qkv).split(D, dim=-1)
    q, k, v = (t.view(B, N, n_heads, D // n_heads).transpose(1, 2) for t in (q, k, v))
    return attn(q, k, v, True).transpose(1, 2).reshape(B, N, D) @ w_out
"""
BLOCK_CELL = """from course_utils.checks.capstone import check_attention_block

check_attention_block(attention_block)
check_attention_block(attention_block, seed=None, trials=3)
"""


@pytest.mark.notebooks
def test_the_check_backend_travels_to_the_kernel_and_its_values_come_back(kernel):
    """notebook 11: check_backend is sent by name, the kernel's block calls the real function
    (the stripped package keeps it), and the verdict comes from the values it returns."""
    pytest.importorskip("torch")
    execute, channel = kernel
    execute(BLOCK)
    assert _verdict(run_test_cell(BLOCK_CELL, channel)) == "pass"
    execute(BLOCK.replace("gpt.resolve_attention(attention)", "gpt.resolve_attention('naive')"))
    verdict = _verdict(run_test_cell(BLOCK_CELL, channel))
    assert "ignores-attention-backend" in verdict, verdict
    folded = ".transpose(1, 2).reshape(B * n_heads, N, D // n_heads)"
    execute(
        BLOCK.replace(".transpose(1, 2) for t", folded + " for t").replace(
            "attn(q, k, v, True)", "attn(q, k, v, True).view(B, n_heads, N, D // n_heads)"
        )
    )
    verdict = _verdict(run_test_cell(BLOCK_CELL, channel))
    assert "attention-input-shape" in verdict, verdict
