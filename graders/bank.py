"""A bank of synthetic submissions, made from the solutions, with the exact score each must get.

Used by tests/test_grading.py and benchmarks/grading.py. Every entry is a notebook (or raw bytes)
plus the set of graded cells that must fail; the expected score is the notebook's points minus the
points of those cells, computed from the solution's metadata, never typed in by hand.

Every file is written the way Jupyter writes it (`save`): nbformat.write (sources as lists of
lines, what every Jupyter save produces), an older nbformat (3, or 4.4 without cell ids), the
released file copied byte for byte, or through a real Jupyter server's contents API (the tests
pass a `saver`). Only the cases that need a file nbformat would refuse to write (a repeated cell
id) use nbformat's plain JSON writer, and the broken files raw bytes.

    build(assignment)   one notebook's bank: full, untouched, partial, named mistakes, calls the
                        reference, adversarial (hangs, crashes, tampering) and honest tooling
                        accidents (cells copied and pasted, uploads twice, old formats, outputs)
    core(assignment)    full, untouched, partial and one named mistake, for each notebook
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from graders import pipeline
from graders.authoring import KERNELSPEC
from graders.submissions import IGNORED_FILE, OLDER_UPLOAD, source_text
from graders.submissions import student_id as _student_id

# seconds per cell: cuts the infinite loop soon, and leaves the Triton interpreter's checks of
# notebook 06 room on a busy two-core machine
TIMEOUT_FOR_BANK = 30

# The named mistakes the bank submits, per notebook: (the exercise's function, the slug its check
# must name, a piece of the solution's answer, what the student wrote instead). The answer is the
# solution with that one edit: plain code, as a student types it, that needs nothing of
# course_utils (which the kernel cannot see while a notebook is graded).
NAMED_MISTAKES = {
    "01_online_softmax": [
        ("online_softmax_stats", "no-rescale", "l_i = factor * l_i + ", "l_i = l_i + "),
        (
            "online_softmax_attention",
            "rescale-l-not-acc",
            "acc = factor * acc + p @ vb",
            "acc = acc + p @ vb",
        ),
    ],
    "02_merge_partials": [
        (
            "merge_partials",
            "plain-average",
            "return w1 * o1 + w2 * o2, lse",
            "return (o1 + o2) / 2, lse",
        ),
    ],
    "03_tiled_forward": [
        (
            "causal_tile_map",
            "causal-off-by-one",
            "if first_key > last_row:",
            "if first_key >= last_row:",
        ),
    ],
    "04_hbm_traffic": [
        ("standard_attention_traffic", "nxn-once", "softmax = N * N + N * N", "softmax = 0"),
    ],
    "05_split_kv": [
        (
            "decode_grid",
            "ignores-splits",
            "blocks = batch * heads * num_splits",
            "blocks = batch * heads",
        ),
    ],
    "06_triton_forward": [
        (
            "softmax_rows_kernel",
            "missing-other",
            'mask=mask, other=float("-inf"))',
            "mask=mask)",
        ),
        (
            "attention_fwd_kernel",
            "base2-lse",
            "lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453",
            "lse = m_i + tl.math.log2(l_i)",
        ),
    ],
    "07_backward": [
        ("softmax_backward_rows", "forgot-D", "return P * (dP - D)", "return P * dP"),
    ],
    "09_flash_decoding": [
        (
            "attend_chunk",
            "mask-off-by-one",
            "n_mask = start + offs_t < chunk_end",
            "n_mask = start + offs_t <= chunk_end",
        ),
        (
            "merge_splits",
            "merge-ignores-lse",
            "out = (w[..., None] * out_partial).sum(dim=2) / safe[..., None]",
            "out = out_partial.mean(dim=2)",
        ),
    ],
    "08_triton_backward": [
        ("bwd_dq_kernel", "dq-not-scaled", "dq = dq * softmax_scale", "dq = dq * 1.0"),
    ],
    "10_ring_attention": [
        ("ring_attention_rank", "diagonal-unmasked", "pairs[a][b] == 2,", "False,"),
    ],
    "11_capstone": [
        (
            "attention_block",
            "heads-merged-wrong",
            "return out.transpose(1, 2).reshape(B, N, D) @ w_out",
            "return out.reshape(B, N, D) @ w_out",
        ),
    ],
}

# The students of core(): one name per kind, the same student across the seven notebooks
CORE_STUDENTS = {"full": "full", "untouched": "张伟", "partial": "José", "mistake": "Ana María"}


@dataclass
class Entry:
    name: str
    notebook: object  # a NotebookNode, or bytes for a broken file
    failing: set[str]  # graded cells that must score 0
    status: str = "graded"
    misconception: dict[str, str] = field(default_factory=dict)  # cell -> slug expected
    problem: str | None = None  # a phrase the grader must report
    assignment: str | None = None
    student: str | None = None  # the student's name as the folder shows it (default: from name)
    # how the file is written: nbformat | nbformat-v3 | nbformat-4.4 | json | release | server
    save: str = "nbformat"
    upload: str | None = None  # the file's name in the assignment folder (default <a>.ipynb)
    # earlier uploads of the same student: (file name, notebook, seconds older than this one)
    older: list[tuple[str, object, float]] = field(default_factory=list)
    # other notebooks saved later in the same folder (a scratch Untitled.ipynb): (name, notebook)
    scratch: list[tuple[str, object]] = field(default_factory=list)
    # the problem line is one of graders.submissions' repair notes or causes, which the worker
    # reports once it calls read_submission() and cause_line() (see tests/test_grading.py)
    worker_note: bool = False


@dataclass
class Exercise:
    answer: str  # grade_id of the answer cell
    function: str | None  # the function it defines, if any
    tests: list[str]  # grade_ids of the test cells that check it


def _solution(assignment: str, root: Path = pipeline.REPO):
    return nbformat.read(root / "solutions" / assignment / f"{assignment}.ipynb", 4)


def release_path(assignment: str, root: Path = pipeline.REPO) -> Path:
    return root / "notebooks" / assignment / f"{assignment}.ipynb"


def exercises(assignment: str, root: Path = pipeline.REPO) -> list[Exercise]:
    """The answer cells of an assignment, each with the test cells that follow it."""
    found: list[Exercise] = []
    for cell in _solution(assignment, root).cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            m = re.search(r"^def (\w+)\(", source_text(cell.source), re.M)
            found.append(Exercise(meta["grade_id"], m.group(1) if m else None, []))
        elif meta.get("grade") and found:
            found[-1].tests.append(meta["grade_id"])
    return [e for e in found if e.tests]


def points(assignment: str, root: Path = pipeline.REPO) -> dict[str, float]:
    return {
        c.metadata["nbgrader"]["grade_id"]: float(c.metadata["nbgrader"]["points"])
        for c in _solution(assignment, root).cells
        if c.metadata.get("nbgrader", {}).get("grade")
    }


def expected_score(assignment_or_entry, entry: Entry | None = None) -> float:
    """The score an entry must get: expected_score(entry), or expected_score(assignment, entry)."""
    if entry is None:
        entry = assignment_or_entry
        assignment = entry.assignment
    else:
        assignment = assignment_or_entry
    if entry.status in ("invalid-notebook", "autograde-failed"):
        return 0.0  # needs-review keeps its score: the verdicts are the grader's own
    pts = points(assignment)
    return sum(p for gid, p in pts.items() if gid not in entry.failing)


def _cell(nb, grade_id):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _index(nb, grade_id) -> int:
    return nb.cells.index(_cell(nb, grade_id))


def _set_answer(nb, grade_id: str, source: str):
    _cell(nb, grade_id).source = source
    return nb


def partial(assignment: str, root: Path = pipeline.REPO) -> tuple[object, set[str]]:
    """The release with the first half of its exercises answered; and the tests that must fail."""
    solved = pipeline.solved_notebook(assignment, root)
    nb = nbformat.read(release_path(assignment, root), 4)
    exs = exercises(assignment, root)
    done, todo = exs[: (len(exs) + 1) // 2], exs[(len(exs) + 1) // 2 :]
    for ex in done:
        _set_answer(nb, ex.answer, source_text(_cell(solved, ex.answer).source))
    return nb, {t for ex in todo for t in ex.tests}


def mistakes(assignment: str, root: Path = pipeline.REPO) -> list[tuple[str, Exercise, str]]:
    """(entry name, exercise, answer code) for the named mistakes of NAMED_MISTAKES."""
    solved = pipeline.solved_notebook(assignment, root)
    by_function = {e.function: e for e in exercises(assignment, root) if e.function}
    found = []
    for function, slug, right, wrong in NAMED_MISTAKES.get(assignment, []):
        ex = by_function[function]
        answer = source_text(_cell(solved, ex.answer).source)
        if right not in answer:  # the solution changed: the table above must follow
            raise LookupError(f"{assignment}: the answer {ex.answer} has no {right!r}")
        found.append((f"mistake:{slug}:{function}", ex, answer.replace(right, wrong, 1)))
    return found


def wrong_beliefs(assignment: str) -> dict[str, tuple[str, str]]:
    """For each concept question of the assignment: answer-cell grade_id -> (an answer choosing
    its first wrong option, the misconception that option names)."""
    from course_utils.checks.concepts import NOTEBOOK, QUESTIONS

    found = {}
    for name, q in QUESTIONS.items():
        if NOTEBOOK[name] != assignment:
            continue
        wrong = next(o for o in q.options if o.slug is not None)
        if q.true_false:
            value = repr(wrong.key == "true")
        else:  # with pick > 1: the wrong option and enough right ones
            value = repr(wrong.key + "".join(sorted(q.right))[: q.pick - 1])
        found["concept_" + name.replace("-", "_")] = (f"{q.variable} = {value}\n", wrong.slug)
    return found


def _png() -> str:
    """A 1x1 PNG, base64: the image of an output and of a markdown cell's attachment."""
    return (
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5Erk"
        "Jggg=="
    )


def with_outputs(nb):
    """What a student's saved notebook also holds: outputs, widget state, an attachment."""
    nb = copy.deepcopy(nb)
    img = _png()
    for count, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        cell.execution_count = count + 1
        cell.outputs = [
            nbformat.v4.new_output("stream", name="stdout", text="✓ ran\nline two\n"),
            nbformat.v4.new_output(
                "display_data", data={"image/png": img, "text/plain": "<Figure>"}
            ),
        ]
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    first_code.outputs.append(
        nbformat.v4.new_output("error", ename="ValueError", evalue="x", traceback=["ValueError"])
    )
    note = nbformat.v4.new_markdown_cell("My sketch: ![tiles](attachment:tiles.png)")
    note.attachments = {"tiles.png": {"image/png": img}}
    nb.cells.insert(2, note)
    model = "0a1b2c3d4e5f"
    nb.metadata["widgets"] = {
        "application/vnd.jupyter.widget-state+json": {
            "state": {
                model: {
                    "model_module": "@jupyter-widgets/controls",
                    "model_module_version": "2.0.0",
                    "model_name": "IntSliderModel",
                    "state": {"value": 3, "max": 10},
                }
            },
            "version_major": 2,
            "version_minor": 0,
        }
    }
    return nb


def broken_by(assignment: str, ex: Exercise, root: Path = pipeline.REPO) -> set[str]:
    """The tests that fail when the function of `ex` is wrong: its own, and those of every later
    exercise whose solution or test calls it (attention_by_parts calls merge_partials)."""
    sol = _solution(assignment, root)
    uses = re.compile(rf"\b{re.escape(ex.function)}\b")
    # an import of the notebook's checks (course_utils.checks.merge_partials) is no call
    checks_import = re.compile(r"^from course_utils\.checks[\w.]* import .*$", re.M)
    failing = set(ex.tests)
    for later in exercises(assignment, root):
        if later.answer == ex.answer:
            continue
        texts = [
            checks_import.sub("", source_text(_cell(sol, g).source))
            for g in (later.answer, *later.tests)
        ]
        if any(uses.search(t) for t in texts):
            failing |= set(later.tests)
    return failing


def _tests_from(assignment: str, answer: str, root: Path) -> set[str]:
    """The graded cells at or after the answer cell `answer`."""
    ids = [c.metadata.get("nbgrader", {}) for c in _solution(assignment, root).cells]
    start = next(i for i, m in enumerate(ids) if m.get("grade_id") == answer)
    return {m["grade_id"] for m in ids[start:] if m.get("grade")}


def core(assignment: str, root: Path = pipeline.REPO) -> list[Entry]:
    """Full, untouched (the release, copied as is), partial, and the first named mistake."""
    solved = pipeline.solved_notebook(assignment, root)
    release = nbformat.read(release_path(assignment, root), 4)
    work, undone = partial(assignment, root)
    bank = [
        Entry("full", solved, set()),
        Entry("untouched", release, set(points(assignment, root)), "untouched", save="release"),
        Entry("partial", work, undone),
    ]
    for name, ex, code in mistakes(assignment, root)[:1]:
        nb = _set_answer(copy.deepcopy(solved), ex.answer, code)
        slug = name.split(":")[1]
        failing = broken_by(assignment, ex, root)
        bank.append(Entry(name, nb, failing, misconception={ex.tests[0]: slug}))
    for entry in bank:
        entry.assignment = assignment
        entry.student = CORE_STUDENTS[entry.name.split(":")[0]]
    return bank


def build(assignment: str, root: Path = pipeline.REPO) -> list[Entry]:
    """The bank for one assignment: good, untouched, partial, each named mistake, broken,
    adversarial, and the accidents of honest students' tooling."""
    solved = pipeline.solved_notebook(assignment, root)
    untouched = nbformat.read(release_path(assignment, root), 4)
    exs = [e for e in exercises(assignment, root) if e.function]
    all_tests = set(points(assignment, root))
    first, last = exs[0], exs[-1]
    work, undone = partial(assignment, root)
    bank = [
        Entry("full", solved, set()),
        Entry("untouched", untouched, all_tests, "untouched", save="release"),
        Entry("partial", work, undone),
    ]

    def variant(name, failing, edit, base=solved, **kw):
        nb = copy.deepcopy(base)
        edit(nb)
        bank.append(Entry(name, nb, set(failing), **kw))

    import course_utils

    beliefs = wrong_beliefs(assignment)
    if beliefs:  # every concept question answered with a wrong option: each names its belief
        variant(
            "wrong-beliefs",
            {gid + "_tests" for gid in beliefs},
            lambda nb: [_set_answer(nb, gid, code) for gid, (code, _) in beliefs.items()],
            misconception={gid + "_tests": slug for gid, (_, slug) in beliefs.items()},
        )
    for name, ex, code in mistakes(assignment, root):
        variant(
            name,
            broken_by(assignment, ex, root),
            lambda nb, ex=ex, code=code: _set_answer(nb, ex.answer, code),
            misconception={ex.tests[0]: name.split(":")[1]},
        )
    for ex in exs:
        if not hasattr(course_utils, ex.function):
            continue  # the course has no reference of that name to call
        variant(
            f"calls-reference:{ex.function}",
            broken_by(assignment, ex, root),
            lambda nb, ex=ex: _set_answer(
                nb,
                ex.answer,
                f"import course_utils as _cu\n\n\ndef {ex.function}(*args, **kwargs):\n"
                f"    return _cu.{ex.function}(*args, **kwargs)\n",
            ),
            misconception={ex.tests[0]: "calls-reference"},
        )
    src = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in solved.cells}
    variant(
        "infinite-loop",
        first.tests,
        lambda nb: _set_answer(nb, first.answer, "while True:\n    pass\n" + src[first.answer]),
    )
    variant(
        "sys-exit",
        first.tests,
        lambda nb: _set_answer(nb, first.answer, "import sys\n\nsys.exit(3)\n" + src[first.answer]),
    )
    # the kernel dies in the last exercise's answer: every test cell from there on scores 0
    after_last = _tests_from(assignment, last.answer, root)
    variant(
        "os-exit",
        after_last,
        lambda nb: _set_answer(nb, last.answer, "import os\n\nos._exit(1)\n"),
        problem="kernel died",
    )
    variant(
        "memory-bomb",
        first.tests,
        lambda nb: _set_answer(
            nb,
            first.answer,
            "def _bomb():\n    hog = []\n    while True:\n"
            "        hog.append(bytearray(2**28))\n\n\n_bomb()\n",
        ),
    )
    variant(
        "huge-output",
        set(),
        lambda nb: _set_answer(nb, first.answer, src[first.answer] + "\nprint('x' * 3_000_000)\n"),
        problem="output",
    )
    warn = (
        "import sys\nimport warnings\n\n"
        "warnings.warn('a harmless warning from the answer cell')\n"
        "print('a note on stderr', file=sys.stderr)\n"
    )
    variant(
        "warnings",
        set(),
        lambda nb: _set_answer(nb, first.answer, warn + src[first.answer]),
    )
    broken_first = f"def {first.function}(*args, **kwargs):\n    raise ValueError('not done yet')\n"
    variant(
        "edited-test-cell",
        first.tests,
        lambda nb: (
            _set_answer(nb, first.answer, broken_first),
            _set_answer(nb, first.tests[0], "print('✓ all good')"),
        ),
    )
    variant(
        "deleted-test-cell",
        first.tests,
        lambda nb: (
            _set_answer(nb, first.answer, broken_first),
            nb.cells.remove(_cell(nb, first.tests[0])),
        ),
        problem="deleted",
    )
    variant(
        "changed-cell-ids",
        set(),
        lambda nb: [c.__setitem__("id", f"renamed-{i}") for i, c in enumerate(nb.cells)],
    )
    variant(
        "patched-allclose",
        first.tests,
        lambda nb: _set_answer(
            nb,
            first.answer,
            broken_first + "\n\nimport numpy as np\n\nnp.allclose = lambda *a, **k: True\n",
        ),
        status="needs-review",
        problem="tampering",
    )
    check_mod = re.search(r"from (course_utils\.checks\.\w+) import (\w+)", src[first.tests[0]])
    variant(
        "patched-check",
        first.tests,
        lambda nb: _set_answer(
            nb,
            first.answer,
            broken_first + f"\n\nimport {check_mod.group(1)} as _checks\n\n"
            f"_checks.{check_mod.group(2)} = lambda *a, **k: print('✓ passed')\n",
        ),
        status="needs-review",
        problem="tampering",
    )
    # the same patches, reached in ways a spelling-based scan misses (graders/tampering.py); each
    # leaves the kernel working, so the honest score of the broken answer stands
    patches = {
        "patched-check-alias": f"from {check_mod.group(1)} import "
        f"{check_mod.group(2)} as _check\n\n_check.__code__ = (lambda *a, **k: None).__code__\n",
        "patched-in-magic-cell": "!echo checking\nfiles = !ls\n%precision 4\nimport numpy as np\n\n"
        "np.allclose = lambda *a, **k: True\n",
        "patched-ipython": "get_ipython().events.register('post_run_cell', lambda result: None)\n",
        "patched-builtins-import": "_import = __builtins__.__import__\n"
        "__builtins__.__import__ = lambda *a, **k: _import(*a, **k)\n",
        "patched-builtins-print": "_b = __import__('builtins')\n_print = _b.print\n"
        "_b.print = lambda *a, **k: _print(*a, **k)\n",
        "patched-setattr-local": "import numpy as np\n\n_m = np\n"
        "setattr(_m, 'allclose', lambda *a, **k: True)\n",
        "patched-vars": "import numpy as np\n\nvars(np)['allclose'] = lambda *a, **k: True\n",
    }
    for name, patch in patches.items():
        variant(
            name,
            first.tests,
            lambda nb, patch=patch: _set_answer(nb, first.answer, broken_first + "\n\n" + patch),
            status="needs-review",
            problem="tampering",
        )
    bank.append(
        Entry("not-json", b"{ this is not a notebook", all_tests, status="invalid-notebook")
    )
    # not honest, and nbgrader alone fails the whole notebook on either: a cell of the student's
    # own with half-made metadata, and one that claims 100 points of its own; both ungraded, the
    # rest graded
    nb = copy.deepcopy(solved)
    nb.cells.append(nbformat.v4.new_code_cell("x = 1", metadata={"nbgrader": {"grade": True}}))
    bank.append(
        Entry(
            "broken-nbgrader-metadata",
            nb,
            set(),
            problem="(no id): not a cell of the release, but marked as graded",
            worker_note=True,
        )
    )
    nb = copy.deepcopy(solved)
    claim = dict(_cell(nb, first.tests[0]).metadata["nbgrader"], grade_id="bonus", points=100)
    nb.cells.append(nbformat.v4.new_code_cell("assert True", metadata={"nbgrader": claim}))
    bank.append(
        Entry(
            "fake-graded-cell",
            nb,
            set(),
            problem="cell bonus: not a cell of the release, but marked as graded (100 points)",
            worker_note=True,
        )
    )
    bank += honest(assignment, root)
    for entry in bank:
        entry.assignment = assignment
    return bank


def honest(assignment: str, root: Path = pipeline.REPO) -> list[Entry]:
    """What an honest student's tools do to a notebook; each must score what the student wrote."""
    solved = pipeline.solved_notebook(assignment, root)
    release = nbformat.read(release_path(assignment, root), 4)
    exs = [e for e in exercises(assignment, root) if e.function]
    first = exs[0]
    work, undone = partial(assignment, root)
    bank = []

    # JupyterLab: the answer cell copied and pasted below (a new cell id, the same nbgrader
    # metadata); the student wrote the answer in the copy and left the stub above. Saved by a
    # real Jupyter server when the tests give one.
    nb = copy.deepcopy(release)
    pasted = copy.deepcopy(_cell(solved, first.answer))
    pasted["id"] = "pasted-answer"
    nb.cells.insert(_index(nb, first.answer) + 1, pasted)
    for ex in exercises(assignment, root):
        if ex.answer != first.answer:
            _set_answer(nb, ex.answer, source_text(_cell(solved, ex.answer).source))
    bank.append(
        Entry(
            "copied-answer-cell",
            nb,
            set(),
            save="server",
            problem=f"cell {first.answer}: the answer cell appears 2 times",
            worker_note=True,
        )
    )
    # an older frontend: the copy keeps the cell's id too (a file nbformat.write would refuse)
    nb = copy.deepcopy(solved)
    nb.cells.insert(_index(nb, first.answer) + 1, copy.deepcopy(_cell(nb, first.answer)))
    bank.append(
        Entry(
            "duplicate-cell-id",
            nb,
            set(),
            save="json",
            problem="had the id of another cell",
            worker_note=True,
        )
    )
    # a test cell copied and pasted at the end, to run it again
    nb = copy.deepcopy(work)
    pasted = copy.deepcopy(_cell(nb, first.tests[0]))
    pasted["id"] = "pasted-test"
    nb.cells.append(pasted)
    bank.append(
        Entry(
            "copied-test-cell",
            nb,
            undone,
            problem=f"cell {first.tests[0]}: the test cell appears 2 times",
            worker_note=True,
        )
    )
    # another nbgrader (or an editor) changed a test cell's nbgrader metadata
    nb = copy.deepcopy(solved)
    _cell(nb, first.tests[0]).metadata["nbgrader"]["schema_version"] = 99
    bank.append(
        Entry(
            "changed-nbgrader-metadata",
            nb,
            set(),
            problem=f"cell {first.tests[0]}: the test cell was given other nbgrader metadata",
            worker_note=True,
        )
    )
    # a test cell turned into markdown (one key in Jupyter: M): graded as released
    nb = copy.deepcopy(solved)
    test = _cell(nb, first.tests[0])
    nb.cells[nb.cells.index(test)] = nbformat.v4.new_markdown_cell(
        test.source, metadata=test.metadata, id=test.id
    )
    bank.append(
        Entry(
            "test-cell-to-markdown",
            nb,
            set(),
            problem=f"cell {first.tests[0]}: the test cell was turned into markdown; restored",
            worker_note=True,
        )
    )
    # nbgrader collect copies the whole folder: a scratch notebook saved later beside the answer
    scratch = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")])
    bank.append(
        Entry(
            "scratch-notebook-beside",
            solved,
            set(),
            scratch=[("Untitled.ipynb", scratch)],
            problem=f"{IGNORED_FILE} Untitled.ipynb",
        )
    )
    # three uploads: the newest is graded, whatever the names say
    name = f"{assignment}.ipynb"
    bank.append(
        Entry(
            "uploaded-three-times",
            work,
            undone,
            upload=f"{assignment} (2).ipynb",
            older=[(name, release, 3600.0), (f"{assignment} (1).ipynb", solved, 7200.0)],
            problem=f"{OLDER_UPLOAD} {name}",
        )
    )
    # nbformat 3 (an old Jupyter) and 4.4 (no cell ids), and a notebook saved after running it
    bank.append(Entry("nbformat-3", solved, set(), save="nbformat-v3"))
    bank.append(Entry("nbformat-4.4", work, undone, save="nbformat-4.4"))
    bank.append(Entry("with-outputs", with_outputs(solved), set()))
    for entry in bank:
        entry.assignment = assignment
    return bank


def folder_name(entry: Entry) -> str:
    """The student's folder (or file name part): the entry's student, else its name made plain."""
    return entry.student or re.sub(r"[^A-Za-z0-9_.-]+", "-", entry.name).strip("_.-")


def student_id(entry: Entry) -> str:
    """The id the grader gives the entry's student (graders.submissions.student_id)."""
    return _student_id(folder_name(entry))


Saver = Callable[[Path, object], None]  # writes a notebook to a path (e.g. a Jupyter server)


def save_notebook(nb, path: Path, how: str = "nbformat", saver: Saver | None = None) -> None:
    """Write `nb` (a NotebookNode, or bytes) to `path` the way `how` says (see Entry.save)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(nb, bytes):
        path.write_bytes(nb)
        return
    nb = copy.deepcopy(nb)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    if how == "server":
        if saver is None:
            raise ValueError("an entry saved by a Jupyter server needs a saver")
        saver(path, nb)
    elif how in ("nbformat", "release"):  # write_class copies the release file itself
        nbformat.write(nb, str(path))
    elif how == "nbformat-v3":
        nbformat.write(nb, str(path), version=3)
    elif how == "nbformat-4.4":
        for cell in nb.cells:
            cell.pop("id", None)
        nb.nbformat_minor = 4
        nbformat.write(nb, str(path))
    elif how == "json":  # nbformat's own JSON writer, which does not repair repeated cell ids
        path.write_text(nbformat.v4.nbjson.writes(nb), encoding="utf-8")
    else:
        raise ValueError(f"unknown way to save a notebook: {how!r}")


def write(
    entries: list[Entry],
    folder: Path,
    assignment: str | None = None,
    layout: str = "nbgrader",
    saver: Saver | None = None,
) -> None:
    """Write the bank as submissions: nbgrader's submitted/<student>/<assignment>/ or flat.

    Files get modification times a few seconds apart in the order written; an entry's older
    uploads are dated that many seconds before it.
    """
    now = time.time()
    for entry in entries:
        a = assignment or entry.assignment
        student = folder_name(entry)
        uploads = [(entry.upload or f"{a}.ipynb", entry.notebook, 0.0), *entry.older]
        uploads += [(name, nb, -60.0) for name, nb in entry.scratch]  # saved a minute later
        for name, nb, age in uploads:
            if layout == "nbgrader":
                path = Path(folder) / "submitted" / student / a / name
            else:
                path = Path(folder) / f"{student}_{Path(name).stem}.ipynb"
            save = entry.save if nb is entry.notebook else "nbformat"
            if save == "release" and nb is entry.notebook:
                path.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(release_path(a), path)  # exactly the file the students got
            else:
                save_notebook(nb, path, save, saver)
            os.utime(path, (now - age, now - age))


def graded_class(root: Path = pipeline.REPO) -> list[Entry]:
    """The class tests/test_grading.py grades in one run: every notebook's core() (full saved in
    three formats, untouched as released, partial saved by a Jupyter server, a named mistake),
    and on notebook 01 every adversarial kind and every tooling accident of build()."""
    entries = []
    for assignment in pipeline.assignments(root):
        for entry in core(assignment, root):
            if entry.name == "partial":
                entry.save = "server"  # José works in JupyterLab
            entries.append(entry)
    by_name = {(e.assignment, e.name): e for e in entries}
    formats = {"03_tiled_forward": "nbformat-v3", "04_hbm_traffic": "nbformat-4.4"}
    for assignment, how in formats.items():
        if (assignment, "full") in by_name:
            by_name[(assignment, "full")].save = how
    if ("05_split_kv", "full") in by_name:
        full = by_name[("05_split_kv", "full")]
        full.notebook = with_outputs(full.notebook)
    first = "01_online_softmax"
    if first not in pipeline.assignments(root):
        return entries
    in_core = {"full", "untouched", "partial", "mistake", "nbformat-3", "nbformat-4.4"}
    in_core.add("with-outputs")
    once = set()
    for entry in build(first, root):
        kind = entry.name.split(":")[0]
        if kind in in_core or kind in once:
            continue
        if kind == "calls-reference":
            once.add(kind)  # one of those is enough here
        entries.append(entry)
    # the beliefs of a second notebook too, so the class report counts them across notebooks
    if "04_hbm_traffic" in pipeline.assignments(root):
        for entry in build("04_hbm_traffic", root):
            if entry.name == "wrong-beliefs":
                entries.append(entry)
    return entries
