"""A tiny decoder-only GPT whose attention is swappable: naive, SDPA, the course kernel, yours.

The capstone (notebook 11) trains it on a text this module writes itself (no download): lines of
sums and reversed words from a seeded generator, read one character at a time. What the notebook
measures with it:

    train(model, data, steps)         the loss curve; same seed, same batches for every backend
    saved_tensor_bytes(fn, ...)       bytes autograd keeps for the backward pass (any device)
    peak_memory(attention, ...)       torch.cuda.max_memory_allocated of forward + backward (GPU)
    tokens_per_second(model, ...)     training throughput (GPU only)

Attention backends (harness.attention_backends: resolve_attention, attention_label, BACKENDS,
re-exported here), all (B, H, N, d) -> (B, H, N, d) with the scale 1/sqrt(d):

    "naive"   softmax(q k^T / sqrt(d)) v in torch ops: autograd keeps the N x N matrix P
    "sdpa"    torch.nn.functional.scaled_dot_product_attention (a fused kernel where one exists)
    "course"  course_utils.triton_attention.flash_attention (Triton; keeps q, k, v, out, lse)
    any callable attention(q, k, v, causal) -> out, or an autograd.Function such as notebook
    08's FlashAttentionTriton (called as Function.apply(q, k, v, causal)).
"""

from __future__ import annotations

import math
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from course_utils._validate import positive_int
from course_utils.harness.attention_backends import BACKENDS, attention_label, resolve_attention
from course_utils.references.backward import saved_tensor_bytes, saved_tensors


def _interpreter_before_triton() -> None:
    """Without a CUDA GPU the course kernel runs in Triton's interpreter, which must be switched
    on before anything imports triton; torch's optimizers may import it (torch._dynamo), so this
    module sets the switch when it is imported, as course_utils.triton_attention would."""
    if not torch.cuda.is_available() and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")


_interpreter_before_triton()

__all__ = [
    "BACKENDS",
    "CharTokenizer",
    "GPT",
    "GPTConfig",
    "attention_block",
    "attention_label",
    "get_batch",
    "make_corpus",
    "peak_memory",
    "resolve_attention",
    "saved_bytes_formula",
    "saved_tensor_bytes",
    "saved_tensors",
    "tokens_per_second",
    "train",
]

# ---------------------------------------------------------------------------------------------
# The text and its tokenizer
# ---------------------------------------------------------------------------------------------

_LETTERS = "abcdefgh"


def make_corpus(n_lines: int = 4000, seed: int = 0) -> str:
    """A deterministic training text: one task per line, sums and reversed words.

    "37+48=85" (two-digit sums) and "cab|bac" (a word, then the same letters reversed). Learnable
    in a few hundred steps by a two-layer model: the answer of each line follows from its start,
    so the loss falls well below that of guessing characters by their frequency.

    Args:
        n_lines: number of lines.  seed: of the generator (the same seed gives the same text).

    Returns:
        The text, lines joined by "\\n" (about 8 characters a line).
    """
    n_lines = positive_int(n_lines, "n_lines")
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        if rng.random() < 0.5:
            a, b = rng.randrange(10, 100), rng.randrange(10, 100)
            lines.append(f"{a}+{b}={a + b}")
        else:
            word = "".join(rng.choice(_LETTERS) for _ in range(rng.randrange(2, 6)))
            lines.append(f"{word}|{word[::-1]}")
    return "\n".join(lines) + "\n"


class CharTokenizer:
    """One token per character of the text it was built from (sorted, so the ids are stable)."""

    def __init__(self, text: str):
        if not isinstance(text, str) or not text:
            raise ValueError("CharTokenizer: text must be a non-empty string")
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        """(len(text),) int64 token ids."""
        unknown = sorted(set(text) - set(self.index))
        if unknown:
            raise ValueError(f"CharTokenizer.encode: characters not in the vocabulary: {unknown}")
        return torch.tensor([self.index[c] for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def get_batch(data: torch.Tensor, batch_size: int, context: int, generator: torch.Generator):
    """A batch of random windows of data and the next characters.

    Args:
        data: (T,) int64 token ids.  batch_size: B.  context: N.
        generator: a torch.Generator (the same state gives the same windows).

    Returns:
        x: (B, N) int64 inputs.  y: (B, N) int64 targets (x shifted by one position).
    """
    if data.ndim != 1 or data.numel() <= context + 1:
        raise ValueError(
            f"get_batch: data must be 1-D and longer than context + 1 = {context + 1} tokens, "
            f"got shape {tuple(data.shape)}"
        )
    starts = torch.randint(0, data.numel() - context - 1, (batch_size,), generator=generator)
    x = torch.stack([data[s : s + context] for s in starts.tolist()])
    y = torch.stack([data[s + 1 : s + context + 1] for s in starts.tolist()])
    return x, y


# ---------------------------------------------------------------------------------------------
# Swappable attention (the backends and resolve_attention: harness.attention_backends)
# ---------------------------------------------------------------------------------------------


def attention_block(x, w_qkv, w_out, n_heads, attention):
    """Multi-head causal self-attention of a sequence, the heads handled by `attention`.

    qkv = x w_qkv is split into q, k, v of d_model columns each; each is cut into n_heads heads of
    d = d_model / n_heads columns, attention runs on (B, H, N, d) with causal=True (it applies the
    scale 1/sqrt(d) itself), and the heads are put back side by side before w_out.

    Args:
        x: (B, N, d_model).  w_qkv: (d_model, 3 d_model).  w_out: (d_model, d_model).
        n_heads: H, dividing d_model.  attention: anything resolve_attention takes.

    Returns:
        (B, N, d_model).
    """
    attn = resolve_attention(attention)
    B, N, D = x.shape
    H = n_heads
    q, k, v = (x @ w_qkv).split(D, dim=-1)  # each (B, N, D)
    # (B, N, D) -> (B, N, H, d) -> (B, H, N, d): head h is columns h*d .. (h+1)*d
    q, k, v = (t.view(B, N, H, D // H).transpose(1, 2) for t in (q, k, v))
    out = attn(q, k, v, True)  # (B, H, N, d)
    out = out.transpose(1, 2).reshape(B, N, D)  # heads side by side again, head 0 first
    return out @ w_out


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


@dataclass
class GPTConfig:
    """The model's sizes. d_model must be a multiple of n_heads; the course kernel needs a head
    dimension d = d_model / n_heads of at least 16."""

    vocab_size: int
    n_layers: int = 2
    n_heads: int = 2
    d_model: int = 32
    context: int = 32

    def __post_init__(self):
        for name in ("vocab_size", "n_layers", "n_heads", "d_model", "context"):
            positive_int(getattr(self, name), name)
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class CausalSelfAttention(nn.Module):
    """attention_block with its weights; `block` replaces attention_block (your version)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        D = config.d_model
        self.n_heads = config.n_heads
        self.w_qkv = nn.Parameter(torch.randn(D, 3 * D) / math.sqrt(D))
        self.w_out = nn.Parameter(torch.randn(D, D) / math.sqrt(D) / math.sqrt(2 * config.n_layers))
        self.attention = "sdpa"
        self.block = attention_block

    def forward(self, x):  # (B, N, D) -> (B, N, D)
        return self.block(x, self.w_qkv, self.w_out, self.n_heads, self.attention)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        D = config.d_model
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = CausalSelfAttention(config)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A decoder-only transformer over characters, with swappable attention.

    GPT(config, attention="sdpa", block=None, seed=0): the weights depend on the seed only, so
    two models built with the same seed start equal whatever their attention.
    """

    def __init__(self, config: GPTConfig, attention="sdpa", block: Callable | None = None, seed=0):
        super().__init__()
        self.config = config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
            self.pos_emb = nn.Embedding(config.context, config.d_model)
            self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
            self.ln_f = nn.LayerNorm(config.d_model)
            self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.set_attention(attention, block)

    def set_attention(self, attention, block: Callable | None = None) -> GPT:
        """Use `attention` (see resolve_attention) in every layer; block: your attention_block."""
        resolve_attention(attention)  # a bad value fails here, not in the middle of training
        for b in self.blocks:
            b.attn.attention = attention
            b.attn.block = block or attention_block
        return self

    def forward(self, idx, targets=None):
        """idx: (B, N) int64 with N <= context. Returns logits (B, N, vocab) and the mean
        cross-entropy against targets (B, N) (None without targets)."""
        if idx.ndim != 2 or idx.shape[1] > self.config.context:
            raise ValueError(
                f"idx must be (B, N) with N <= context = {self.config.context}, got shape "
                f"{tuple(idx.shape)}"
            )
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)  # (B, N, D)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))  # (B, N, vocab)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
        return logits, loss


def train(
    model: GPT,
    data: torch.Tensor,
    steps: int,
    batch_size: int = 8,
    lr: float = 3e-3,
    seed: int = 0,
    autocast: torch.dtype | None = None,
) -> list[float]:
    """Train with AdamW on random windows of data; the loss of every step.

    The windows depend on the seed only, so two models with the same initial weights see the same
    batches: their loss curves differ only by the rounding of their attention.

    Args:
        model: a GPT.  data: (T,) int64 token ids.  steps: optimizer steps.
        batch_size: B.  lr: AdamW's learning rate.  seed: of the windows.
        autocast: None (the weights' dtype throughout) or a dtype for torch.autocast on the
            model's device, e.g. torch.bfloat16 on a GPU (weights and optimizer stay float32).

    Returns:
        [loss of step 0, ..., loss of step steps - 1] (floats).
    """
    steps = positive_int(steps, "steps")
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    model.train()
    for _ in range(steps):
        x, y = get_batch(data, batch_size, model.config.context, gen)
        with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
            _, loss = model(x.to(device), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------


def saved_bytes_formula(B: int, H: int, N: int, d: int, bytes_per_element: int):
    """Bytes autograd keeps for the backward pass of one attention call, both ways.

    naive: q, k, v and P = softmax(q k^T / sqrt(d)), all in the inputs' dtype:
        (3 N d + N^2) B H e.
    flash: q, k, v, out in the inputs' dtype and lse in float32 (4 bytes):
        4 N d B H e + 4 B H N.

    Returns:
        (naive_bytes, flash_bytes), ints.
    """
    B, H, N, d = (positive_int(v, n) for v, n in ((B, "B"), (H, "H"), (N, "N"), (d, "d")))
    e = positive_int(bytes_per_element, "bytes_per_element")
    return (3 * N * d + N * N) * B * H * e, 4 * N * d * B * H * e + 4 * B * H * N


def attention_inputs(B, H, N, d, dtype=torch.float32, device="cpu", seed=0):
    """q, k, v of shape (B, H, N, d), normal, requires_grad (so that autograd saves tensors)."""
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(B, H, N, d, generator=gen).to(device=device, dtype=dtype).requires_grad_()
        for _ in range(3)
    ]


def measured_saved_bytes(
    attention, B, H, N, d, dtype=torch.float32, causal=True, device: str | None = None
) -> int:
    """saved_tensor_bytes of one causal attention call on tensors (B, H, N, d) on `device`:
    default the GPU where there is one (the Triton kernels refuse CPU tensors there), else the
    CPU (where they run in Triton's interpreter)."""
    attn = resolve_attention(attention)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v = attention_inputs(B, H, N, d, dtype, device)
    return saved_tensor_bytes(attn, q, k, v, causal)


def _need_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"{what} measures a CUDA GPU, and this machine has none; on a CPU use "
            "saved_tensor_bytes (memory) and skip the throughput"
        )


def peak_memory(attention, B, H, N, d, dtype=torch.bfloat16, causal=True) -> int:
    """Peak bytes allocated on the GPU by one forward + backward of attention, beyond its inputs.

    torch.cuda.max_memory_allocated after a reset, minus what was allocated before the call
    (q, k, v and the gradient of out): what the attention itself needs, O(N^2) for naive (and
    the gradients dq, dk, dv, O(N) for every backend). One call first, not measured: Triton's
    autotuning allocates buffers of its own at a kernel's first launch for a shape.
    GPU only (RuntimeError without CUDA).
    """
    _need_cuda("peak_memory")
    attn = resolve_attention(attention)
    q, k, v = attention_inputs(B, H, N, d, dtype, "cuda")
    dout = torch.randn_like(q)
    attn(q, k, v, causal).backward(dout)  # warm-up: compilation and autotuning
    q.grad = k.grad = v.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = attn(q, k, v, causal)
    out.backward(dout)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out, q, k, v, dout
    torch.cuda.empty_cache()
    return int(peak)


def tokens_per_second(
    model: GPT, batch_size: int, context: int, steps: int = 10, warmup: int = 3
) -> float:
    """Training tokens per second (forward, backward, AdamW step) of model on a CUDA GPU.

    Random tokens, batch_size x context per step; the first `warmup` steps (compilation,
    autotuning) are not timed. GPU only (RuntimeError without CUDA).
    """
    _need_cuda("tokens_per_second")
    if context > model.config.context:
        raise ValueError(f"context {context} exceeds the model's context {model.config.context}")
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, model.config.vocab_size, (batch_size, context), generator=gen).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        _, loss = model(x, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return batch_size * context * steps / (time.perf_counter() - start)
