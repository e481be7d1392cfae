"""The attention backward pass: recompute P from lse instead of storing it.

Notation (FlashAttention papers): Q (Nq, d), K (Nk, d), V (Nk, dv); S = tau Q K^T with
tau = softmax_scale = 1/sqrt(d); P = softmax(S) row by row; O = P V; lse_i = log sum_j exp(S_ij).
Given dO = dL/dO, the gradients are

    dV = P^T dO,   dP = dO V^T,   dS = P o (dP - D),   D_i = sum_j P_ij dP_ij = dO_i . O_i,
    dQ = tau dS K,   dK = tau dS^T Q.

`attention_backward_reference` materializes P (the oracle). `flash_attention_backward` is the
FlashAttention-2 backward: it keeps only O and lse from the forward pass and recomputes every tile
P_ij = exp(S_ij - lse_i) on the fly. A row with lse = -inf saw no key: its P is 0, and so are its
gradients.

The torch helpers (`saved_tensor_bytes`, `naive_attention_torch`, `saved_bytes_naive_vs_fused`)
measure the memory autograd keeps for the backward pass; torch is imported inside them only, so
the package imports without it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from course_utils._validate import as_float_array, check_qkv, positive_int, softmax_scale_or_default
from course_utils.harness.attention_backends import naive_attention_torch
from course_utils.harness.constants import NEG_INF
from course_utils.references.attention import _check_scores
from course_utils.references.softmax import _finite_or_zero

__all__ = [
    "SavedBytes",
    "SavedTensor",
    "attention_backward_flops",
    "attention_backward_reference",
    "flash_attention_backward",
    "naive_attention_torch",
    "saved_bytes_naive_vs_fused",
    "saved_tensor_bytes",
    "saved_tensors",
    "softmax_backward",
]


# ---- the softmax backward ----------------------------------------------------------------------
def softmax_backward(P, dP) -> np.ndarray:
    """dS = P o (dP - D) with D_i = sum_j P_ij dP_ij: the gradient through a row-wise softmax.

    The Jacobian of p = softmax(s) is diag(p) - p p^T, so dS_j = p_j dP_j - p_j sum_k p_k dP_k.

    Args:
        P: (rows, n) softmax probabilities (each row sums to 1, or is all 0 for a row with no
            entries).  dP: (rows, n) the gradient of the loss with respect to P.

    Returns:
        dS: (rows, n) float64, the gradient with respect to the scores.
    """
    P = as_float_array(P, "P", ndim=2)
    dP = as_float_array(dP, "dP", ndim=2)
    if P.shape != dP.shape:
        raise ValueError(f"P and dP must have the same shape, got {P.shape} and {dP.shape}")
    D = (P * dP).sum(axis=1, keepdims=True)  # (rows, 1): one number per row
    return P * (dP - D)


# ---- the oracle --------------------------------------------------------------------------------
def _qkv_do(Q, K, V, dO, causal, softmax_scale):
    Q = as_float_array(Q, "Q", ndim=2)
    K = as_float_array(K, "K", ndim=2)
    V = as_float_array(V, "V", ndim=2)
    check_qkv(Q, K, V, causal)
    dO = as_float_array(dO, "dO", ndim=2)
    if dO.shape != (Q.shape[0], V.shape[1]):
        raise ValueError(
            f"dO must have the shape of O, (Nq, dv) = {(Q.shape[0], V.shape[1])}, got {dO.shape}"
        )
    return Q, K, V, dO, softmax_scale_or_default(softmax_scale, Q.shape[1])


def attention_backward_reference(
    Q, K, V, dO, causal: bool = False, softmax_scale: float | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The naive backward pass: materialize P (Nq x Nk), then four matrix products.

    dV = P^T dO, dP = dO V^T, dS = P o (dP - rowsum(P o dP)), dQ = tau dS K, dK = tau dS^T Q.

    Args:
        Q: (Nq, d) queries.  K: (Nk, d) keys.  V: (Nk, dv) values.
        dO: (Nq, dv) the gradient of the loss with respect to O = softmax(tau Q K^T) V.
        causal: query i sees keys 0..i only (needs Nq == Nk).
        softmax_scale: tau; default 1/sqrt(d).

    Returns:
        (dQ, dK, dV): (Nq, d), (Nk, d), (Nk, dv), float64. A row with no keys (Nk = 0) has
        P = 0 and contributes nothing.
    """
    Q, K, V, dO, tau = _qkv_do(Q, K, V, dO, causal, softmax_scale)
    with np.errstate(over="ignore", invalid="ignore"):
        S = tau * (Q @ K.T)  # (Nq, Nk)
    _check_scores(S)
    if causal:
        S = np.where(np.tri(len(Q), len(K), dtype=bool), S, NEG_INF)
    m = _finite_or_zero(S.max(axis=1, initial=NEG_INF))
    P = np.exp(S - m[:, None])  # (Nq, Nk), stored whole: the N^2 memory of standard autograd
    l = P.sum(axis=1, keepdims=True)
    P = np.divide(P, l, out=np.zeros_like(P), where=l > 0)
    dV = P.T @ dO  # (Nk, dv)
    dP = dO @ V.T  # (Nq, Nk)
    dS = P * (dP - (P * dP).sum(axis=1, keepdims=True))  # the softmax backward, row by row
    return tau * (dS @ K), tau * (dS.T @ Q), dV


# ---- FlashAttention-2 backward -----------------------------------------------------------------
def flash_attention_backward(
    Q,
    K,
    V,
    O,
    dO,
    lse,
    Br: int = 16,
    Bc: int = 16,
    causal: bool = False,
    softmax_scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The FlashAttention-2 backward pass: P recomputed tile by tile from lse, never stored.

    Preprocess: D_i = rowsum(dO o O)_i (one number per row). Outer loop over key/value tiles
    K_j, V_j (Bc rows; one thread block each, dK_j and dV_j accumulated on chip and written once);
    inner loop over query tiles Q_i (Br rows): recompute S_ij = tau Q_i K_j^T and
    P_ij = exp(S_ij - lse_i) (no max and no sum: lse holds both), then

        dV_j += P_ij^T dO_i,  dP_ij = dO_i V_j^T,  dS_ij = P_ij o (dP_ij - D_i),
        dQ_i += tau dS_ij K_j,  dK_j += tau dS_ij^T Q_i.

    With causal=True the tiles above the diagonal are skipped and the tiles crossing it masked.

    Args:
        Q: (Nq, d), K: (Nk, d), V: (Nk, dv); Nq may differ from Nk unless causal.
        O: (Nq, dv) the forward output.  dO: (Nq, dv) the gradient of the loss with respect to O.
        lse: (Nq,) the forward's logsumexp per row, natural log; -inf marks a row that saw no key
            (its P is 0 and its gradients are 0).
        Br, Bc: query and key tile sizes, positive ints.
        causal: query i sees keys 0..i only.  softmax_scale: tau; default 1/sqrt(d).

    Returns:
        (dQ, dK, dV): (Nq, d), (Nk, d), (Nk, dv), float64; equal to attention_backward_reference
        up to rounding.
    """
    Q, K, V, dO, tau = _qkv_do(Q, K, V, dO, causal, softmax_scale)
    O = as_float_array(O, "O", ndim=2)
    if O.shape != dO.shape:
        raise ValueError(f"O must have the shape of dO, (Nq, dv) = {dO.shape}, got {O.shape}")
    lse = as_float_array(lse, "lse", ndim=1, allow_inf=True)
    if lse.shape != (len(Q),):
        raise ValueError(f"lse must have shape (Nq,) = ({len(Q)},), got {lse.shape}")
    Br, Bc = positive_int(Br, "Br"), positive_int(Bc, "Bc")
    Nq, Nk = len(Q), len(K)

    D = (dO * O).sum(axis=1)  # (Nq,): read 2 Nq dv, write Nq; the "preprocess" kernel
    # A row that saw no key (lse = -inf) has P = 0: subtracting +inf gives exp(-inf) = 0, also
    # for its masked scores, where S - lse would be -inf - (-inf) = NaN.
    lse_safe = np.where(np.isneginf(lse), np.inf, lse)
    dQ, dK, dV = np.zeros_like(Q), np.zeros_like(K), np.zeros_like(V)
    for j in range(0, Nk, Bc):  # one thread block per key/value tile
        k_j, v_j = K[j : j + Bc], V[j : j + Bc]  # (Bc_j, d), (Bc_j, dv): read once, stay on chip
        cols = np.arange(j, j + len(k_j))
        dk_j, dv_j = np.zeros_like(k_j), np.zeros_like(v_j)  # accumulated on chip
        # causal: query rows before key j see none of this tile; start at the tile holding row j
        first_i = (j // Br) * Br if causal else 0
        for i in range(first_i, Nq, Br):
            q_i, do_i = Q[i : i + Br], dO[i : i + Br]  # (Br_i, d), (Br_i, dv)
            rows = np.arange(i, i + len(q_i))
            with np.errstate(over="ignore", invalid="ignore"):
                s_ij = tau * (q_i @ k_j.T)  # (Br_i, Bc_j): recomputed, lives on chip only
            _check_scores(s_ij)
            if causal and cols[-1] > rows[0]:  # the tile crosses the diagonal
                s_ij = np.where(cols[None, :] <= rows[:, None], s_ij, NEG_INF)
            p_ij = np.exp(s_ij - lse_safe[rows, None])  # exponent <= 0: never overflows
            dv_j += p_ij.T @ do_i
            dp_ij = do_i @ v_j.T  # (Br_i, Bc_j)
            ds_ij = p_ij * (dp_ij - D[rows, None])
            # Every K/V thread block adds into the same rows of dQ: on a GPU this += is an atomic
            # add in HBM, or dQ gets its own pass with the loops swapped (queries outside).
            dQ[i : i + Br] += tau * (ds_ij @ k_j)
            dk_j += tau * (ds_ij.T @ q_i)
        dK[j : j + Bc], dV[j : j + Bc] = dk_j, dv_j  # written once per K/V tile
    return dQ, dK, dV


# ---- FLOPs -----------------------------------------------------------------------------------
def attention_backward_flops(
    N: int, d: int, causal: bool = False, recompute: bool = True, batch: int = 1, heads: int = 1
) -> int:
    """Backward FLOPs of attention: 8N^2 d per head with P stored, 10N^2 d when S is recomputed.

    Four matrix products (dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q), 2N^2 d each;
    recomputing S = Q K^T adds a fifth, 25% more. The elementwise work is not counted, and causal
    counts exactly half, as attention_flops does for the forward.

    Args:
        N: sequence length.  d: head dimension.  causal: only keys j <= i.
        recompute: True for FlashAttention (S recomputed), False for standard autograd.
        batch, heads: multiply the per-head count.

    Returns:
        An int.
    """
    N, d = positive_int(N, "N"), positive_int(d, "d")
    batch, heads = positive_int(batch, "batch"), positive_int(heads, "heads")
    for value, name in ((causal, "causal"), (recompute, "recompute")):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    matmuls = 5 if recompute else 4
    per_head = matmuls * 2 * N * N * d
    return (per_head // 2 if causal else per_head) * batch * heads


# ---- memory kept for the backward pass (torch) -------------------------------------------------
class SavedTensor(NamedTuple):
    """One distinct tensor autograd saved for the backward pass."""

    shape: tuple[int, ...]
    dtype: str
    nbytes: int  # bytes of its storage


class SavedBytes(NamedTuple):
    """Bytes autograd keeps for the backward pass: naive attention vs the fused kernel."""

    naive: int
    fused: int
    naive_tensors: tuple[SavedTensor, ...]
    fused_tensors: tuple[SavedTensor, ...]

    @property
    def ratio(self) -> float:
        return self.naive / self.fused


def _torch():
    try:
        import torch
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "this function needs PyTorch: pip install torch (Colab has it already)"
        ) from err
    return torch


def saved_tensors(fn, *args, **kwargs) -> list[SavedTensor]:
    """The distinct tensors autograd saves while fn(*args, **kwargs) runs, in the order saved.

    Tensors are told apart by their storage: a view (k.transpose(-1, -2)) or the same tensor
    saved twice counts once, as it takes memory once. Inputs that should get gradients must have
    requires_grad=True, or autograd saves nothing.
    """
    torch = _torch()
    seen: dict[int, SavedTensor] = {}

    def pack(t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in seen:
            seen[key] = SavedTensor(tuple(t.shape), str(t.dtype), storage.nbytes())
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args, **kwargs)
    return list(seen.values())


def saved_tensor_bytes(fn, *args, **kwargs) -> int:
    """Bytes of the distinct tensors (storages) autograd keeps for the backward pass of fn."""
    return sum(t.nbytes for t in saved_tensors(fn, *args, **kwargs))


def saved_bytes_naive_vs_fused(
    N: int = 1000, d: int = 64, causal: bool = False, seed: int = 0
) -> SavedBytes:
    """What autograd keeps for the backward pass of one head, float32 on the CPU.

    naive: naive_attention_torch (keeps q, k, v and the N x N matrix P);
    fused: torch.nn.functional.scaled_dot_product_attention (keeps q, k, v, out and lse).
    With torch 2.13 on a CPU and the defaults (N = 1000, d = 64): 4,768,000 vs 1,028,000 bytes.
    Which kernel scaled_dot_product_attention picks depends on the device, dtype and inputs.

    Args:
        N: sequence length.  d: head dimension.  causal: causal mask in both.  seed: of the inputs.

    Returns:
        SavedBytes(naive, fused, naive_tensors, fused_tensors).
    """
    torch = _torch()
    import torch.nn.functional as F

    N, d = positive_int(N, "N"), positive_int(d, "d")
    gen = torch.Generator().manual_seed(seed)

    def inputs():  # (batch, heads, N, d) = (1, 1, N, d), fp32: 4 bytes per number
        return [
            torch.randn(1, 1, N, d, generator=gen, dtype=torch.float32).requires_grad_()
            for _ in range(3)
        ]

    naive = saved_tensors(naive_attention_torch, *inputs(), causal=causal)
    fused = saved_tensors(F.scaled_dot_product_attention, *inputs(), is_causal=causal)
    return SavedBytes(
        sum(t.nbytes for t in naive), sum(t.nbytes for t in fused), tuple(naive), tuple(fused)
    )
