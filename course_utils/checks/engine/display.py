"""Values as feedback shows them: numbers, small arrays in full, large ones summarized.

describe(value)            "[1.0, 2.0]", "float64 array of shape (64, 16), values in [...]"
fmt_bytes(n)               1536 -> "1.5 KiB"
_arg_names, _describe_args the names and values of a case's arguments, for a failure
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from course_utils.checks.engine.cases import Case


# ---------------------------------------------------------------------------------------------
# Describing values in feedback
# ---------------------------------------------------------------------------------------------

_SMALL = 12  # arrays with more elements than this are summarized, not printed


def describe(value, precision: int = 6) -> str:
    """A short, readable repr of a number or array for feedback messages.

    Integers stay integers; arrays of more than 12 elements are summarized by shape and range.
    """
    if isinstance(value, bool | np.bool_):
        return repr(bool(value))
    if isinstance(value, types.FunctionType):
        return _function_name(value)
    try:
        ndim = np.ndim(value)
    except ValueError:  # e.g. a list of index arrays of different lengths
        return repr(value)
    if isinstance(value, np.ndarray) or ndim > 0:
        try:
            arr = np.asarray(value)
        except ValueError:
            return repr(value)
        if arr.dtype.kind not in "fciub":
            return repr(value)
        if arr.size > _SMALL:
            return _summary(arr, precision)
        if arr.dtype.kind in "iub":
            body = np.array2string(arr, max_line_width=10_000, separator=", ")
        else:
            body = np.array2string(arr, precision=precision, max_line_width=10_000, separator=", ")
        body = re.sub(r"\s*\n\s*", " ", body)  # one line, whatever the shape
        return f"{body} (shape {arr.shape})" if arr.ndim > 1 else body
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        return f"{float(value):.{precision}g}"
    return repr(value)


def _function_name(fn: types.FunctionType) -> str:
    """A function as feedback shows it: its name (a check's own backend), no address."""
    return fn.__qualname__


def _summary(arr: np.ndarray, precision: int = 4) -> str:
    """'float64 array of shape (64, 16), values in [-2.1, 3.4]' (with -inf / NaN counts)."""
    text = f"{arr.dtype} array of shape {arr.shape}"
    if arr.size == 0 or arr.dtype.kind not in "fiub":
        return text
    a = arr.astype(np.float64)
    finite = a[np.isfinite(a)]
    if finite.size:
        text += f", values in [{finite.min():.{precision}g}, {finite.max():.{precision}g}]"
    extras = [
        f"{int(n)} {what}"
        for n, what in ((np.isneginf(a).sum(), "-inf"), (np.isposinf(a).sum(), "+inf"))
        if n
    ]
    if np.isnan(a).any():
        extras.append(f"{int(np.isnan(a).sum())} NaN")
    return text + (f" ({', '.join(extras)})" if extras else "")


def _arg_names(fn: Callable, n: int, kwargs: dict) -> list[str]:
    """Names of fn's first n positional parameters (or 'argument k'), then the kwargs' names."""
    try:
        params = list(inspect.signature(fn).parameters.values())
        names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        names = []
    names = names[:n] + [f"argument {k + 1}" for k in range(len(names), n)]
    return names + list(kwargs)


def _describe_args(case: Case, names: Sequence[str] | None = None) -> str:
    values = list(case.args) + list(case.kwargs.values())
    names = list(names or []) or [None] * len(case.args) + list(case.kwargs)
    parts = []
    for name, value in zip(names, values, strict=False):
        text = describe(value)
        parts.append(f"{name} = {text}" if name else text)
    return ", ".join(parts)


def fmt_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; powers of 2, as the notebooks count memory."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} bytes"
