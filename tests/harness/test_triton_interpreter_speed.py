"""Triton's interpreter without re-patching per helper call or overflow checks outside debug mode
(harness.triton_interpreter_speed).

A kernel that calls a @triton.jit helper in its loop made the interpreter walk triton.language's
modules again at every call of the helper. These tests count the walks that reach the
interpreter's own `_patch_lang` (one per launch), and check that the kernel computes the same
values as before: with the wrapper, without it, and in a second thread. The overflow checks,
whose result the interpreter threw away, run only where it is used: an int32 that overflows
wraps as before, and raises where the interpreter's options say debug.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from course_utils.harness import triton_interpreter

pytestmark = pytest.mark.skipif(
    not triton_interpreter.INTERPRETER, reason="Triton's interpreter runs where there is no GPU"
)

if triton_interpreter.INTERPRETER:
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    from course_utils.harness import triton_interpreter_speed as speed

    @triton.jit
    def _scaled(x, s):
        return x * s

    @triton.jit
    def _sum_of_scaled(x_ptr, out_ptr, n, TILES: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for t in range(TILES):
            acc += _scaled(x, t + 1.0)  # the helper, called once per tile
        tl.store(out_ptr + offs, acc, mask=mask)


def _launch(n: int = 10, tiles: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(n, dtype=torch.float32)
    out = torch.full((n,), float("nan"))
    _sum_of_scaled[(1,)](x, out, n, TILES=tiles, BLOCK=16)
    return out, x * (tiles * (tiles + 1) / 2)


@pytest.fixture
def walks(monkeypatch):
    """Counts the walks that reach the interpreter's own _patch_lang, the wrapper around it."""
    original = interpreter._patch_lang.__wrapped__
    count = {"walks": 0}

    def counting(fn):
        count["walks"] += 1
        return original(fn)

    wrapped = speed._wrap_patch_lang(counting, interpreter._LangPatchScope, (tl, tl.core))
    monkeypatch.setattr(interpreter, "_patch_lang", wrapped)
    return count


def test_it_is_installed_in_the_interpreter():
    assert speed.install() is True
    assert interpreter._patch_lang.__wrapped__ is not None


def test_a_launch_walks_the_language_once_whatever_its_helpers_do(walks):
    _launch(tiles=1)
    per_launch = walks["walks"]
    # the kernel's module (tl), then tl.zeros' (a helper of triton.language's own: tl.core)
    assert 1 <= per_launch <= 2
    out, expected = _launch(tiles=8)
    torch.testing.assert_close(out, expected)
    assert walks["walks"] == 2 * per_launch, "the helper's calls walked triton.language again"


def test_the_language_is_restored_after_the_launch(walks):
    load = tl.load
    _launch()
    assert tl.load is load, "the interpreter's NumPy tl.load stayed in place after the launch"


def test_the_same_values_as_walking_at_every_call(monkeypatch):
    with_wrapper, expected = _launch(tiles=5)
    monkeypatch.setattr(interpreter, "_patch_lang", interpreter._patch_lang.__wrapped__)
    without, _ = _launch(tiles=5)
    torch.testing.assert_close(with_wrapper, without, rtol=0, atol=0)
    torch.testing.assert_close(with_wrapper, expected)


def test_a_launch_in_another_thread_walks_for_itself(walks):
    results = {}

    def run():
        results["out"] = _launch(tiles=4)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    out, expected = results["out"]
    torch.testing.assert_close(out, expected)
    in_thread = walks["walks"]
    _launch(tiles=4)
    assert in_thread == walks["walks"] - in_thread, "the thread's launch skipped its own walk"


if triton_interpreter.INTERPRETER:

    @triton.jit
    def _times(x_ptr, out_ptr, factor):
        offs = tl.arange(0, 4)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) * factor)


def _int32_product(factor: int) -> torch.Tensor:
    x = torch.full((4,), 2**20, dtype=torch.int32)
    out = torch.zeros(4, dtype=torch.int32)
    _times[(1,)](x, out, factor)
    return out


def _wrapped(value: int) -> int:
    value %= 2**32
    return value - 2**32 if value >= 2**31 else value


def test_an_int32_overflow_wraps_as_before():
    assert interpreter.interpreter_builder.options.sanitize_overflow is False
    assert _int32_product(4096).tolist() == [_wrapped(2**20 * 4096)] * 4
    assert _int32_product(3).tolist() == [3 * 2**20] * 4


def test_the_checks_run_where_their_result_is_used(monkeypatch):
    builder = interpreter.interpreter_builder
    debug = dataclasses.replace(builder.options, debug=True)
    monkeypatch.setattr(builder, "options", debug)
    with pytest.raises(Exception, match="overflow"):
        _int32_product(4096)
    assert builder.options.sanitize_overflow is True
    assert _int32_product(3).tolist() == [3 * 2**20] * 4


def test_uninstall_gives_back_the_interpreter_as_shipped():
    try:
        assert speed.uninstall() is True
        assert not hasattr(interpreter._patch_lang, "__wrapped__")
        assert interpreter.interpreter_builder.options.sanitize_overflow is True
        assert speed.uninstall() is False  # nothing left to undo
        assert _int32_product(3).tolist() == [3 * 2**20] * 4  # still launches (bounds guard on)
    finally:
        assert speed.install() is True
    assert interpreter.interpreter_builder.options.sanitize_overflow is False


def test_uninstall_leaves_a_wrapper_it_does_not_own(monkeypatch):
    import functools

    ours = interpreter._patch_lang
    outer = functools.wraps(ours)(lambda fn: ours(fn))
    monkeypatch.setattr(interpreter, "_patch_lang", outer)
    assert speed.uninstall() is False
    assert interpreter._patch_lang is outer  # nothing half undone
    assert interpreter.GridExecutor.__call__ is speed._ours["launch"]
