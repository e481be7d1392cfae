"""Which elements of each watched tensor a kernel loads, program by program, in the interpreter.

The checks of notebook 06 need to see loads that leave no trace in the output: a row of `a`
past M read without a mask lands in a row of c that is never stored; a second pass over K gives
the same numbers as one. `recording(watched)` listens to the interpreter's loads (through the
guard of bounds.py, which sees every tl.load first) while the kernels it launches run:

    watched      {name: tensor}: the views the check cares about (q, k, v; a, b; x). A load lane
                 counts for a watched tensor when its address lies in that tensor's storage,
                 whatever kernel argument or pointer arithmetic brought it there
    per program  one engine.tracing.LoadLog per (launch, program id, watched tensor): how often each
                 element of the view was loaded, the notebooks' own measure of reads
    outside      the active lanes (mask true, or no mask) whose address is in the storage but
                 not an element of the view: the guard band the runners allocate around it

`LoadRecorder.summary()` is plain data (numbers, strings, arrays: it travels from a notebook's
kernel to a grader), read by course_utils.checks.triton_forward.loads. On a GPU there is no
interpreter and nothing is recorded: summary() says so with {"recorded": False}.
"""

from __future__ import annotations

import contextlib

import numpy as np

from course_utils.checks.engine.tracing import LoadLog
from course_utils.harness import triton_bounds as bounds

__all__ = ["LoadRecorder", "recording"]

# The hooks bounds.py calls below the learner's kernel, and what they call: instrumentation, not
# a course function the learner's code calls (see checks.engine.watch._frame_kind)
INSTRUMENTS = ("begin", "load", "index")


class _Watched:
    """One watched view: its storage, its layout, and where its elements are."""

    def __init__(self, name: str, t):
        storage = t.untyped_storage()
        self.name = name
        self.start = int(storage.data_ptr())
        self.end = self.start + int(storage.nbytes())
        self.data_ptr = int(t.data_ptr())
        self.itemsize = int(t.element_size())
        self.shape = tuple(int(n) for n in t.shape)
        self.strides = tuple(int(s) for s in t.stride())
        self.size = int(np.prod(self.shape)) if self.shape else 1
        # dims of more than one element, widest stride first (a size-1 dim's index is 0)
        self.order = sorted(
            (k for k, n in enumerate(self.shape) if n > 1), key=lambda k: -self.strides[k]
        )

    def index(self, addresses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The view index (ndim, n) of each address and whether it is an element of the view."""
        off_bytes = addresses.astype(np.int64) - self.data_ptr
        rest, remainder = np.divmod(off_bytes, self.itemsize)
        inside = (remainder == 0) & (rest >= 0)
        idx = np.zeros((len(self.shape), rest.size), dtype=np.int64)
        for k in self.order:
            idx[k], rest = np.divmod(rest, self.strides[k])
            inside &= idx[k] < self.shape[k]
        inside &= rest == 0
        return idx, inside


class LoadRecorder:
    """The loads of the watched tensors during the launches made while it records."""

    def __init__(self, watched: dict):
        self.watched = [_Watched(name, t) for name, t in watched.items()]
        self.launches: list[tuple[str, object]] = []  # (kernel name, its Python function)
        # (launch, program id, name) -> [loads per element, the loads in order]: a LoadLog's
        # counts and loads, kept raw while the kernel runs (LoadLog.record sorts every tile);
        # the LoadLog is built, for the program that matters, by summary()
        self.logs: dict[tuple, list] = {}
        self.read = {w.name: np.zeros(w.size, dtype=bool) for w in self.watched}
        self.outside = {w.name: 0 for w in self.watched}
        self.example: dict[str, dict] = {}  # name -> the first load outside the view
        self.recorded = _hooked()  # the interpreter runs the kernels, and bounds.py sees them

    # called by bounds.py's guard
    def begin(self, kernel: str, fn) -> None:
        self.launches.append((kernel, fn))

    def load(self, ptrs, mask) -> None:
        if not self.watched or not self.launches:
            return
        ptrs = np.asarray(ptrs)
        if ptrs.dtype.kind not in "iu":
            return
        on = None if mask is None else np.broadcast_to(np.asarray(mask, dtype=bool), ptrs.shape)
        active = (ptrs.reshape(-1) if on is None else ptrs[on]).astype(np.int64)
        if active.size == 0:
            return
        for w in self.watched:
            mine = (active >= w.start) & (active < w.end)
            if not mine.any():
                continue
            idx, inside = w.index(active[mine])
            pid = bounds._program_id()
            key = (len(self.launches) - 1, pid, w.name)
            log = self.logs.get(key)
            if log is None:
                log = self.logs[key] = [np.zeros(w.size, dtype=np.int32), []]
            if inside.any():
                flat = np.ravel_multi_index(tuple(idx[:, inside]), w.shape)
                last = log[1][-1] if log[1] else None
                # the same tile loaded again right after itself counts once (LoadLog.record)
                if last is None or last.size != flat.size or not np.array_equal(last, flat):
                    log[0][flat] += 1  # a lane repeated within the tile counts once
                    log[1].append(flat)
                    self.read[w.name][flat] = True
            n_out = int((~inside).sum())
            if n_out and w.name not in self.example:
                first = idx[:, ~inside][:, 0]
                self.example[w.name] = {
                    "kernel": self.launches[-1][0],
                    "program": list(pid),
                    "index": first.tolist(),
                    "mask": bounds._mask_kind(ptrs.shape, on),
                    "lanes": n_out,
                    "tile": list(ptrs.shape),
                }
            self.outside[w.name] += n_out

    # read by the checks
    def summary(self) -> dict:
        """Plain data: per watched tensor, its shape, the elements read at least once, the most
        loads of one element by one program (and that program's LoadLog, as a dict), the lanes
        read outside the view (and the first); the kernels launched, and how many launches were
        of a kernel the learner wrote (any kernel not shipped in course_utils)."""
        if not self.recorded:
            return {"recorded": False, "launches": 0, "kernels": [], "of_kernel": 0}
        args = {}
        for w in self.watched:
            mine = [(key, log) for key, log in self.logs.items() if key[2] == w.name]
            most, worst, where = 0, None, []
            for (_, pid, _), (counts, loads) in mine:
                m = int(counts.max(initial=0))
                if m > most:
                    most, worst, where = m, _load_log(w.shape, loads), list(pid)
            args[w.name] = {
                "shape": list(w.shape),
                "read": int(self.read[w.name].sum()),
                "most": most,
                "worst": worst.to_dict() if worst is not None else None,
                "worst_program": where,
                "outside": self.outside[w.name],
                "example": self.example.get(w.name),
            }
        kernels = [name for name, _ in self.launches]
        # the interpreter launches a rewritten copy of the @triton.jit function, in its module
        of_kernel = sum(1 for _, fn in self.launches if not _course_function(fn))
        return {"recorded": True, "launches": len(self.launches), "kernels": kernels,
                "of_kernel": of_kernel, "args": args}  # fmt: skip


def _load_log(shape: tuple, loads: list) -> LoadLog:
    log = LoadLog(shape)
    for flat in loads:
        log.record(flat)
    return log


def _course_function(fn) -> bool:
    return (getattr(fn, "__module__", "") or "").split(".")[0] == "course_utils"


def _hooked() -> bool:
    try:
        from triton.runtime import interpreter
    except Exception:
        return False
    return bool(getattr(interpreter, "_course_bounds_installed", False))


@contextlib.contextmanager
def recording(watched: dict):
    """Record the loads of the watched tensors ({name: tensor}) while the block launches kernels
    (in the interpreter; on a GPU, nothing: summary() says {"recorded": False})."""
    recorder = LoadRecorder(watched)
    bounds.LISTENERS.append(recorder)
    try:
        yield recorder
    finally:
        bounds.LISTENERS.remove(recorder)
