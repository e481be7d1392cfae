"""Input checks shared by every public function: errors name the argument and what it expected."""

from __future__ import annotations

import math
import numbers

import numpy as np


def as_float_array(
    value, name: str, *, ndim: int | tuple[int, ...] | None = None, allow_inf: bool = False
) -> np.ndarray:
    """Return `value` as a float64 array after checking its dtype, ndim and values.

    Raises TypeError for non-numeric or complex input (bools and integers are not silently
    accepted as scores), ValueError for a wrong ndim or for NaN (and +-inf unless allow_inf).
    """
    arr = np.asarray(value)
    if arr.dtype == object or not np.issubdtype(arr.dtype, np.floating):
        raise TypeError(
            f"{name} must be an array of real floats (float16/32/64), got dtype {arr.dtype}"
        )
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else ndim
        if arr.ndim not in allowed:
            want = " or ".join(str(n) for n in allowed)
            raise ValueError(f"{name} must have {want} dimensions, got shape {arr.shape}")
    arr = arr.astype(np.float64, copy=False)
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN; attention inputs must be numbers")
    if allow_inf:
        if np.isposinf(arr).any():
            raise ValueError(f"{name} contains +inf; only -inf (a masked entry) is allowed")
    elif np.isinf(arr).any():
        raise ValueError(f"{name} contains inf; expected finite values")
    return arr


def positive_int(value, name: str) -> int:
    """Return `value` as an int, or raise if it is not a positive integer (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)


def positive_real(value, name: str) -> float:
    """Return `value` as a float, or raise if it is not a finite positive real (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be finite and positive, got {value}")
    return float(value)


def softmax_scale_or_default(softmax_scale, d: int) -> float:
    """The scale tau applied to q.k; default 1/sqrt(d)."""
    if softmax_scale is None:
        return 1.0 / np.sqrt(d) if d > 0 else 1.0
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"softmax_scale must be a real number or None, got {softmax_scale!r}")
    if not np.isfinite(softmax_scale) or softmax_scale <= 0:
        raise ValueError(f"softmax_scale must be finite and positive, got {softmax_scale}")
    return float(softmax_scale)


def check_qkv(Q: np.ndarray, K: np.ndarray, V: np.ndarray, causal: bool) -> None:
    """Check the shapes of 2-D Q (Nq, d), K (Nk, d), V (Nk, dv) against each other."""
    if Q.shape[1] != K.shape[1]:
        raise ValueError(
            f"Q and K must share the head dimension d: Q has shape {Q.shape}, K has {K.shape}"
        )
    if K.shape[0] != V.shape[0]:
        raise ValueError(
            f"K and V must have the same number of keys: K has shape {K.shape}, V has {V.shape}"
        )
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    if causal and Q.shape[0] != K.shape[0]:
        raise ValueError(
            "causal=True needs as many queries as keys (query i sees keys 0..i): "
            f"Q has {Q.shape[0]} rows, K has {K.shape[0]}"
        )
