"""What notebook 06's checks share: the launch of a learner's kernel through a
runner, the comparison of output buffers, and the naming of a mistake among replays that match.

    _launch(name, fn, run, *args)       call_learner on a runner of course_utils.harness.
                                        triton_puzzles; the learner's errors become CheckFailures
    _error(yours, expected)             relative error in norm, inf where NaN/inf do not agree
    _nearest_mistake(yours, replays, tol, source=, second=)
                                        the mistake whose replay is nearest the learner's output;
                                        ties go to the other output, then to the learner's source
    _learner_source(fn)                 the learner's kernel source, as far as this process sees
    _stage_line, _rules_line            the lines of a failure and of a pass line
    _on_gpu, _ampere_or_newer           where the kernels run

Used by puzzles (the four puzzles) and forward (the whole forward kernel).
"""

from __future__ import annotations

import functools
import inspect
import math
import re

import numpy as np

from course_utils.checks.engine.failures import CheckFailure
from course_utils.checks.engine.feedback import _norm_distance, matches_in_norm
from course_utils.checks.engine.watch import _LearnerRaised, call_learner


def _on_gpu() -> bool:
    from course_utils.triton_attention import INTERPRETER

    return not INTERPRETER


# What the notebook gives the learner to call: the launcher's input checks, and on a GPU the chip's
# tiles (tile_config) and their launch keywords (TileConfig.launch_options: warps, stages, cap)
GIVEN = ("check_attention_inputs", "tile_config", "launch_options")


def _learner_fn(fn, run):
    """run with the learner's fn bound as first argument, wherever fn lives."""
    if hasattr(fn, "bound_into"):  # a grader's handle on the notebook kernel's function
        return fn.bound_into(f"{run.__module__}:{run.__name__}")
    return functools.partial(run, fn)


def _launch(name, fn, run, *args):
    """call_learner on the runner; the learner's errors become CheckFailures."""
    runner = _learner_fn(fn, run)
    try:
        return call_learner(runner, *args, name=name, allow=(run.__name__, "partial", *GIVEN))
    except NotImplementedError:
        raise
    except _LearnerRaised as err:
        if isinstance(err.exc, TypeError) and "@triton.jit" in str(err.exc):
            raise CheckFailure(f"✗ {name}: {err.exc}") from None
        raise _LearnerRaised(err.exc) from None


def _as_numpy(t) -> np.ndarray:
    return t.double().cpu().numpy()


def _error(yours: np.ndarray, expected: np.ndarray) -> float:
    """Relative error in norm; inf when the shapes differ, when yours has a NaN, or when the
    infinities (and the NaN a buffer keeps where nothing is written) are not in the same places."""
    if yours.shape != expected.shape:
        return math.inf
    special_y, special_e = ~np.isfinite(yours), ~np.isfinite(expected)
    if (special_y != special_e).any():
        return math.inf
    if not np.array_equal(yours[special_y], expected[special_e], equal_nan=True):
        return math.inf
    y, e = yours[~special_y], expected[~special_e]
    if y.size == 0:
        return 0.0
    return float(np.linalg.norm(y - e) / max(np.linalg.norm(e), 1e-30))


def _stage_line(name: str, stages: list[str], failed: str) -> str:
    k = stages.index(failed)
    passed = "; ".join(f"stage {i + 1} ({s}) passes" for i, s in enumerate(stages[:k]))
    line = f"✗ {name}: stage {k + 1} of {len(stages)} ({failed}) fails"
    return line + (f"; {passed}." if passed else ".")


# What a learner's source shows when two mistakes' replays give the same numbers: exp(x) is
# exp2(x * log2(e)), so tl.exp on base-2 scores and log2(e) folded twice into the scale compute
# one thing; the source says which was written.
_SOURCE_EVIDENCE = {
    "exp-vs-exp2": lambda src: bool(re.search(r"\btl\.(math\.)?exp\(", src)),
    "scale-folded-twice": lambda src: "exp2" in src,
    "exp2-without-log2e": lambda src: "exp2" in src,
}


def _learner_source(fn) -> str:
    """The source of the learner's kernel (or launcher, and the kernels its code names), as far
    as this process can read it; "" for a grader's handle on a notebook's kernel."""
    found = []

    def read(obj):
        target = getattr(obj, "fn", obj)
        try:
            found.append(inspect.getsource(target))
        except (OSError, TypeError):
            pass

    if hasattr(fn, "bound_into"):
        return ""
    read(fn)
    code, names = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
    for name in getattr(code, "co_names", ()):
        obj = names.get(name)
        if obj is not fn and callable(getattr(obj, "fn", None)):  # a @triton.jit kernel
            read(obj)
    return "\n".join(found)


def _nearest_mistake(yours, replays, tol, *, source="", second=None):
    """Of the mistakes whose replay matches yours (matches_in_norm within tol), the nearest.

    replays: (mistake, theirs) pairs, or (mistake, theirs, their second output) when `second`
    (the learner's other output, lse for out) is given. Replays within twice the nearest
    distance are a tie (two mistakes can compute the same numbers); a tie goes to the replay
    whose second output is nearest the learner's, then to the mistake the learner's source shows
    (_SOURCE_EVIDENCE), then to the first listed. None when no replay matches.
    """
    matched = {}
    for mistake, theirs, *other in replays:
        if not matches_in_norm(yours, theirs, tol):
            continue
        d1 = _norm_distance(yours, theirs)
        d2 = _norm_distance(second, other[0]) if second is not None and other else 0.0
        key = id(mistake)
        if key not in matched or (d1, d2) < matched[key][1:]:
            matched[key] = (mistake, d1, d2)
    if not matched:
        return None
    found = list(matched.values())
    nearest = min(d1 for _, d1, _ in found)
    found = [f for f in found if f[1] <= 2 * nearest + 1e-9]
    nearest2 = min(d2 for _, _, d2 in found)
    found = [f for f in found if f[2] <= 2 * nearest2 + 1e-9]
    shown = [f for f in found if _SOURCE_EVIDENCE.get(f[0].slug, lambda _: False)(source)]
    unshown = [f for f in found if f[0].slug in _SOURCE_EVIDENCE and f not in shown]
    if shown and unshown:
        found = shown
    return found[0][0]


def _ampere_or_newer() -> bool:
    """bfloat16 tl.dot and 128 x 64 tiles need an sm_80+ GPU (a Colab T4 is sm_75)."""
    import torch

    return torch.cuda.get_device_capability()[0] >= 8


def _rules_line(rules: str) -> str:
    """What the pass line says of the load rules: checked (in the interpreter, which records
    every load), or not checked on a GPU (no interpreter hook there)."""
    if not rules:
        return ""
    if _on_gpu():
        return f"; not checked on the GPU, only in the interpreter: {rules}"
    return f"; the interpreter's load log shows {rules}"
