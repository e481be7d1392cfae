"""The wire format between a grader and the process that runs a learner's code.

A value is encoded as JSON (numbers, strings, lists, tagged tuples and dicts) plus a dict of NumPy
arrays. A file holds the JSON header (the tree, and each array's dtype, shape and place) and then
the arrays' raw bytes. Decoding never unpickles anything (json.loads, and np.frombuffer with a
dtype of plain numbers or text), so whatever the learner's process writes, reading it cannot run
its code. (An .npz, zip and all, cost 1.4 ms more a call, both sides together: a check makes
hundreds of calls.) Only the types below travel; anything else is refused with a message naming
its type. A function of course_utils marked with @travels (a check's own backend, passed to the
learner's code) travels by its module and name, and is imported back from the package on the
other side: decoding imports a course_utils module, never a name the sender chose outside the
package, and accepts only a function that carries the mark.

    encode(value) -> (tree, arrays)        decode(tree, arrays) -> value
    save(path, value)                      load(path) -> value
    @travels                               mark a module-level course_utils function to travel
"""

from __future__ import annotations

import importlib
import json
import math
import types
from pathlib import Path

import numpy as np


class WireError(TypeError):
    """A value that cannot travel between the grader and the learner's process."""


_MARK = "__course_wire__"


def travels(fn):
    """Mark fn, a module-level function of course_utils, as sent by name (returns fn)."""
    setattr(fn, _MARK, True)
    return fn


def _travelling(v) -> bool:
    return (
        isinstance(v, types.FunctionType)
        and getattr(v, _MARK, False) is True
        and (v.__module__ or "").startswith("course_utils.")
        and v.__qualname__ == v.__name__
    )


def _function(path: str):
    """The marked function course_utils.<module>:<name> names; WireError for anything else."""
    module, _, name = path.partition(":")
    if not module.startswith("course_utils.") or not name.isidentifier():
        raise WireError(f"cannot receive the function {path!r}: not a course_utils function")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise WireError(f"cannot receive the function {path!r}: {exc}") from None
    if not _travelling(fn):
        raise WireError(f"cannot receive the function {path!r}: it is not marked to travel")
    return fn


def _classes():
    """Array subclasses that travel by name (imported lazily: each module imports this one)."""
    from course_utils.harness.key_parts import KeyParts

    return {"KeyParts": KeyParts}


def encode(value, arrays: dict | None = None):
    """The JSON-able tree of value; arrays are put into `arrays` under generated keys."""
    arrays = {} if arrays is None else arrays

    def put(arr: np.ndarray) -> str:
        key = f"a{len(arrays)}"
        arrays[key] = arr
        return key

    def enc(v):
        if isinstance(v, np.generic):  # before float: np.float64 is a float
            return {"__scalar__": put(np.asarray(v))}
        if v is None or isinstance(v, bool | str):
            return v
        if isinstance(v, int):
            return {"__int__": str(v)} if abs(v) > 2**53 else v
        if isinstance(v, float):
            return {"__float__": float.__repr__(v)}
        if isinstance(v, np.ndarray):
            cls = type(v).__name__ if type(v) is not np.ndarray else None
            if cls is not None and cls not in _classes() and cls != "Traced":
                cls = None
            if v.dtype == object:
                return {
                    "__objects__": [enc(x) for x in v.ravel()],
                    "shape": list(v.shape),
                    "cls": cls,
                }
            if v.dtype.kind not in "biufc":
                raise WireError(f"cannot send an array of dtype {v.dtype}")
            plain = np.array(v.view(np.ndarray), order="C", copy=True)
            return {"__array__": put(plain), "cls": None if cls == "Traced" else cls}
        if isinstance(v, tuple):
            return {"__tuple__": [enc(x) for x in v]}
        if isinstance(v, list):
            return [enc(x) for x in v]
        if isinstance(v, set | frozenset):  # e.g. the letters of a concept question
            items = [enc(x) for x in v]
            if not all(isinstance(x, str | int | bool) for x in items):
                raise WireError("cannot send a set of anything but strings and numbers")
            return {"__set__": sorted(items, key=repr)}
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                raise WireError("cannot send a dict whose keys are not strings")
            return {"__dict__": {k: enc(x) for k, x in v.items()}}
        if _travelling(v):
            return {"__function__": f"{v.__module__}:{v.__name__}"}
        torch = _torch_if_tensor(v)
        if torch is not None:
            dtype = str(v.dtype).removeprefix("torch.")
            data = v.detach().cpu()
            if dtype == "bfloat16":
                data = data.float()
            return {"__tensor__": put(data.numpy()), "dtype": dtype, "device": str(v.device)}
        raise WireError(f"cannot send a value of type {type(v).__name__}")

    return enc(value), arrays


def _torch_if_tensor(v):
    mod = type(v).__module__ or ""
    if not mod.startswith("torch"):
        return None
    import torch

    return torch if isinstance(v, torch.Tensor) else None


def decode(tree, arrays):
    """The value encoded as tree (the inverse of encode)."""

    def dec(t):
        if t is None or isinstance(t, bool | str | int):
            return t
        if isinstance(t, float):
            return t
        if isinstance(t, list):
            return [dec(x) for x in t]
        if not isinstance(t, dict):
            raise WireError(f"unexpected {type(t).__name__} on the wire")
        if "__int__" in t:
            return int(t["__int__"])
        if "__float__" in t:
            return float(t["__float__"])
        if "__scalar__" in t:
            return np.asarray(arrays[t["__scalar__"]])[()]
        if "__array__" in t:
            arr = np.array(arrays[t["__array__"]])
            return _as_class(arr, t.get("cls"))
        if "__objects__" in t:
            arr = np.empty(len(t["__objects__"]), dtype=object)
            for i, x in enumerate(t["__objects__"]):
                arr[i] = dec(x)
            return _as_class(arr.reshape(t["shape"]), t.get("cls"))
        if "__tuple__" in t:
            return tuple(dec(x) for x in t["__tuple__"])
        if "__set__" in t:
            return frozenset(dec(x) for x in t["__set__"])
        if "__dict__" in t:
            return {str(k): dec(x) for k, x in t["__dict__"].items()}
        if "__function__" in t:
            return _function(str(t["__function__"]))
        if "__tensor__" in t:
            import torch

            data = torch.from_numpy(np.array(arrays[t["__tensor__"]]))
            return data.to(getattr(torch, t["dtype"]))
        raise WireError(f"unknown tag on the wire: {sorted(t)}")

    return dec(tree)


def _as_class(arr: np.ndarray, cls: str | None):
    if cls is None:
        return arr
    known = _classes()
    if cls not in known:
        raise WireError(f"unknown array class {cls!r} on the wire")
    return arr.view(known[cls])


_MAGIC = b"course-wire 1\n"
_ARRAY_KINDS = "biufcUS"  # the array kinds a file may declare: numbers, booleans, text


def save(path: Path, value) -> None:
    """Write value to path: _MAGIC, the header's length (8 bytes, little-endian), the JSON header
    {"tree": ..., "arrays": {key: [dtype, shape, offset, nbytes]}}, then the arrays' bytes."""
    tree, arrays = encode(value)
    metas, chunks, offset = {}, [], 0
    for key, arr in arrays.items():
        data = np.ascontiguousarray(arr).tobytes()
        metas[key] = [arr.dtype.str, list(arr.shape), offset, len(data)]
        chunks.append(data)
        offset += len(data)
    head = json.dumps({"tree": tree, "arrays": metas}).encode()
    with open(path, "wb") as fh:
        fh.write(_MAGIC + len(head).to_bytes(8, "little") + head + b"".join(chunks))


def load(path: Path):
    """The value stored at path by save; never unpickles. WireError for a file save did not
    write (another format, cut short, or an array of objects)."""
    buf = Path(path).read_bytes()
    start = len(_MAGIC) + 8
    if not buf.startswith(_MAGIC) or len(buf) < start:
        raise WireError(f"{Path(path).name} is not a file of the wire format")
    size = int.from_bytes(buf[len(_MAGIC) : start], "little")
    try:
        head = json.loads(buf[start : start + size].decode())
        tree, metas = head["tree"], dict(head["arrays"])
    except (ValueError, KeyError, TypeError) as exc:
        raise WireError(f"{Path(path).name}: unreadable header ({exc})") from None
    base = start + size
    arrays = {}
    for key, meta in metas.items():
        try:
            descr, shape, offset, nbytes = meta
            dtype, shape = np.dtype(str(descr)), tuple(shape)
            if not all(type(n) is int for n in (*shape, offset, nbytes)):  # as save writes them
                raise TypeError("its shape, offset and size must be integers")
        except (ValueError, TypeError) as exc:
            raise WireError(f"{Path(path).name}: bad array {key!r} ({exc})") from None
        if dtype.kind not in _ARRAY_KINDS or dtype.hasobject or dtype.fields:
            raise WireError(f"{Path(path).name}: array {key!r} of dtype {dtype} cannot travel")
        count = math.prod(shape)  # Python integers: no overflow to hide a size
        if (
            min(shape, default=0) < 0
            or offset < 0
            or count * dtype.itemsize != nbytes
            or base + offset + nbytes > len(buf)
        ):
            raise WireError(f"{Path(path).name}: array {key!r} does not fit its bytes")
        arrays[key] = np.frombuffer(buf, dtype, count, base + offset).reshape(shape)
    return decode(tree, arrays)
