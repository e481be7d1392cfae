"""A learner's Triton kernel cannot kill the notebook: a stray load or store is one named error.

In Triton's interpreter a pointer is an address in the kernel's process, and a store without its
mask wrote into that process's memory (a segfault, a hang, or a death a cell later).
course_utils.harness.triton_bounds checks every access first. Each test here builds a notebook
from notebooks 06 and 08's own cells (the imports, the "Try it" cell, the graded check) around a
kernel written as a learner would write it from the notebook's text, with the slip the issue
reports, and runs it in a real Jupyter kernel (nbclient): a regression that corrupts memory
kills that kernel (DeadKernelError, a failed test), never pytest. The tests assert that the
kernel lives to the last cell, that the "Try it" cell shows one error that starts with the slug,
and that the check names the mistake; correct kernels still pass, and an unwritten one is one
line that names it.
"""

from __future__ import annotations

import re

import nbformat
import pytest
from fixtures import kernels

from graders.run import pipeline

pytestmark = pytest.mark.notebooks

SOLUTIONS = pipeline.REPO / "solutions"
RELEASED = pipeline.REPO / "notebooks"
ALIVE = "print('kernel alive')"
_HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", re.DOTALL)


def _notebook(root, name: str):
    return nbformat.read(root / name / f"{name}.ipynb", as_version=4)


def _grade_id(cell) -> str | None:
    return (cell.metadata.get("nbgrader") or {}).get("grade_id")


def _cell(nb, grade_id: str) -> str:
    return next(c.source for c in nb.cells if _grade_id(c) == grade_id)


def _check_cell(nb, grade_id: str) -> str:
    return _HIDDEN.sub("", _cell(nb, f"{grade_id}_tests"))


def _try_it(nb, grade_id: str) -> str:
    """The first "# Try it" cell after the exercise's cell."""
    at = next(i for i, c in enumerate(nb.cells) if _grade_id(c) == grade_id)
    return next(
        c.source
        for c in nb.cells[at + 1 :]
        if c.cell_type == "code" and c.source.startswith("# Try it")
    )


def _defining(nb, text: str) -> str:
    return next(c.source for c in nb.cells if c.cell_type == "code" and text in c.source)


def _setup(nb) -> list[str]:
    """The notebook's import cells: course_utils.triton_attention first, then triton."""
    return [
        _defining(nb, "import course_utils.triton_attention as ta"),
        _defining(nb, "import triton.language as tl"),
    ]


def _slip(source: str, old: str, new: str) -> str:
    """source with one learner's slip: old (which must occur once) replaced by new."""
    assert source.count(old) == 1, f"the notebook no longer has {old!r}"
    return source.replace(old, new)


def _stub_kernel(source: str) -> str:
    """The solution cell with its first solution block (the kernel's body) left as the stub."""
    start, end = source.index("### BEGIN SOLUTION"), source.index("### END SOLUTION")
    end += len("### END SOLUTION")
    return source[:start] + "# YOUR CODE HERE\n    raise NotImplementedError()" + source[end:]


def _run(cells: list[str]) -> list:
    """Execute the cells in a fresh kernel; the error output of each cell (None: none) and its
    text. A kernel that dies raises (DeadKernelError), failing the test."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in [*cells, ALIVE]]
    client = kernels.notebook_client(
        nb,
        allow_errors=True,
        timeout=600,
        resources={"metadata": {"path": str(pipeline.REPO)}},
    )
    client.execute()
    results = []
    for cell in nb.cells:
        error = next((o for o in cell.outputs if o.output_type == "error"), None)
        text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        results.append((error, text))
    assert "kernel alive" in results[-1][1]
    return results[:-1]


def _one_error(result, start: str, ename: str) -> str:
    """The cell raised one error, shown as its message alone, whose first line starts so."""
    error, _ = result
    assert error is not None, "the cell raised nothing"
    text = "\n".join(error.traceback)
    assert error.ename == ename, text
    assert error.traceback[0].startswith(start), text
    assert "interpreter.py" not in text and "Traceback" not in text, text
    return text


def _passes(result, marker: str) -> None:
    error, text = result
    assert error is None, "\n".join(error.traceback)
    assert marker in text, text


def _stray(result, slug: str, tensor: str, mistake: str | None) -> str:
    text = _one_error(result, f"✗ {slug}: ", "OutOfBoundsError")
    assert f"through {tensor}" in text and "program id" in text, text
    if mistake is not None:
        assert f"[misconception: {mistake}]" in text, text
    return text


def _check_names(result, mistake: str) -> str:
    text = _one_error(result, "✗ ", "CheckFailure")
    assert f"[misconception: {mistake}]" in text, text
    return text


def test_puzzle_one_store_without_mask_and_rows_only_mask_are_named():
    nb, released = (
        _notebook(SOLUTIONS, "06_triton_forward"),
        _notebook(RELEASED, "06_triton_forward"),
    )
    right = _cell(nb, "scale_tile")
    full_mask = "mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)"
    unmasked = _slip(right, "alpha * x, mask=mask)", "alpha * x)")
    rows_only = _slip(right, full_mask, "mask = rows[:, None] < n_rows")
    try_it, check = _try_it(nb, "scale_tile"), _check_cell(nb, "scale_tile")
    spec = _defining(nb, "def scale_tile_spec")
    stub = _cell(released, "scale_tile")
    cells = [*_setup(nb), spec, right, try_it, check, unmasked, try_it, check, rows_only, try_it,
             check, stub, try_it, check]  # fmt: skip
    r = _run(cells)
    _passes(r[4], "max |y - spec|: 0.0")
    _passes(r[5], "✓ scale_tile_kernel")
    text = _stray(r[7], "store-out-of-bounds", "y_ptr", "store-unmasked")
    assert "mask both dimensions: rows and cols" in text, text
    _check_names(r[8], "store-unmasked")
    text = _stray(r[10], "store-out-of-bounds", "y_ptr", "mask-one-dimension")
    assert "(row 36, col 21)" in text, text  # the last row, the first column past n_cols = 21
    _check_names(r[11], "mask-one-dimension")
    for k in (13, 14):
        _one_error(r[k], "✗ scale_tile_kernel is not written yet", "NotWrittenError")


def test_forward_kernel_without_its_out_mask_or_head_dim_mask_is_named():
    nb = _notebook(SOLUTIONS, "06_triton_forward")
    right = _cell(nb, "attention_fwd")
    store = "out.to(out_ptr.dtype.element_ty), mask=q_mask)"
    out_unmasked = _slip(right, store, "out.to(out_ptr.dtype.element_ty))")
    rows_only = _slip(
        right,
        "q_mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)",
        "q_mask = offs_m[:, None] < seqlen_q",
    )
    try_it, check = _try_it(nb, "attention_fwd"), _check_cell(nb, "attention_fwd")
    reference = _defining(nb, "def reference_attention")
    cells = [*_setup(nb), reference, right, try_it, out_unmasked, try_it, check, rows_only,
             try_it, check, _stub_kernel(right), try_it, check]  # fmt: skip
    r = _run(cells)
    _passes(r[4], "causal=True")
    _stray(r[6], "store-out-of-bounds", "out_ptr", "store-unmasked")
    text = _check_names(r[7], "store-unmasked")
    # the first stage whose tile runs past N names it: with the interpreter's 64 x 64 tiles that
    # is already the one-tile case (N = 32)
    assert "fails" in text and "through out_ptr" in text, text
    _passes(r[9], "causal=True")  # d = 32 = BLOCK_D in "Try it": the head dim is not ragged
    text = _check_names(r[10], "mask-one-dimension")  # the first case with d < BLOCK_D
    assert "through out_ptr" in text, text
    assert re.search(r"element \d+ \(\[0, 0, \d+, 24\]\)", text), text  # column d = 24
    for k in (12, 13):
        _one_error(r[k], "✗ attention_fwd_kernel is not written yet", "NotWrittenError")


def test_backward_preprocess_storing_d_without_mask_is_named():
    nb = _notebook(SOLUTIONS, "08_triton_backward")
    released = _notebook(RELEASED, "08_triton_backward")
    right = _cell(nb, "bwd_preprocess")
    store = "tl.store(delta_ptr + bh * seqlen_q + offs_m, delta, mask=offs_m < seqlen_q)"
    unmasked = _slip(right, store, "tl.store(delta_ptr + bh * seqlen_q + offs_m, delta)")
    try_it, check = _try_it(nb, "bwd_preprocess"), _check_cell(nb, "bwd_preprocess")
    stub = _cell(released, "bwd_preprocess")
    cells = [*_setup(nb), right, try_it, check, unmasked, try_it, check, stub, try_it, check]
    r = _run(cells)
    _passes(r[3], "largest |error|")
    _passes(r[4], "✓ bwd_preprocess_kernel")
    text = _stray(r[6], "store-out-of-bounds", "delta_ptr", "store-unmasked")
    assert "mask the store with `offs < n`" in text, text
    _check_names(r[7], "store-unmasked")
    for k in (9, 10):
        _one_error(r[k], "✗ bwd_preprocess_kernel is not written yet", "NotWrittenError")
