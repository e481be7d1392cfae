"""The tampering scan (graders/isolation/tampering.py) on the real release notebook of 01.

Each case is the release notebook, read with nbformat, with the student's answer cell replaced by
the solved answer plus a few lines (or a new cell after it, as JupyterLab adds one): the patches
must be found however the object was reached, and honest code (seeds, settings, plots, the
student's own objects, magics, shadowed names) must give nothing. Fast: no kernel runs.
"""

from __future__ import annotations

import ast

import nbformat
import pytest
from fixtures import bank

from graders.intake.submissions import find_tampering as reexported
from graders.isolation.tampering import find_tampering, to_python
from graders.run import pipeline

A = "01_online_softmax"
ASSIGNMENTS = pipeline.assignments()

pytestmark = pytest.mark.skipif(A not in ASSIGNMENTS, reason="notebook 01 missing")

F = "f = lambda *a, **k: True\n"  # a replacement the patches install (not a patch itself)


def _gid(cell):
    return (cell.metadata.get("nbgrader") or {}).get("grade_id")


def _notebook(extra: str, answer: str | None = None, new_cell: bool = False):
    """The release of 01 with `answer` (default: the first answer cell) solved plus `extra`.

    Returns the notebook and the label the scan gives the changed cell: its grade id, or
    "#<index>" for a new cell inserted right after the answer cell."""
    nb = nbformat.read(bank.release_path(A), as_version=4)
    solved = {_gid(c): c.source for c in pipeline.solved_notebook(A).cells if _gid(c)}
    answers = [c for c in nb.cells if (c.metadata.get("nbgrader") or {}).get("solution")]
    cell = next(c for c in answers if answer in (None, _gid(c)))
    cell.source = solved[_gid(cell)] + ("" if new_cell else "\n\n" + extra)
    if not new_cell:
        return nb, _gid(cell)
    idx = nb.cells.index(cell) + 1
    nb.cells.insert(idx, nbformat.v4.new_code_cell(extra))
    nbformat.validate(nb)
    return nb, f"#{idx}"


# (id, lines added to the answer, the patch lines to be reported, extra: answer / new_cell)
PATCHES = [
    # 1. a check reached through an alias
    (
        "check-from-import-as",
        "from course_utils.checks.online_softmax import check_online_softmax_stats as alias\n"
        "alias.__code__ = (lambda *a, **k: None).__code__\n",
        ["alias.__code__ = (lambda *a, **k: None).__code__"],
        {},
    ),
    (
        "checks-module-from-import",
        "from course_utils import checks as c\nc.check_concept = lambda *a, **k: None\n",
        ["c.check_concept = lambda *a, **k: None"],
        {},
    ),
    (
        "checks-submodule-import-as",
        "import course_utils.checks.online_softmax as m\nm.check = lambda *a, **k: None\n",
        ["m.check = lambda *a, **k: None"],
        {},
    ),
    (
        "check-bound-by-the-locked-test-cell",
        "check_online_softmax_stats.__defaults__ = ()\n",
        ["check_online_softmax_stats.__defaults__ = ()"],
        {"answer": "online_softmax_attention"},
    ),
    (
        "star-import",
        "from course_utils.checks.online_softmax import *\n"
        "check_online_softmax_stats.__doc__ = ''\n",
        ["check_online_softmax_stats.__doc__ = ''"],
        {},
    ),
    # 2. cells with IPython syntax
    (
        "shell-line",
        "!echo hi\nimport numpy as np\n\nnp.allclose = lambda *a, **k: True\n",
        ["np.allclose = lambda *a, **k: True"],
        {},
    ),
    (
        "magics-and-help",
        "%matplotlib inline\nfiles = !ls\nnp.allclose?\n" + F + "np.allclose = f\n",
        ["np.allclose = f"],
        {},
    ),
    ("cell-magic", "%%time\n" + F + "np.allclose = f\n", ["np.allclose = f"], {"new_cell": True}),
    ("line-magic", "%time np.allclose = lambda *a: True\n", ["np.allclose = lambda *a: True"], {}),
    ("timeit-options", "%timeit -n 1 -r 1 np.e = 3\n", ["np.e = 3"], {}),
    ("syntax-error-elsewhere", "def broken(:\n    pass\n\nnp.pi = 3\n", ["np.pi = 3"], {}),
    # 3. IPython's shell
    ("run-code", "get_ipython().run_code = lambda *a: None\n", ["get_ipython().run_code = "], {}),
    (
        "shell-in-a-name",
        "ip = get_ipython()\nip.run_cell = lambda *a, **k: None\n",
        ["ip.run_cell = lambda *a, **k: None"],
        {},
    ),
    (
        "events",
        "get_ipython().events.register('post_run_cell', lambda result: None)\n",
        ["get_ipython().events.register('post_run_cell', lambda result: None)"],
        {},
    ),
    (
        "input-transformers",
        "get_ipython().input_transformers_post.append(lambda lines: lines)\n",
        ["get_ipython().input_transformers_post.append(lambda lines: lines)"],
        {},
    ),
    (
        "ast-transformers",
        "shell = get_ipython()\nshell.ast_transformers.append(object())\n",
        ["shell.ast_transformers.append(object())"],
        {},
    ),
    (
        "custom-exc",
        "from IPython import get_ipython as g\n\ng().set_custom_exc((Exception,), print)\n",
        ["g().set_custom_exc((Exception,), print)"],
        {},
    ),
    # 4. and 5. builtins
    (
        "builtins-import",
        "__builtins__.__import__ = lambda *a, **k: None\n",
        ["__builtins__.__import__ = "],
        {},
    ),
    ("builtins-item", "__builtins__['print'] = len\n", ["__builtins__['print'] = len"], {}),
    ("builtins-as", "import builtins as b\n\nb.print = len\n", ["b.print = len"], {}),
    (
        "builtins-setattr",
        "import builtins\n\nsetattr(builtins, 'len', lambda x: 0)\n",
        ["setattr(builtins, 'len', lambda x: 0)"],
        {},
    ),
    # 6. a module in a local variable
    ("setattr-local", "m = np\nsetattr(m, 'allclose', len)\n", ["setattr(m, 'allclose', len)"], {}),
    (
        "sys-modules-item",
        "import sys\n\nmod = sys.modules['numpy']\nmod.abs = len\n",
        ["mod.abs = len"],
        {},
    ),
    (
        "import-module",
        "import importlib\n\nmod = importlib.import_module('numpy')\nmod.abs = len\n",
        ["mod.abs = len"],
        {},
    ),
    (
        "dunder-import",
        "mod = __import__('numpy')\ndelattr(mod, 'abs')\n",
        ["delattr(mod, 'abs')"],
        {},
    ),
    ("getattr", "getattr(np, 'testing').assert_allclose = len\n", ["getattr(np, 'testing')"], {}),
    # 7. namespace dicts
    ("vars-item", "vars(np)['abs'] = len\n", ["vars(np)['abs'] = len"], {}),
    ("dict-item", "np.__dict__['abs'] = len\n", ["np.__dict__['abs'] = len"], {}),
    ("globals-item", "globals()['np'].abs = len\n", ["globals()['np'].abs = len"], {}),
    ("vars-update", "vars(np).update(abs=len)\n", ["vars(np).update(abs=len)"], {}),
    (
        "operator-setitem",
        "import operator\n\noperator.setitem(vars(np), 'abs', len)\n",
        ["operator.setitem(vars(np), 'abs', len)"],
        {},
    ),
    # relatives
    (
        "sys-modules-store",
        "import sys\n\nsys.modules['course_utils.checks'] = object()\n",
        ["sys.modules['course_utils.checks'] = object()"],
        {},
    ),
    (
        "sys-modules-pop",
        "import sys\n\nsys.modules.pop('numpy')\n",
        ["sys.modules.pop('numpy')"],
        {},
    ),
    ("del", "del np.allclose\n", ["del np.allclose"], {}),
    ("submodule", "np.testing.assert_allclose = len\n", ["np.testing.assert_allclose = len"], {}),
    ("torch", "import torch\n\ntorch.allclose = len\n", ["torch.allclose = len"], {}),
    ("triton", "import triton as tr\n\ntr.jit = len\n", ["tr.jit = len"], {}),
    ("cu-alias", "cu.online_softmax_stats = len\n", ["cu.online_softmax_stats = len"], {}),
    (
        "mock-patch-start",
        "from unittest import mock\n\nmock.patch('numpy.allclose', len).start()\n",
        ["mock.patch('numpy.allclose', len).start()"],
        {},
    ),
    (
        "mock-patch-object",
        "from unittest.mock import patch\n\npatch.object(np, 'allclose', len).start()\n",
        ["patch.object(np, 'allclose', len).start()"],
        {},
    ),
    (
        "mock-patch-dict",
        "import unittest.mock\n\nwith unittest.mock.patch.dict('sys.modules', {'x': None}):\n"
        "    pass\n",
        ["with unittest.mock.patch.dict('sys.modules', {'x': None}):"],
        {},
    ),
    (
        "object-setattr",
        "object.__setattr__(np, 'pi', 3)\n",
        ["object.__setattr__(np, 'pi', 3)"],
        {},
    ),
    ("exec", "exec('np.pi = 3')\n", ["np.pi = 3"], {}),
    ("run-cell", "get_ipython().run_cell('np.pi = 3')\n", ["np.pi = 3"], {}),
    (
        "helper-function",
        "def patch(mod):\n    mod.allclose = len\n\n\npatch(np)\n",
        ["mod.allclose = len"],
        {},
    ),
    ("in-a-function", "def p():\n    np.allclose = len\n", ["np.allclose = len"], {}),
    (
        "returned-module",
        "def numpy_module():\n    return np\n\n\nnumpy_module().pi = 3\n",
        ["numpy_module().pi = 3"],
        {},
    ),
    ("loop", "for m in (np, cu):\n    m.pi = 3\n", ["m.pi = 3"], {}),
    ("maybe", "if True:\n    m = np\nelse:\n    m = None\nm.pi = 3\n", ["m.pi = 3"], {}),
]


@pytest.mark.parametrize("extra, lines, kw", [p[1:] for p in PATCHES], ids=[p[0] for p in PATCHES])
def test_patch_is_found(extra, lines, kw):
    nb, label = _notebook(extra, **kw)
    found = find_tampering(nb)
    assert len(found) == len(lines), found
    for got, want in zip(found, lines, strict=True):
        assert got.startswith(f"cell {label}: "), got
        # the reported line is the statement as Python spells it: the patch's own line
        assert got.removeprefix(f"cell {label}: ").startswith(want), (got, want)
    assert reexported(nb) == found  # graders.intake.submissions still offers the same function


# Honest code: must give nothing.
HONEST = [
    ("seeds", "np.random.seed(0)\nrng = np.random.default_rng(0)\nx = rng.normal(size=3)\n"),
    (
        "torch-settings",
        "import torch\n\ntorch.manual_seed(0)\ntorch.backends.cuda.matmul.allow_tf32 = True\n"
        "t = torch.zeros(3)\nt[0] = 1\nt.requires_grad = True\n",
    ),
    (
        "printoptions",
        "np.set_printoptions(precision=3)\nwith np.errstate(over='ignore'):\n    pass\n",
    ),
    (
        "plots",
        "import matplotlib.pyplot as plt\n\nfig, ax = plt.subplots()\nax.plot([1, 2])\n"
        "ax.title.text = 'x'\nplt.rcParams['figure.dpi'] = 100\n",
    ),
    (
        "own-objects",
        "class Box:\n    size = 1\n\n    def __init__(self):\n        self.x = np.zeros(3)\n\n\n"
        "Box.size = 3\nb = Box()\nb.x[0] = 1\nsetattr(b, 'y', 2)\nb.__dict__['z'] = 3\n",
    ),
    ("arrays", "a = np.zeros(3)\na[0] = 1\na.shape = (3, 1)\nb = np.append(a, 1.0)\n"),
    ("np-functions", "b = np.insert(np.zeros(2), 0, 5.0)\nc = np.delete(b, 0)\n"),
    (
        "shadowed-names",
        "print = lambda *a, **k: None\ndel print\nglobals()['x'] = 1\n"
        "get_ipython().user_ns['y'] = 2\nvars()['z'] = 3\n",
    ),
    (
        "rebound-module-name",
        "class Fake:\n    pass\n\n\nmodule = np\nmodule = Fake()\nmodule.allclose = len\n",
    ),
    (
        "parameter-shadows",
        "def f(np):\n    np.x = 1\n    return np\n\n\nclass C:\n    pass\n\n\nf(C())\n",
    ),
    (
        "magics",
        "%matplotlib inline\n!pip list\nfiles = !ls\nnp.allclose?\n%time x = np.ones(3)\n"
        "get_ipython().run_line_magic('precision', '3')\n",
    ),
    ("sys-path", "import sys\n\nsys.path.append('..')\nsys.path.insert(0, '.')\n"),
    (
        "reads-and-calls",
        "from course_utils.checks.online_softmax import check_online_softmax_stats as chk\n\n"
        "chk(online_softmax_stats)\ndoc = np.allclose.__doc__\nfn = getattr(np, 'exp')\n",
    ),
    (
        "mock-of-own-things",
        "from unittest import mock\n\n\nclass Box:\n    size = 1\n\n\nm = mock.MagicMock()\n"
        "m.x = 1\nwith mock.patch.object(Box, 'size', 3):\n    pass\n",
    ),
    ("exec-own-code", "exec('z = 1')\nlst = [1]\nlst.append(2)\nd = {}\nd.update(a=1)\n"),
    ("broken-syntax", "def broken(:\n    pass\n"),
]


@pytest.mark.parametrize("extra", [h[1] for h in HONEST], ids=[h[0] for h in HONEST])
def test_honest_code_is_not_flagged(extra):
    nb, _ = _notebook(extra)
    assert find_tampering(nb) == []
    nb, _ = _notebook(extra, new_cell=True)  # the same lines in a cell of their own
    assert find_tampering(nb) == []


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_solved_notebooks_give_nothing(assignment):
    nb = pipeline.solved_notebook(assignment)
    assert any(c.cell_type == "code" for c in nb.cells)
    assert find_tampering(nb) == []


def test_locked_cells_are_read_but_not_reported():
    """nbgrader puts the release's copy of a locked cell back: its lines are not the student's."""
    nb, _ = _notebook("")
    locked = [c for c in nb.cells if (c.metadata.get("nbgrader") or {}).get("locked")]
    locked[-1].source += "\nnp.allclose = len\nnumpy_alias = np\n"
    assert find_tampering(nb) == []
    nb.cells.append(nbformat.v4.new_code_cell("numpy_alias.pi = 3"))  # bound in the locked cell
    assert find_tampering(nb) == [f"cell #{len(nb.cells) - 1}: numpy_alias.pi = 3"]


def test_ipython_syntax_is_read_as_the_kernel_runs_it():
    tree = to_python("!ls\nx = !ls\n%matplotlib inline\nnp.allclose?\ny = 1\n")
    calls = [ast.unparse(s) for s in tree.body]
    assert calls[-1] == "y = 1" and len(calls) == 5
    assert all("get_ipython()" in c for c in calls[:-1])
    assert [ast.unparse(s) for s in to_python("def f(:\n    pass\nz = 2\n").body] == ["z = 2"]


def test_problem_lines_are_one_short_line():
    nb, label = _notebook("np.pi = (" + " + ".join(["1"] * 200) + ")\n")
    (line,) = find_tampering(nb)
    assert line.startswith(f"cell {label}: np.pi = 1 + 1 + 1") and len(line) < 300
    assert line.endswith("...")
