"""references.gpt: the capstone's small GPT, its swappable attention and its measurements."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from course_utils.harness import attention_backends
from course_utils.references import gpt

# The course kernel runs where Triton does: Triton's interpreter on CPU tensors without a GPU,
# compiled on CUDA tensors with one, where tl.dot on float32 rounds its inputs to TF32.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LOSS_TOL = 1e-5 if DEVICE == "cpu" else 2e-3  # one loss, course kernel against SDPA
CURVE_TOL = 1e-4 if DEVICE == "cpu" else 2e-2  # six training steps apart


@pytest.fixture(scope="module")
def corpus():
    text = gpt.make_corpus(600)
    tok = gpt.CharTokenizer(text)
    return text, tok, tok.encode(text)


def _config(tok, **kw):
    sizes = dict(n_layers=2, n_heads=2, d_model=32, context=16)
    sizes.update(kw)
    return gpt.GPTConfig(vocab_size=tok.vocab_size, **sizes)


def test_corpus_is_deterministic_and_learnable_text():
    a, b = gpt.make_corpus(200, seed=3), gpt.make_corpus(200, seed=3)
    assert a == b and a != gpt.make_corpus(200, seed=4)
    lines = a.splitlines()
    assert len(lines) == 200
    for line in lines:
        if "+" in line:
            left, right = line.split("=")
            x, y = left.split("+")
            assert int(x) + int(y) == int(right)
        else:
            word, rev = line.split("|")
            assert rev == word[::-1]


def test_tokenizer_round_trip_and_errors(corpus):
    text, tok, data = corpus
    assert tok.decode(tok.encode(text[:50])) == text[:50]
    assert data.dtype == torch.long and data.max() < tok.vocab_size
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.encode("Z")
    with pytest.raises(ValueError, match="non-empty"):
        gpt.CharTokenizer("")


def test_model_shapes_and_initial_loss(corpus):
    _, tok, data = corpus
    config = _config(tok)
    model = gpt.GPT(config)
    x, y = gpt.get_batch(data, 3, config.context, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (3, config.context)
    assert torch.equal(x[:, 1:], y[:, :-1])
    logits, loss = model(x, y)
    assert logits.shape == (3, config.context, tok.vocab_size)
    assert abs(loss.item() - math.log(tok.vocab_size)) < 1.0  # near uniform at the start
    logits, none = model(x[:, :5])
    assert logits.shape == (3, 5, tok.vocab_size) and none is None


@pytest.mark.parametrize("backend", ["naive", "course"])
def test_every_backend_gives_the_same_loss_and_gradients(corpus, backend):
    _, tok, data = corpus
    config = _config(tok)
    x, y = gpt.get_batch(data, 2, config.context, torch.Generator().manual_seed(1))
    x, y = x.to(DEVICE), y.to(DEVICE)
    ref = gpt.GPT(config, "sdpa", seed=5).to(DEVICE)
    other = gpt.GPT(config, backend, seed=5).to(DEVICE)
    loss_ref, loss = ref(x, y)[1], other(x, y)[1]
    assert abs(loss.item() - loss_ref.item()) < LOSS_TOL
    loss_ref.backward()
    loss.backward()
    for (name, p), q in zip(ref.named_parameters(), other.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=100 * LOSS_TOL, atol=LOSS_TOL), name


def test_a_learner_function_and_an_autograd_function_plug_in(corpus):
    _, tok, data = corpus
    config = _config(tok)
    x, y = gpt.get_batch(data, 2, config.context, torch.Generator().manual_seed(2))
    calls = []

    def mine(q, k, v, causal):
        calls.append((tuple(q.shape), causal))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    class Mine(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal=False, softmax_scale=None):
            ctx.save_for_backward(q, k, v)
            ctx.causal = causal
            return attention_backends.naive_attention(q, k, v, causal).detach()

        @staticmethod
        def backward(ctx, dout):
            q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors)
            with torch.enable_grad():
                out = attention_backends.naive_attention(q, k, v, ctx.causal)
            return (*torch.autograd.grad(out, (q, k, v), dout), None, None)

    ref = gpt.GPT(config, "sdpa")(x, y)[1].item()
    assert abs(gpt.GPT(config, mine)(x, y)[1].item() - ref) < 1e-5
    assert calls == [((2, 2, config.context, 16), True)] * config.n_layers
    model = gpt.GPT(config, Mine)
    loss = model(x, y)[1]
    loss.backward()
    assert abs(loss.item() - ref) < 1e-5
    assert gpt.attention_label(Mine) == "Mine" and gpt.attention_label("sdpa") == "sdpa"


def test_bad_attention_and_config_are_named():
    with pytest.raises(ValueError, match="attention must be one of.*'flash'"):
        gpt.resolve_attention("flash")
    with pytest.raises(TypeError, match="attention must be.*got int"):
        gpt.resolve_attention(3)
    with pytest.raises(ValueError, match="d_model .30. must be a multiple of n_heads .4."):
        gpt.GPTConfig(vocab_size=10, n_heads=4, d_model=30)
    with pytest.raises(ValueError, match="n_layers"):
        gpt.GPTConfig(vocab_size=10, n_layers=0)
    config = gpt.GPTConfig(vocab_size=10, context=8)
    with pytest.raises(ValueError, match="attention must be one of"):
        gpt.GPT(config, attention="slow")
    with pytest.raises(ValueError, match="N <= context = 8"):
        gpt.GPT(config)(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="longer than context"):
        gpt.get_batch(torch.zeros(5, dtype=torch.long), 2, 8, torch.Generator())


def test_training_lowers_the_loss_and_repeats_exactly(corpus):
    _, tok, data = corpus
    config = _config(tok)
    a = gpt.train(gpt.GPT(config, "sdpa"), data, 25, batch_size=8)
    b = gpt.train(gpt.GPT(config, "sdpa"), data, 25, batch_size=8)
    assert a == b  # same seed, same batches, same weights: the same curve
    assert np.mean(a[-5:]) < a[0] - 0.3  # from ln(vocab) towards the text's entropy


def test_learning_curves_of_kernel_and_sdpa_coincide(corpus):
    _, tok, data = corpus
    config = _config(tok)
    sdpa = np.array(gpt.train(gpt.GPT(config, "sdpa").to(DEVICE), data, 6, batch_size=4))
    course = np.array(gpt.train(gpt.GPT(config, "course").to(DEVICE), data, 6, batch_size=4))
    assert np.abs(sdpa - course).max() < CURVE_TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_saved_bytes_formula_matches_the_hooks_for_naive(dtype):
    e = torch.empty((), dtype=dtype).element_size()
    for B, H, N, d in [(1, 1, 8, 16), (2, 3, 50, 32), (1, 2, 128, 16)]:
        naive, _ = gpt.saved_bytes_formula(B, H, N, d, e)
        assert gpt.measured_saved_bytes("naive", B, H, N, d, dtype) == naive


def test_saved_bytes_formula_matches_the_hooks_for_the_course_kernel():
    for B, H, N, d in [(1, 1, 16, 16), (1, 2, 40, 32)]:
        _, flash = gpt.saved_bytes_formula(B, H, N, d, 4)
        assert gpt.measured_saved_bytes("course", B, H, N, d) == flash


def test_saved_bytes_grow_as_n_squared_for_naive_and_n_for_the_kernel():
    Ns = [16, 32, 64, 128]
    course = [gpt.measured_saved_bytes("course", 1, 1, N, 16) for N in Ns]
    for N, c in zip(Ns, course, strict=True):
        assert c == 4 * N * 16 * 4 + 4 * N  # exactly linear: q, k, v, out, lse
    assert np.polyfit(np.log(Ns), np.log(course), 1)[0] == pytest.approx(1.0, abs=1e-6)
    Ns = [64, 256, 1024]
    naive = [gpt.measured_saved_bytes("naive", 1, 1, N, 16) for N in Ns]
    assert naive == [(3 * N * 16 + N * N) * 4 for N in Ns]
    local = np.log(naive[-1] / naive[-2]) / np.log(Ns[-1] / Ns[-2])
    assert local > 1.8  # N^2 takes over once N >> 3 d
    with pytest.raises(ValueError, match="bytes_per_element"):
        gpt.saved_bytes_formula(1, 1, 8, 16, 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's message")
def test_gpu_measurements_say_so_without_a_gpu(corpus):
    _, tok, _ = corpus
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        gpt.peak_memory("naive", 1, 1, 64, 16)
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        gpt.tokens_per_second(gpt.GPT(_config(tok)), 1, 8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_peak_memory_and_throughput(corpus):
    _, tok, _ = corpus
    small = [gpt.peak_memory(a, 1, 4, 2048, 64) for a in ("naive", "sdpa", "course")]
    big = [gpt.peak_memory(a, 1, 4, 4096, 64) for a in ("naive", "sdpa", "course")]
    assert big[0] / small[0] > 3.0  # naive: P grows 4x
    assert big[1] / small[1] < 2.5 and big[2] / small[2] < 2.5  # fused: linear
    model = gpt.GPT(_config(tok, context=1024, d_model=128, n_heads=2), "course").cuda()
    assert gpt.tokens_per_second(model, 2, 1024, steps=3, warmup=1) > 0


def test_the_course_function_plugs_in_with_its_scale_argument(corpus):
    from course_utils.triton_attention import FlashAttentionFunction  # forward(..., softmax_scale)

    _, tok, data = corpus
    config = _config(tok)
    x, y = gpt.get_batch(data, 2, config.context, torch.Generator().manual_seed(3))
    x, y = x.to(DEVICE), y.to(DEVICE)
    ref = gpt.GPT(config, "sdpa").to(DEVICE)(x, y)[1].item()
    got = gpt.GPT(config, FlashAttentionFunction).to(DEVICE)(x, y)[1].item()
    assert abs(got - ref) < LOSS_TOL
