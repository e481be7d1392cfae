"""Processes in a ring: start P ranks, pass tensors over torch.distributed, count every byte.

The plumbing of notebook 10 (ring attention), with no attention answer in it:

    zigzag_bounds(N, P)        the zig-zag layout: the sequence cut into 2P chunks, rank r holding
                               chunks r and 2P-1-r (its "front" and "back" chunk)
    SKIP, FULL, CAUSAL         what a step does with a (query chunk, key chunk) pair: 0 nothing
                               (fully masked), 1 attention with no mask, 2 with the causal mask
    shard / unshard            a (B, H, N, ...) tensor to its P zig-zag shards and back
    RingComm                   what a rank's code talks through: isend / irecv to a neighbour,
                               counting the bytes it sends and logging posts, waits, attention
    local_attention            float64 torch attention returning (out, lse): the CPU local step
    launch_ring(fn, P)         start P processes (gloo or NCCL), run fn(comm, *args), gather
    run_learner_ring(...)      the notebook's runner: the learner's rank function on P ranks,
                               plain arrays in, plain arrays out (outputs, bytes, overlap), each
                               rank under the rank guard (harness.ring_guard: what a rank
                               may use, and that its attention came from the blocks it received)

Start method. A function defined in a notebook lives in `__main__`, which the "spawn" start method
cannot pickle; "fork" copies the whole process, functions and all, so launch_ring forks by default
(Linux and Colab; macOS has fork too, though Python's default there is spawn; Windows has none).
A forked child must not have touched CUDA in the parent: for GPUs use spawn with a function of an
importable module (benchmarks/ring.py does), or torchrun.

Rendezvous: a FileStore in a fresh temporary folder (no port to pick, nothing left behind), and
gloo's TCP transport bound to the loopback interface (GLOO_SOCKET_IFNAME), which exists in a
sandbox with its own network namespace too. Every child is joined or, past its deadline, killed
by its own pid before launch_ring returns: no rank outlives the call.
"""

from __future__ import annotations

import builtins
import faulthandler
import gc
import math
import os
import pickle
import re
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing import connection as mp_connection

import numpy as np

NEG_INF = float("-inf")
SKIP, FULL, CAUSAL = 0, 1, 2  # a chunk pair: fully masked, no mask, the causal mask (the diagonal)


# ---------------------------------------------------------------------------------------------
# The zig-zag layout
# ---------------------------------------------------------------------------------------------


def zigzag_bounds(N: int, P: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The zig-zag layout: rank r holds chunk r (front) and chunk 2P-1-r (back) of 2P chunks.

    The N positions are cut into 2P contiguous chunks whose sizes differ by at most one (the
    first N mod 2P chunks get the extra position), so N need not divide by P or by 2P; chunks
    may be empty when N < 2P. Under a causal mask chunk c costs about c units of work, so the
    pair (r, 2P-1-r) costs the same for every rank: the load is balanced.

    Returns:
        bounds[r] = ((front_start, front_stop), (back_start, back_stop)), half-open ranges.
    """
    if isinstance(N, bool) or not isinstance(N, int) or N < 0:
        raise ValueError(f"N must be a non-negative int (the sequence length), got {N!r}")
    if isinstance(P, bool) or not isinstance(P, int) or P < 1:
        raise ValueError(f"P must be a positive int (the number of ranks), got {P!r}")
    base, extra = divmod(N, 2 * P)
    edges = [0]
    for c in range(2 * P):
        edges.append(edges[-1] + base + (1 if c < extra else 0))
    return [((edges[r], edges[r + 1]), (edges[2 * P - 1 - r], edges[2 * P - r])) for r in range(P)]


def shard_sizes(N: int, P: int) -> list[tuple[int, int]]:
    """(front, back) chunk lengths of each rank's shard under zigzag_bounds(N, P)."""
    return [(f1 - f0, b1 - b0) for (f0, f1), (b0, b1) in zigzag_bounds(N, P)]


def shard(x, P: int, axis: int = 2) -> list:
    """The P zig-zag shards of x along `axis` (positions): rank r gets cat(chunk r, chunk 2P-1-r).

    Works on NumPy arrays and torch tensors of shape (B, H, N, ...) (axis 2) or any other axis.
    """
    N = x.shape[axis]
    out = []
    for (f0, f1), (b0, b1) in zigzag_bounds(N, P):
        front = _take(x, f0, f1, axis)
        back = _take(x, b0, b1, axis)
        out.append(_cat([front, back], axis))
    return out


def unshard(parts: list, axis: int = 2):
    """The inverse of shard: the P shards put back in sequence order along `axis`."""
    P = len(parts)
    sizes = [p.shape[axis] for p in parts]
    N = sum(sizes)
    chunks = [None] * (2 * P)
    for r, (front, back) in enumerate(shard_sizes(N, P)):
        if front + back != sizes[r]:
            raise ValueError(
                f"parts[{r}] has {sizes[r]} positions along axis {axis}; the zig-zag layout of "
                f"N = {N} over P = {P} gives rank {r} {front + back}"
            )
        chunks[r] = _take(parts[r], 0, front, axis)
        chunks[2 * P - 1 - r] = _take(parts[r], front, front + back, axis)
    return _cat(chunks, axis)


def _take(x, start: int, stop: int, axis: int):
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, stop)
    return x[tuple(index)]


def _cat(parts: list, axis: int):
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts, axis=axis)
    import torch

    return torch.cat(parts, dim=axis)


# ---------------------------------------------------------------------------------------------
# What a rank talks through
# ---------------------------------------------------------------------------------------------


class _Request:
    """A posted transfer; wait() blocks until it is done (and is logged)."""

    def __init__(self, comm: RingComm, work, kind: str, ident: int, tensor=None):
        self._comm, self._work, self.kind, self.ident = comm, work, kind, ident
        self._tensor = tensor
        self._done = False

    def wait(self) -> None:
        if not self._done:
            if self._work is not None:
                self._work.wait()
            self._done = True
            self._comm.events.append(("wait", self.kind, self.ident))
            if self.kind == "recv" and self._comm.on_recv is not None:
                self._comm.on_recv(self._tensor)  # the block is the rank's now

    def is_completed(self) -> bool:
        return self._done or (self._work is not None and self._work.is_completed())


@dataclass
class RingComm:
    """One rank's view of the ring: who it is, the shard sizes, and point-to-point transfers.

    rank, world_size: this rank and P.  sizes[r] = (front, back): the chunk lengths of rank r's
    shard (zig-zag layout).  isend(tensor, dst) / irecv(tensor, src) post a transfer and return a
    request with wait(); both return at once, so computing between the post and the wait
    overlaps the transfer with the compute. bytes_sent counts tensor.numel() * element_size()
    of every isend; events logs ("send"|"recv", id), ("wait", kind, id) and ("attn",) in order.
    """

    rank: int
    world_size: int
    sizes: list
    group: object = None  # the torch.distributed group; None: the default one
    bytes_sent: int = 0
    events: list = field(default_factory=list)
    on_recv: object = None  # called with each received tensor when its wait returns
    _ids: int = 0

    def _post(self, kind: str, tensor, peer: int):
        import torch
        import torch.distributed as dist

        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{kind}: expected a torch.Tensor, got {type(tensor).__name__}")
        if isinstance(peer, bool) or not isinstance(peer, int | np.integer):
            raise TypeError(f"{kind}: the peer rank must be an int, got {peer!r}")
        peer = int(peer)
        if not 0 <= peer < self.world_size or peer == self.rank:
            raise ValueError(
                f"{kind}: peer rank {peer} is not another rank of 0..{self.world_size - 1} "
                f"(this is rank {self.rank})"
            )
        if not tensor.is_contiguous():
            raise ValueError(f"{kind}: the tensor must be contiguous (call .contiguous() first)")
        self._ids += 1
        self.events.append((kind, self._ids))
        if kind == "send":
            self.bytes_sent += tensor.numel() * tensor.element_size()
            work = dist.isend(tensor, peer, group=self.group)
        else:
            self._poison(tensor)
            work = dist.irecv(tensor, peer, group=self.group)
        return _Request(self, work, kind, self._ids, tensor)

    def _poison(self, tensor) -> None:
        """Under the rank guard, a receive buffer starts as NaN: what the arriving block does not
        fill stays NaN (gloo fills a buffer longer than the message only in part, silently)."""
        if self.on_recv is not None and tensor.is_floating_point():
            tensor.fill_(float("nan"))

    def isend(self, tensor, dst: int) -> _Request:
        """Post the send of `tensor` (contiguous) to rank dst; returns at once."""
        return self._post("send", tensor, dst)

    def irecv(self, tensor, src: int) -> _Request:
        """Post the receive into `tensor` (contiguous, preallocated) from rank src."""
        return self._post("recv", tensor, src)

    def exchange(self, send: list, dst: int, recv: list, src: int) -> list:
        """Post the sends of `send` to dst and the receives into `recv` from src as ONE batch
        (torch.distributed.batch_isend_irecv): NCCL then runs them together, where separate
        isend / irecv on one pair of ranks could wait for each other. Returns the requests."""
        import torch.distributed as dist

        for t in (*send, *recv):
            if not t.is_contiguous():
                raise ValueError("exchange: every tensor must be contiguous")
        ops, reqs = [], []
        for kind, tensors, peer, op in (
            ("send", send, dst, dist.isend),
            ("recv", recv, src, dist.irecv),
        ):
            for t in tensors:
                self._ids += 1
                self.events.append((kind, self._ids))
                if kind == "send":
                    self.bytes_sent += t.numel() * t.element_size()
                else:
                    self._poison(t)
                ops.append(dist.P2POp(op, t, int(peer), group=self.group))
                reqs.append((kind, self._ids, t))
        works = dist.batch_isend_irecv(ops) if ops else []
        return [_Request(self, w, *req) for w, req in zip(works, reqs, strict=True)]

    def watched(self, attn):
        """attn with every call logged as ("attn",): the overlap measurement's clock."""

        def local_attn(*args, **kwargs):  # the name the rank watch allows (ring_guard.RANK_API)
            self.events.append(("attn",))
            return attn(*args, **kwargs)

        local_attn.__name__ = getattr(attn, "__name__", "local_attn")
        return local_attn

    def overlap(self) -> float:
        """The fraction of this rank's receives with a local attention call between post and wait.

        1.0 when the ring is overlapped (or when nothing is received, P = 1); a receive waited
        for before any compute, or posted after it, counts as exposed.
        """
        posted, hidden, total = {}, 0, 0
        for k, event in enumerate(self.events):
            if event[0] == "recv":
                posted[event[1]] = k
            elif event[0] == "wait" and event[1] == "recv":
                start = posted.pop(event[2], None)
                if start is None:
                    continue
                total += 1
                hidden += any(e[0] == "attn" for e in self.events[start:k])
        total += len(posted)  # never waited for: not hidden either
        return 1.0 if total == 0 else hidden / total


# ---------------------------------------------------------------------------------------------
# The local step on CPU
# ---------------------------------------------------------------------------------------------


def local_attention(q, k, v, causal: bool = False, softmax_scale: float | None = None):
    """Attention of one block, float64 torch: (out, lse), the local step of a ring on CPU.

    out = softmax(s q k^T [+ causal mask]) v, lse_i = log sum_j exp(s q_i.k_j) (natural log);
    a query with no visible key gets out = 0 and lse = -inf. Same signature and layout as
    course_utils.triton_attention.flash_attention_fwd, which takes its place on a GPU.

    Args:
        q: (B, H, Nq, d).  k, v: (B, H, Nk, d).  causal: query i sees keys 0..i (Nq == Nk).
        softmax_scale: s; default 1/sqrt(d).

    Returns:
        out: (B, H, Nq, d) float64.  lse: (B, H, Nq) float64.
    """
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4:
            raise ValueError(f"{name} must be a 4-D torch tensor (B, H, N, d), got {_shape(t)}")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"q (B, H, Nq, d) and k, v (B, H, Nk, d) do not fit: {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError(f"causal needs Nq == Nk, got {q.shape[2]} and {k.shape[2]}")
    scale = 1.0 / math.sqrt(q.shape[3]) if softmax_scale is None else float(softmax_scale)
    q64, k64, v64 = q.double(), k.double(), v.double()
    s = scale * (q64 @ k64.transpose(-1, -2))  # (B, H, Nq, Nk)
    if causal:
        keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, NEG_INF)
    lse = torch.logsumexp(s, dim=-1) if s.shape[-1] else s.new_full(s.shape[:-1], NEG_INF)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(s - safe[..., None])  # exp(-inf) = 0: a row with no key stays 0
    return p @ v64, lse


def _shape(t) -> str:
    shape = getattr(t, "shape", None)
    return f"shape {tuple(shape)}" if shape is not None else type(t).__name__


# ---------------------------------------------------------------------------------------------
# Starting the ranks
# ---------------------------------------------------------------------------------------------


class RingError(RuntimeError):
    """A rank of the ring failed (its exception, or a deadline), named by rank."""


def _loopback() -> str:
    return "lo0" if sys.platform == "darwin" else "lo"


def _child(fn, rank, P, backend, store_path, result_path, args, sizes, timeout_s):
    """One rank: join the group through the FileStore, run fn(comm, *args), save the result."""
    # A forked Jupyter kernel: its objects (ZeroMQ sockets among them) are shared with the
    # parent. None may be collected here, and nothing may go through the kernel's streams, which
    # write over ZeroMQ: the rank writes to plain file descriptors instead.
    gc.freeze()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", _loopback())
    sys.setprofile(None)  # the parent's check watch would only slow the rank down
    err_fd = os.open(result_path + ".stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(err_fd, 2)  # C++ logs of gloo or NCCL: kept for an error message, off the notebook
    os.close(err_fd)
    if faulthandler.is_enabled():  # its file is the parent's stderr: gloo's abort would show there
        faulthandler.enable(file=2)
    sys.stdout = open(os.dup(1), "w", buffering=1)  # noqa: SIM115 - lives as long as the rank
    sys.stderr = open(os.dup(2), "w", buffering=1)  # noqa: SIM115
    status = "ok"
    failed_at = None  # when fn raised: the earliest failure is the cause, the others its echoes
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # P ranks share the machine's cores
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        store = dist.FileStore(store_path, P)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=P, timeout=timedelta(seconds=timeout_s)
        )
        try:
            # Gloo can let a rank leave init_process_group while a peer is still connecting to
            # it; a rank that then ends at once closes sockets the peer needs. After a barrier
            # every rank has joined. None after fn: a rank that ends while its neighbour still
            # waits for it (a missing send) should fail that neighbour at once, not at the
            # deadline.
            ids = [torch.cuda.current_device()] if backend == "nccl" else None
            dist.barrier(device_ids=ids)
            result = fn(RingComm(rank, P, list(sizes or [])), *args)
        except BaseException:
            failed_at = time.monotonic()  # before destroy closes the sockets the peers still use
            raise
        finally:
            dist.destroy_process_group()
        payload = (status, _to_cpu(result))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
        status = "raised"
        when = time.monotonic() if failed_at is None else failed_at  # system-wide clock on Linux
        payload = (status, (type(exc).__name__, str(exc), traceback.format_exc(), when))
    # A failure goes to its own file: the parent polls for it without unpickling results.
    path = result_path if status == "ok" else result_path + ".err"
    with open(path + ".tmp", "wb") as fh:
        pickle.dump(payload, fh)
    os.replace(path + ".tmp", path)


def _to_cpu(value):
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, tuple | list):
        return type(value)(_to_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


_BUILTIN_ERRORS = {
    name: obj
    for name, obj in vars(builtins).items()
    if isinstance(obj, type) and issubclass(obj, Exception)
}


def launch_ring(
    fn,
    P: int,
    *args_per_rank,
    sizes: list | None = None,
    backend: str = "gloo",
    start_method: str = "fork",
    timeout_s: float = 60.0,
) -> list:
    """Run fn(comm, *args_per_rank[i][rank]) on P processes joined in one group; gather results.

    Args:
        fn: called in each rank as fn(comm, *args) with comm a RingComm; with "fork" it may be
            defined in a notebook, with "spawn" it must be importable (pickled by name).
        P: the number of ranks, 1 <= P <= 64.
        args_per_rank: each a list of P values; rank r gets element r of each.
        sizes: the (front, back) chunk lengths of every rank, handed to each RingComm.
        backend: "gloo" (CPU, any laptop) or "nccl" (one GPU per rank: rank % device_count).
        start_method: "fork" (default: notebook functions work) or "spawn".
        timeout_s: each collective's timeout, and the deadline of the whole run (plus start-up).

    Returns:
        [fn's result on rank 0, ..., rank P-1], tensors moved to the CPU.

    Raises:
        RingError (or the rank's own exception type when it is a builtin one, NotImplementedError
        included) naming the rank that failed first: its peers' echoes of that failure (a
        connection closed under them) are not reported. The other ranks get 3 s to report,
        then are killed.
    """
    import multiprocessing as mp

    if isinstance(P, bool) or not isinstance(P, int) or not 1 <= P <= 64:
        raise ValueError(f"P must be an int in 1..64 (the number of ranks), got {P!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    for i, a in enumerate(args_per_rank):
        if not isinstance(a, list | tuple) or len(a) != P:
            raise ValueError(f"args_per_rank[{i}] must be a list of P = {P} values, one per rank")
    ctx = mp.get_context(start_method)
    with tempfile.TemporaryDirectory(prefix="ring-") as tmp:
        store = os.path.join(tmp, "store")
        paths = [os.path.join(tmp, f"rank{r}.pkl") for r in range(P)]
        procs = []
        for r in range(P):
            args = tuple(a[r] for a in args_per_rank)
            p = ctx.Process(
                target=_child,
                args=(fn, r, P, backend, store, paths[r], args, sizes, timeout_s),
                daemon=True,
            )
            p.start()
            procs.append(p)
        deadline = time.monotonic() + timeout_s + 15.0  # start-up, then the collectives
        failing = False
        try:
            while True:
                alive = [p for p in procs if p.exitcode is None]
                now = time.monotonic()
                if not alive or now >= deadline:
                    break
                if not failing and _failed(paths, procs):
                    # One rank failed: its peers fail soon after (a closed socket, a dead
                    # collective). They get a moment to record how, then are killed.
                    failing = True
                    deadline = min(deadline, now + _GRACE_S)
                mp_connection.wait([p.sentinel for p in alive], timeout=min(0.1, deadline - now))
        finally:
            for p in procs:  # only the children started above, each by its own pid
                if p.is_alive():
                    p.kill()
                    p.join(5.0)
        mismatch = _buffer_mismatch(paths)
        if mismatch is not None:
            raise mismatch
        cause = _root_error(paths)
        if cause is not None:
            raise cause
        results = []
        for r, path in enumerate(paths):
            if not os.path.exists(path):
                tail = _tail(path + ".stderr")
                code = procs[r].exitcode
                why = "passed the deadline" if code in (None, -9) else f"exit code {code}"
                raise RingError(f"rank {r} of {P} returned nothing ({why}).{tail}")
            with open(path, "rb") as fh:
                _, payload = pickle.load(fh)  # written by our own child process
            results.append(payload)
    return results


class RingBufferMismatch(RingError):
    """A receive buffer of rank `rank` smaller than the block that arrived (gloo aborts)."""

    def __init__(self, rank: int, P: int, arrived: int, buffer: int):
        super().__init__(
            f"rank {rank} of {P}: a receive buffer of {buffer} bytes got a block of {arrived} bytes"
        )
        self.rank, self.arrived, self.buffer = rank, arrived, buffer


# gloo's EnforceNotMet when a message is longer than the buffer posted for it: "256 vs 192."
_GLOO_SIZES = re.compile(r"op\.preamble\.length <= op\.nbytes\. (\d+) vs (\d+)")


def _buffer_mismatch(paths) -> RingBufferMismatch | None:
    """The first rank whose stderr shows gloo's size mismatch, as one RingBufferMismatch."""
    for r, path in enumerate(paths):
        try:
            with open(path + ".stderr", errors="replace") as fh:
                found = _GLOO_SIZES.search(fh.read())
        except OSError:
            continue
        if found:
            return RingBufferMismatch(r, len(paths), int(found.group(1)), int(found.group(2)))
    return None


_GRACE_S = 3.0  # after the first failure, how long the other ranks have to report theirs
_TOGETHER_S = 0.5  # failures this close in time are one failure, named by the lowest rank

# What a rank reports when a peer died under it: an echo of another rank's failure, not a cause.
_ECHOES = ("closed by peer", "remote worker crash", "reset by peer", "Connection reset")


def _failed(paths, procs) -> bool:
    exited = any(p.exitcode not in (None, 0) for p in procs)
    return exited or any(os.path.exists(path + ".err") for path in paths)


def _errors(paths) -> list[tuple[int, tuple]]:
    """(rank, (name, message, traceback, when)) of each rank that recorded an exception."""
    found = []
    for r, path in enumerate(paths):
        if os.path.exists(path + ".err"):
            with open(path + ".err", "rb") as fh:
                _, payload = pickle.load(fh)  # written by our own child process
            found.append((r, payload))
    return found


def _root_error(paths) -> Exception | None:
    """The exception of the rank that failed first, as the other ranks see it.

    When one rank raises, its neighbours fail too ("connection closed by peer", a timed-out
    receive), often in less time than the first rank needs to report. The cause is a failure
    that is not such an echo, and the earliest (each rank stamps the moment its fn raised,
    before its sockets closed); ranks that failed together, as when every rank runs the same
    broken line, are reported by the lowest rank. A rule the rank guard found broken is never an
    echo: the lowest rank that broke one is reported.
    """
    found = _errors(paths)
    if not found:
        return None
    verdicts = [e for e in found if e[1][0] in _VERDICTS]  # a broken rule is the cause
    if verdicts:  # no echo: the lowest rank's, whichever finished first (the same every run)
        r, payload = min(verdicts)
        return _rank_error(r, len(paths), payload)
    causes = [e for e in found if not _is_echo(e[1][1])] or found
    first = min(e[1][3] for e in causes)
    r, payload = min(e for e in causes if e[1][3] <= first + _TOGETHER_S)
    return _rank_error(r, len(paths), payload)


def _is_echo(message: str) -> bool:
    return any(e in message for e in _ECHOES)


# The rank guard's verdicts (harness.ring_guard): they name their rank, and are the cause.
_VERDICTS = ("RingMistake", "ReferenceUnavailable")


def _verdict(name: str, message: str) -> Exception:
    from course_utils.checks.engine.failures import ReferenceUnavailable
    from course_utils.harness.ring_guard import RingMistake

    return (RingMistake if name == "RingMistake" else ReferenceUnavailable)(message)


def _rank_error(r: int, P: int, payload) -> Exception:
    name, message = payload[0], payload[1]
    cls = _BUILTIN_ERRORS.get(name)
    text = f"rank {r} of {P}: {name}: {message}"
    if "Timed out" in message or "timed out" in message or "Timeout" in message:
        text += (
            " (a transfer never completed: a deadlock, as when a rank waits for a send before "
            "its neighbour has posted the matching receive; post all four transfers, then wait)"
        )
    elif "gloo" in message and ("reset" in message or "Read error" in message):
        text += (
            " (a transfer failed: usually a receive whose buffer size differs from the block sent "
            "to it, or a peer that sends less or more than its neighbour receives; the block that "
            "arrives is rank src's, of sum(comm.sizes[src]) positions)"
        )
    if cls is NotImplementedError:
        return NotImplementedError(message)
    if name in _VERDICTS:
        return _verdict(name, message)
    if cls is not None:
        try:
            return cls(text)
        except Exception:  # an exception type that takes other arguments
            pass
    return RingError(text)


def _tail(path: str, n: int = 800) -> str:
    try:
        with open(path, errors="replace") as fh:
            text = fh.read().strip()
    except OSError:
        return ""
    return f" Its stderr ends: {text[-n:]}" if text else ""


# ---------------------------------------------------------------------------------------------
# The notebook's runner: plain arrays in, plain arrays out
# ---------------------------------------------------------------------------------------------


def _run_rank(comm, q, k, v, causal, softmax_scale, rank_fn):
    """One rank of the learner's ring, under the rank guard (course_utils.harness.ring_guard)."""
    from course_utils.harness.ring_guard import RankGuard

    guard = RankGuard(comm, q, k, v)
    attn = comm.watched(guard.recorded(local_attention))
    result = guard.run(rank_fn, q, k, v, causal, softmax_scale, comm, attn)
    if not isinstance(result, tuple | list) or len(result) != 2:
        got = type(result).__name__
        raise TypeError(f"the rank function must return the pair (out, lse), got {got}")
    out, lse = result
    return out, lse, comm.bytes_sent, comm.overlap(), guard.lse_of_partials()


def run_learner_ring(rank_fn, q, k, v, causal: bool, P: int, softmax_scale: float | None = None):
    """Run rank_fn on P gloo ranks over the zig-zag shards of q, k, v; gather plain arrays.

    Each rank r calls rank_fn(q_r, k_r, v_r, causal, softmax_scale, comm, local_attn) with its
    shard (float64 torch tensors, (B, H, n_r, d)), a RingComm and local_attention (logged, so
    that the overlap can be measured). The runner puts the ranks' outputs back in sequence order.

    Each rank runs under course_utils.harness.ring_guard's RankGuard. Raises ReferenceUnavailable (a
    course function called inside a rank) or RingMistake (data around comm, attention on a block
    the rank does not hold, a right output its local_attn results do not give, a receive buffer
    smaller than the block sent), each naming its rank and the mistake.

    Args:
        q, k, v: (B, H, N, d) float arrays of the whole sequence.  causal: bool.
        P: ranks, 1..8.  softmax_scale: default 1/sqrt(d).

    Returns:
        out (B, H, N, d), lse (B, H, N): float64, sequence order.  bytes_sent: (P,) float64,
        what each rank passed to isend.  overlapped: (P,) float64, each rank's share of receives
        hidden behind a local attention call (RingComm.overlap).
    """
    import torch

    arrays = []
    for name, a in (("q", q), ("k", k), ("v", v)):
        a = np.asarray(a, dtype=np.float64)
        if a.ndim != 4:
            raise ValueError(f"{name} must have shape (B, H, N, d), got {a.shape}")
        arrays.append(a)
    q, k, v = arrays
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v must have one shape, got {q.shape}, {k.shape}, {v.shape}")
    if isinstance(P, bool) or not isinstance(P, int | np.integer) or not 1 <= P <= 8:
        raise ValueError(f"P must be an int in 1..8, got {P!r}")
    P = int(P)
    scale = 1.0 / math.sqrt(q.shape[3]) if softmax_scale is None else float(softmax_scale)
    sizes = shard_sizes(q.shape[2], P)
    shards = [
        [torch.tensor(np.ascontiguousarray(s)) for s in shard(a, P)] for a in (q, k, v)
    ]  # copies: read-only inputs must not reach torch.from_numpy
    try:
        results = launch_ring(
            _run_rank,
            P,
            *shards,
            [bool(causal)] * P,
            [scale] * P,
            [rank_fn] * P,
            sizes=sizes,
            timeout_s=15.0,  # a few ms per transfer here: 15 s is a deadlock
        )
    except RingBufferMismatch as exc:
        from course_utils.harness.ring_guard import buffer_mismatch

        per_position = q.shape[0] * q.shape[1] * q.shape[3] * 8  # one float64 (B, H, ., d) row
        raise buffer_mismatch(exc.rank, P, exc.arrived, exc.buffer, per_position) from None
    full = [shard(a, P) for a in _full_attention(q, k, v, bool(causal), scale)]
    outs, lses = [], []
    for r, (out, lse, _, _, lse_seen) in enumerate(results):
        n = sum(sizes[r])
        want = (q.shape[0], q.shape[1], n)
        out = _as_array(out, f"out of rank {r}")
        lse = _as_array(lse, f"lse of rank {r}")
        if out.shape != want + (q.shape[3],) or lse.shape != want:
            raise ValueError(
                f"rank {r} returned out of shape {out.shape} and lse of shape {lse.shape}; "
                f"expected {want + (q.shape[3],)} and {want} (its shard)"
            )
        right = _close(out, full[0][r]) and _close(lse, full[1][r])
        if right and not _close(lse_seen, lse):
            from course_utils.harness.ring_guard import outside_local_attn

            raise outside_local_attn(r, P)
        outs.append(out)
        lses.append(lse)
    bytes_sent = np.array([float(r[2]) for r in results])
    overlapped = np.array([float(r[3]) for r in results])
    return unshard(outs), unshard(lses), bytes_sent, overlapped


def _full_attention(q, k, v, causal: bool, scale: float):
    """out (B, H, N, d), lse (B, H, N) of the whole sequence, float64 NumPy."""
    import torch

    out, lse = local_attention(*(torch.from_numpy(a) for a in (q, k, v)), causal, scale)
    return out.numpy(), lse.numpy()


def _close(a, b, tol: float = 1e-9) -> bool:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return False
    same_inf = np.isinf(a) & (a == b)
    with np.errstate(invalid="ignore"):
        near = np.abs(a - b) <= tol * (1 + np.abs(b))
    return bool((same_inf | near).all())


def _as_array(x, what: str) -> np.ndarray:
    try:
        import torch

        if isinstance(x, torch.Tensor):
            return x.detach().cpu().double().numpy()
    except ImportError:  # pragma: no cover
        pass
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{what} is a {type(x).__name__}, expected a tensor") from None
