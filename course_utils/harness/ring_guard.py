"""What a rank of the learner's ring may use, and the proof that its attention came from the ring.

One mechanism, the rank guard, installed by the notebook's runner (ring_comm.run_learner_ring) in
every rank around the learner's function:

    the watch    a profile hook (sys.setprofile, and threading.setprofile for threads the rank
                 starts). It holds the reference watch (engine.watch._ReferenceCallWatch) with
                 the rank's API allowed: the comm methods, the request's wait, local_attn, and
                 what the notebook imports (zigzag_bounds, shard_sizes). It also notes the first
                 SIDE CHANNEL the learner's code opens: any torch.distributed call made by the
                 learner's code rather than through comm (all_gather_object, broadcast, send,
                 the process group's own methods), files (open, pathlib, torch.save, np.save,
                 tempfile, shutil), multiprocessing (queues, pipes, shared memory), sockets,
                 and frame or heap walking (sys._getframe, inspect, gc). Ranks are forked
                 processes, so globals are not shared between them; a queue or pipe made
                 before the fork is used through such calls, and data read from shared memory
                 by indexing is caught by the ledger or the cover once it reaches the answer.
    the ledger   every d-vector of K and V the rank HOLDS: its own shard, then each buffer it
                 received through comm (recorded when the receive is waited for). Every
                 local_attn call is recorded: each key and value row it reads must be held at
                 the time of the call, and its lse is kept with the rank's query rows it
                 covers.
    the cover    after the learner returns, the rank adds up its local_attn partials' lse per
                 query row (log sum exp): the lse of exactly the keys local_attn saw.
                 run_learner_ring compares it with the lse the rank returned: a right answer
                 whose keys local_attn did not all see was computed elsewhere.

Receive buffers start as NaN under the guard (RingComm._poison): a buffer longer than the block
that arrives keeps a NaN tail, named recv-buffer-size as gloo's abort on a shorter one is.

A verdict (in this order: a course call, a side channel, a buffer longer than its block, an
unreceived block) ends the rank with RingMistake (or ReferenceUnavailable for a course call,
which the check reports as calls-reference), raised even when the learner's code failed after
the verdict: the cause comes first.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

# What a rank's code may call in course_utils: the comm methods, the request's wait, the logged
# local attention (ring_comm's and this module's wrappers are both named local_attn), and the
# layout helpers the notebook imports.
RANK_API = (
    "isend",
    "irecv",
    "exchange",
    "wait",
    "is_completed",
    "overlap",
    "local_attn",
    "zigzag_bounds",
    "shard_sizes",
)

# Library modules whose functions, called by the learner's code, open a channel around comm.
SIDE_CHANNEL_MODULES = (
    "torch.distributed",
    "torch.multiprocessing",
    "torch.serialization",
    "multiprocessing",
    "concurrent.futures.process",
    "socket",
    "pathlib",
    "tempfile",
    "shutil",
    "numpy.lib._npyio_impl",
    "numpy.lib.npyio",
    "numpy.core.memmap",
    "numpy._core.memmap",
    "inspect",
    "gc",
)
# C functions (seen as c_call events) of the same kind, by their module.
_C_MODULES = ("_socket", "_posixshmem", "mmap", "_multiprocessing", "gc")
_C_OS = {"open", "pipe", "pipe2", "mkfifo", "memfd_create", "fork", "forkpty", "dup", "dup2"}
_C_SYS = {"_getframe", "_current_frames"}
_WRAPPERS = {"wrapper", "inner", "_fn", "wrapped", "decorated", "_wrapper"}

BYPASSES_COMM = (
    "bypasses-comm",
    "data exchanged around comm",
    "A rank may exchange data only through comm.isend / comm.irecv (or comm.exchange): they "
    "count the bytes and log the order. A collective (all_gather_object, broadcast), a file, a "
    "queue or shared memory hands a rank blocks the ring never passed it.",
)
UNRECEIVED_BLOCK = (
    "unreceived-block",
    "local attention on keys the rank never received",
    "At each step attend to the block you hold: your own shard at step 0, then the buffers "
    "filled by comm.irecv, after their wait. Keys or values from anywhere else are not the ring.",
)
OUTSIDE_LOCAL_ATTN = (
    "attention-outside-local-attn",
    "the right output, not from local_attn",
    "Your output is right but your local_attn calls did not cover it: the attention was "
    "computed some other way. Compute every pair of the plan with local_attn on the block you "
    "hold and merge those results.",
)
RECV_BUFFER_SIZE = (
    "recv-buffer-size",
    "a receive buffer of the wrong size",
    "A receive fills a buffer you allocate, so it must have the arriving block's size: the "
    "next step's block is rank (rank - step - 1) mod P's, sum(comm.sizes[that rank]) positions.",
)


class RingMistake(RuntimeError):
    """A rank broke a rule of the ring; the message names the mistake (one paragraph)."""


def mistake_text(what: str, mistake: tuple[str, str, str]) -> str:
    """what, then the mistake's title, [misconception: slug] and explanation, as checks say it."""
    slug, title, explanation = mistake
    return f"{what}\n  likely mistake: {title} [misconception: {slug}]\n  {explanation}"


def _module_of(fn) -> str:
    module = getattr(fn, "__module__", None)
    if module is None:
        owner = getattr(fn, "__self__", None)
        module = type(owner).__module__ if owner is not None else ""
    return module or ""


def _public_name(module: str, name: str) -> str:
    if module.startswith("torch.distributed"):
        module = "torch.distributed"  # dist.all_gather_object, as the learner wrote it
    return f"{module}.{name}"


class RankWatch:
    """The profile hook of one rank: the reference watch, plus the first side channel opened."""

    def __init__(self, top):
        from course_utils.checks.engine import watch

        self._frame_kind = watch._frame_kind
        self.reference = watch._ReferenceCallWatch(RANK_API)
        self.reference.top = top
        self.top = top
        self.channel: str | None = None
        self._channel_frame = None

    def __call__(self, frame, event, arg):
        if event == "call":
            self.reference(frame, event, arg)
            self._library_call(frame)
        elif event == "c_call" and self.channel is None:
            self._c_call(frame, arg)

    def _library_call(self, frame) -> None:
        if self.channel is not None:
            # a decorator's wrapper was named: the function it wraps says more
            if frame.f_back is self._channel_frame and self.channel.endswith(
                tuple("." + w for w in _WRAPPERS)
            ):
                module = frame.f_globals.get("__name__", "") or ""
                self.channel = _public_name(module, frame.f_code.co_name)
                self._channel_frame = frame
            return
        module = frame.f_globals.get("__name__", "") or ""
        if not module.startswith(SIDE_CHANNEL_MODULES) or self._frame_kind(frame) != "library":
            return
        if self._called_by_learner(frame):
            self.channel = _public_name(module, frame.f_code.co_name)
            self._channel_frame = frame

    def _called_by_learner(self, frame) -> bool:
        """The learner's code called frame's function, through side-channel modules only (a
        library that uses a file or inspect for itself is not a channel the learner opened)."""
        caller = frame.f_back
        while caller is not None and self._frame_kind(caller) in ("library", "infrastructure"):
            module = caller.f_globals.get("__name__", "") or ""
            if self._frame_kind(caller) == "library" and not module.startswith(
                SIDE_CHANNEL_MODULES
            ):
                return False
            caller = caller.f_back
        return (
            caller is not None and caller is not self.top and self._frame_kind(caller) == "learner"
        )

    def _c_call(self, frame, fn) -> None:
        if self._frame_kind(frame) != "learner":
            return
        module, name = _module_of(fn), getattr(fn, "__name__", "?")
        if (
            module in _C_MODULES
            or (module in ("_io", "io") and name == "open")  # not print's or a flush's writes
            or module.startswith("torch._C._distributed")
            or (module in ("posix", "nt", "os") and name in _C_OS)
            or (module == "sys" and name in _C_SYS)
        ):
            self.channel = f"{'os' if module in ('posix', 'nt') else module.lstrip('_')}.{name}"


class RankGuard:
    """The guard of one rank: its watch and its ledger of held K/V rows and local_attn partials.

    Args:
        comm: the rank's RingComm (its received buffers are recorded through comm.on_recv).
        q, k, v: the rank's own shard, (B, H, n, d) torch tensors.
    """

    def __init__(self, comm, q, k, v):
        self.rank, self.P = comm.rank, comm.world_size
        self.d = int(q.shape[-1])
        self.shape = tuple(q.shape)
        self.q_unit = _unit_rows(q)  # (n, B*H*d): the rank's query rows, direction only
        self.partials: list[tuple[np.ndarray, np.ndarray]] = []  # (query rows, lse (B, H, nq))
        self.unreceived: str | None = None
        self.short_block: RingMistake | None = None  # a receive buffer longer than its block
        self.calls = 0
        self.held: set[bytes] = set()  # every d-vector of K or V the rank holds
        self._hold(k)
        self._hold(v)
        comm.on_recv = self._hold

    def _hold(self, tensor) -> None:
        a = _np(tensor)
        if a is None:
            return
        if self.short_block is None and a.size and np.isnan(a).any():
            self._short(tensor, a.ravel())
        if a.ndim >= 1 and a.shape[-1] == self.d:
            self.held.update(r.tobytes() for r in a.reshape(-1, self.d))

    def _short(self, tensor, flat: np.ndarray) -> None:
        """A received buffer whose tail is still the comm's NaN poison: the block was shorter."""
        first = int(np.argmax(np.isnan(flat)))
        if not np.isnan(flat[first:]).all():
            return  # NaN inside the block itself: not a short block
        B, H, _, d = self.shape
        self.short_block = buffer_mismatch(
            self.rank,
            self.P,
            first * tensor.element_size(),
            flat.size * tensor.element_size(),
            B * H * d * tensor.element_size(),
        )

    def recorded(self, attn):
        """attn with every call checked against the ledger and its partial kept."""

        def local_attn(q, k, v, causal=False, softmax_scale=None):
            out, lse = attn(q, k, v, causal, softmax_scale)
            self.calls += 1
            self._note(q, k, v, out, lse)
            return out, lse

        return local_attn

    def _note(self, q, k, v, out, lse) -> None:
        if self.unreceived is None:
            for name, t in (("k", k), ("v", v)):
                a = _np(t)  # (B, H, nk, d)
                rows = np.moveaxis(a, 2, 0).reshape(a.shape[2], a.shape[0] * a.shape[1], self.d)
                held = self.held
                missing = [j for j, r in enumerate(rows) if any(x.tobytes() not in held for x in r)]
                if missing:
                    self.unreceived = (
                        f"rank {self.rank} of {self.P}: local_attn call {self.calls} reads {name} "
                        f"rows {missing[:6]} that are neither in the rank's own shard nor in a "
                        "block it received through comm (and waited for) before the call."
                    )
                    return
        idx = self._query_rows(q)
        if idx is not None:
            self.partials.append((idx, _np(lse)))

    def _query_rows(self, q) -> np.ndarray | None:
        """The rank's query rows q holds (matched by direction: a pre-scaled q counts)."""
        rows = _unit_rows(q)
        if rows.shape[1] != self.q_unit.shape[1] or len(self.q_unit) == 0:
            return None if len(rows) else np.zeros(0, dtype=int)
        idx = np.argmax(rows @ self.q_unit.T, axis=1) if len(rows) else np.zeros(0, dtype=int)
        if not np.allclose(rows, self.q_unit[idx], rtol=0, atol=1e-9):
            return None
        return idx

    def lse_of_partials(self) -> np.ndarray:
        """(B, H, n): log sum exp over every recorded local_attn partial of each query row, the
        lse of exactly the keys local_attn saw (no merge of outputs: the answer of notebook 02
        stays out of this module, which a graded kernel sees whole)."""
        B, H, n, _ = self.shape
        lse = np.full((B, H, n), -np.inf)
        for idx, l_p in self.partials:
            if l_p.shape == (B, H, len(idx)):
                lse[:, :, idx] = np.logaddexp(lse[:, :, idx], l_p)
        return lse

    def run(self, rank_fn, *args):
        """rank_fn(*args) under the rank's watch; raise the verdict, if any, over any error."""
        watch = RankWatch(sys._getframe())
        failure = None
        threading.setprofile(watch)
        sys.setprofile(watch)
        try:
            result = rank_fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised below unless a verdict wins
            failure = exc
        finally:
            switched_off = sys.getprofile() is not watch
            sys.setprofile(None)
            threading.setprofile(None)
        self._verdict(watch, switched_off, failure)
        if failure is not None:
            raise failure
        return result

    def _verdict(self, watch: RankWatch, switched_off: bool, failure) -> None:
        from course_utils.checks.engine.failures import DISABLES_CHECK, ReferenceUnavailable

        who = f"rank {self.rank} of {self.P}"
        if isinstance(failure, ReferenceUnavailable):  # a stub of the graded kernel names itself
            raise ReferenceUnavailable(f"{failure} (in {who})")
        if watch.reference.called:
            raise ReferenceUnavailable(f"{watch.reference.called} (in {who})")
        if watch.channel:
            raise RingMistake(mistake_text(f"{who} calls {watch.channel}.", BYPASSES_COMM))
        if switched_off:
            m = DISABLES_CHECK
            raise RingMistake(
                mistake_text(
                    f"{who} switches off the check's watch.", (m.slug, m.title, m.explanation)
                )
            )
        if self.short_block is not None:
            raise self.short_block
        if self.unreceived:
            raise RingMistake(mistake_text(self.unreceived, UNRECEIVED_BLOCK))


def outside_local_attn(r: int, P: int) -> RingMistake:
    """The verdict on rank r whose right output has keys its local_attn calls never saw."""
    return RingMistake(
        mistake_text(
            f"rank {r} of {P} returns the right output, but its local_attn calls did not see "
            "every key of it (the log sum exp of their lse is not your lse).",
            OUTSIDE_LOCAL_ATTN,
        )
    )


def buffer_mismatch(r: int, P: int, arrived: int, buffer: int, per_position: int) -> RingMistake:
    """The verdict on a receive whose buffer differs from the block that arrived (shorter: gloo's
    EnforceNotMet; longer: the NaN poison left in its tail), sizes in bytes and in positions of
    one (B, H, n, d) tensor."""

    def size(b):
        n = b / per_position
        return f"{b} bytes ({n:g} positions)" if n == int(n) else f"{b} bytes"

    return RingMistake(
        mistake_text(
            f"rank {r} of {P}: a receive buffer of {size(buffer)} got a block of {size(arrived)}.",
            RECV_BUFFER_SIZE,
        )
    )


def _np(t) -> np.ndarray | None:
    try:
        return t.detach().cpu().double().contiguous().numpy()
    except AttributeError:
        try:
            return np.asarray(t, dtype=np.float64)
        except (TypeError, ValueError):
            return None


def _unit_rows(q) -> np.ndarray:
    """(n, B*H*d): each position's query values over (B, H, d), scaled to unit length."""
    a = _np(q)
    rows = np.moveaxis(a, 2, 0).reshape(a.shape[2], a.shape[0] * a.shape[1] * a.shape[3])
    norm = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norm > 0, norm, 1.0)
