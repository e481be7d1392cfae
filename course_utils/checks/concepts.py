"""The course's graded concept questions: beliefs, not bugs.

Some of the commonest mistakes about FlashAttention are things people believe ("it is an
approximation", "it saves FLOPs"), and no function a learner writes shows them. These questions
grade them. Each wrong option is tied to a named misconception, the same slug wherever the belief
comes back, so the class report counts how many students hold it:

    approximates-attention   FlashAttention is approximate, like sparse or linear attention
    reduces-flops            FlashAttention is faster because it does fewer FLOPs
    bf16-state               the running m, l, lse or acc can be kept in bf16
    decode-speedup           the training speed-up carries over to decoding as it is

A notebook shows `QUESTIONS[name].markdown()` in a markdown cell, has an answer cell that sets
the question's variable, and a graded test cell `check_concept(name, variable)`;
tests/checks/test_concepts.py checks all three for every question.
"""

from __future__ import annotations

from course_utils.checks.engine.failures import CheckFailure
from course_utils.checks.engine.quizzes import Option, Question, check_choice

_APPROX = "approximates-attention"
_FLOPS = "reduces-flops"
_BF16 = "bf16-state"
_DECODE = "decode-speedup"

QUESTIONS: dict[str, Question] = {}


def _add(name: str, notebook: str, question: Question) -> None:
    QUESTIONS[name] = question
    NOTEBOOK[name] = notebook


NOTEBOOK: dict[str, str] = {}  # question name -> the notebook (assignment) that asks it

# ---- 01 online softmax -----------------------------------------------------------------------

_add(
    "exact",
    "01_online_softmax",
    Question(
        label="exact or approximate",
        prompt=(
            "**True or false?** FlashAttention forms the softmax sums block by block, in a "
            "different order than standard attention. So, like sparse or linear attention, it "
            "gives a slightly different, approximate output in exchange for its speed."
        ),
        options=(
            Option(
                "true",
                "FlashAttention approximates attention, like sparse or linear attention",
                _APPROX,
                "The rescale by exp(m_old - m_new) is an identity, not an approximation: after "
                "the last block acc / l is exactly the softmax average (the proof of the update). "
                "Summing in another order changes only the floating-point rounding, about 1e-16 "
                "in float64. Sparse attention skips scores and linear attention replaces the "
                "softmax: they compute a different function. FlashAttention computes the same "
                "one, so it drops into a trained model without retraining.",
            ),
            Option(
                "false",
                "",
                None,
                "The rescale is exact, so the output is the softmax average up to rounding "
                "(this notebook measures about 1e-16); sparse and linear attention change the "
                "function itself.",
            ),
        ),
        variable="answer_exact",
    ),
)

_add(
    "state-precision",
    "01_online_softmax",
    Question(
        label="precision of the running state",
        prompt=(
            "A kernel reads $Q$, $K$ and $V$ in bf16. In which precision should it keep the "
            "running state $m_i$, $\\ell_i$ and $\\tilde o_i$ (`acc`), and the $\\mathrm{lse}$ "
            "it writes?"
        ),
        options=(
            Option(
                "a",
                "in bf16, like the inputs: it halves the on-chip memory of the state",
                _BF16,
                "bf16 keeps 8 significant bits, about 3 decimal digits. l and acc are "
                "sums of hundreds or thousands of terms, and once a sum is more than 256 "
                "times a term, adding that term changes nothing in bf16; the lse then carries "
                "the error into the backward pass. Keep the state in fp32: it is one row of "
                "numbers per query, small next to the tiles.",
            ),
            Option("b", "in fp32", None, "fp32 keeps 24 bits, enough for sums of many terms."),
            Option(
                "c",
                "it does not matter: the rescale factors cancel any rounding in the end",
                "rounding-cancels",
                "The factor e^{-m} cancels exactly in exact arithmetic; a rounding error made "
                "while adding a term to l or acc is not undone by anything later.",
            ),
            Option(
                "d",
                "in fp64: exp of a large score overflows fp32",
                "overflow-needs-fp64",
                "Every exponent in the online update is x_i - m_new <= 0, so every exponential "
                "lies in [0, 1] and nothing overflows: fp32 is enough.",
            ),
        ),
        variable="answer_state_precision",
    ),
)

_add(
    "one-pass",
    "01_online_softmax",
    Question(
        label="what one pass can compute",
        prompt=(
            "Which attention variant can **not** be computed by the one-pass online softmax "
            "as it is, with a fixed state $(m, \\ell, \\tilde o)$ per row?"
        ),
        options=(
            Option(
                "a",
                "causal attention: query $r$ sees only the keys $c \\le r$",
                "mask-breaks-online",
                "A masked score is -inf: its weight e^{-inf - m} is 0, so it adds nothing to l "
                "or acc. The update is the same; a fully masked block only needs its nan guard.",
            ),
            Option(
                "b",
                "attention with a bias added to each score (ALiBi, relative positions)",
                "bias-breaks-online",
                "The bias changes each score before the update sees it; the update works on "
                "any scores, so nothing else changes.",
            ),
            Option(
                "c",
                "sparsemax: weights $\\max(x_i - t, 0)$, with the threshold $t$ chosen so "
                "that the weights add up to 1",
                None,
                "The threshold t depends on all the scores of the row, and a weight is not "
                "e^{x_i} times a factor that is the same for every key: when t moves, old "
                "weights change by different amounts (some become 0), so no single rescale "
                "of a fixed state can fix them.",
            ),
            Option(
                "d",
                "softmax with a temperature: weights $\\propto e^{x_i / T}$",
                "temperature-breaks-online",
                "Dividing every score by T is a change of the scores before the update, like "
                "the 1/sqrt(d) of attention; the update is the same.",
            ),
        ),
        variable="answer_one_pass",
    ),
)

# ---- 03 tiled forward ------------------------------------------------------------------------

_add(
    "forward-flops",
    "03_tiled_forward",
    Question(
        label="FLOPs of the forward pass",
        prompt=(
            "Compared with standard attention on the same $Q$, $K$, $V$, what does the "
            "FlashAttention forward pass change?"
        ),
        options=(
            Option(
                "b",
                "it does fewer FLOPs, because it never computes the whole $N \\times N$ matrix",
                _FLOPS,
                "Every score tile is computed, once: QK^T and PV still cost 2 N^2 d FLOPs each, "
                "4 N^2 d in all (causal: about half, for both versions alike). What never "
                "happens is the write of S and P to HBM and their reads back.",
            ),
            Option(
                "a",
                "the same $4N^2 d$ FLOPs; far less HBM traffic, and $O(N)$ memory instead of "
                "$O(N^2)$",
                None,
                "It is the same arithmetic in another order; the time saved is time spent "
                "waiting for HBM.",
            ),
            Option(
                "c",
                "fewer FLOPs and less memory, paid for with a small loss of accuracy",
                _APPROX,
                "The output equals standard attention up to floating-point rounding (this notebook "
                "measures it); nothing is approximated, and the FLOPs are the "
                "same.",
            ),
            Option(
                "d",
                "more FLOPs: it recomputes the scores of every tile twice",
                "recompute-in-forward",
                "The forward pass computes each score tile once. Recomputation happens in the "
                "backward pass, which rebuilds P from lse (notebook 07).",
            ),
        ),
        variable="answer_forward_flops",
    ),
)

# ---- 04 HBM traffic and the roofline ---------------------------------------------------------

_add(
    "memory-bound",
    "04_hbm_traffic",
    Question(
        label="why standard attention is memory-bound",
        prompt=(
            "Why is standard attention called **memory-bound** on an A100 (312 TFLOP/s of "
            "bf16 matmul, 1.5 to 2 TB/s of HBM)?"
        ),
        options=(
            Option(
                "a",
                "its matmuls $QK^\\top$ and $PV$ are too small for the tensor cores",
                "slow-matmuls",
                "The two matmuls are large and run well on tensor cores. The time goes into "
                "writing S and P to HBM and reading them back, with a few FLOPs per byte.",
            ),
            Option(
                "d",
                "counting the trips of $S$ and $P$ through HBM, it does about $d/2$ FLOPs per "
                "byte (32 at $d = 64$), far below the ridge point of 156 to 208 FLOP/byte, so "
                "the tensor cores wait for memory",
                None,
                "Its intensity is below the ridge point, so its time is set by bytes moved, "
                "not by FLOPs: a faster HBM would speed it up, more TFLOP/s would not.",
            ),
            Option(
                "c",
                "it does $\\Theta(N^2 d)$ FLOPs, quadratic in the sequence length",
                "quadratic-flops",
                "FlashAttention does the same Theta(N^2 d) FLOPs and is compute-bound at the "
                "same N; being memory-bound is about FLOPs per byte, not about the FLOP count.",
            ),
            Option(
                "b",
                "$S$ and $P$ do not fit in HBM",
                "capacity-not-bandwidth",
                "At N = 4,096 S takes 32 MiB in bf16 and fits easily; the problem is the time "
                "to move it, not the room to keep it. (At very long N capacity fails too, but "
                "that is running out of memory, not being memory-bound.)",
            ),
        ),
        variable="answer_memory_bound",
    ),
)

_add(
    "ratio-two",
    "04_hbm_traffic",
    Question(
        label="why FlashAttention wins at a ratio of 2",
        prompt=(
            "At $d = 128$ with $B_r = 128$ the no-cache traffic ratio standard / "
            "FlashAttention is only $2B_r/d = 2$. Which **two** reasons still make "
            "FlashAttention clearly faster?"
        ),
        options=(
            Option(
                "c",
                "the L2 cache serves many of the $K, V$ re-reads, so the real HBM traffic is "
                "far below the no-cache count",
                None,
                "The count assumes every re-read of K and V goes to HBM; thread blocks of one "
                "head share them through L2.",
            ),
            Option(
                "b",
                "no $N \\times N$ matrix exists: memory is $O(N)$, and masks and dropout add "
                "no passes over $N \\times N$ arrays; one kernel replaces three",
                None,
                "Standard attention pays extra N x N passes for every mask, dropout or scale "
                "step, and its memory limits the batch and the length.",
            ),
            Option(
                "a",
                "it does fewer FLOPs",
                _FLOPS,
                "Both do 4 N^2 d FLOPs in the forward pass; FlashAttention saves bytes.",
            ),
            Option(
                "d",
                "it computes in lower precision",
                _APPROX,
                "Both compute from the same bf16 inputs with fp32 accumulation; FlashAttention "
                "is exact up to rounding.",
            ),
        ),
        variable="answer_ratio_two",
        pick=2,
    ),
)

# ---- 05 split-KV decoding --------------------------------------------------------------------

_add(
    "decode",
    "05_split_kv",
    Question(
        label="the speed-up at decode",
        prompt=(
            "FlashAttention made a model's training step 3 times faster at $N = 8{,}192$. "
            "What should you expect from the same kernel in decoding, one new query per "
            "sequence per step, with batch 1, 32 heads and a KV cache of 32,768 tokens on an "
            "H100 (132 SMs)?"
        ),
        options=(
            Option(
                "a",
                "the same 3 times: it is the same kernel on the same model",
                _DECODE,
                "With one query there is no N x N matrix to keep out of HBM: the step reads the "
                "KV cache once either way. And FlashAttention-2's grid gives batch x heads = 32 "
                "thread blocks, so at most 32 of the 132 SMs pull the cache. Split-KV "
                "(flash-decoding) is the change that helps here.",
            ),
            Option(
                "c",
                "little by itself: the step is bound by reading the KV cache, and only 32 "
                "thread blocks run, so most SMs idle until the cache is split (split-KV)",
                None,
                "Decoding needs parallelism over the KV length, not the removal of an N x N "
                "matrix that does not exist at one query.",
            ),
            Option(
                "b",
                "more than 3 times: the KV cache is four times longer than the training sequence",
                "longer-cache-bigger-gain",
                "The gain in training comes from the N x N traffic FlashAttention avoids; with "
                "one query per step there is none, however long the cache.",
            ),
            Option(
                "d",
                "a slow-down: the online rescales cost more than they save",
                "rescale-cost",
                "The rescales are a few operations per key; the step's time is the time to "
                "read the cache, and the question is how many SMs read it.",
            ),
        ),
        variable="answer_decode",
    ),
)

# ---- 07 backward -----------------------------------------------------------------------------

_add(
    "backward-statement",
    "07_backward",
    Question(
        label="the backward pass",
        prompt="Which statement about the FlashAttention backward pass is correct?",
        options=(
            Option(
                "a",
                "it reads the probabilities $P$ that the forward pass saved, so it recomputes "
                "nothing",
                "stores-p",
                "Saving P would cost N^2 numbers per head, the memory FlashAttention exists to "
                "avoid. The forward pass saves O and one lse per row; the backward rebuilds "
                "each tile of P from them.",
            ),
            Option(
                "b",
                "it does fewer FLOPs than the standard backward, which is why it is faster",
                _FLOPS,
                "It does more: 10 N^2 d against 8 N^2 d, because it recomputes S. It is faster "
                "because it moves far fewer bytes (4.4 GB against 40.3 GB in Dao et al.'s "
                "GPT-2 measurement).",
            ),
            Option(
                "c",
                "it recomputes each tile of $P$ from $Q$, $K$ and the saved lse, doing about "
                "25% more matmul FLOPs, and is still faster because it moves far fewer bytes",
                None,
                "Recompute instead of store: FLOPs are cheap next to HBM traffic on a "
                "memory-bound operation.",
            ),
            Option(
                "d",
                "its gradients are approximate, accurate to about bf16",
                _APPROX,
                "P is rebuilt exactly, e^{S_ij - lse_i}; the gradients equal standard "
                "attention's up to rounding (exercise 2 checks them to 1e-10 in float64).",
            ),
        ),
        variable="answer_backward_statement",
    ),
)

_add(
    "lse-not-m-l",
    "07_backward",
    Question(
        label="lse, not m and l",
        prompt="Why does the backward pass not need $m_i$ and $\\ell_i$ separately?",
        options=(
            Option(
                "c",
                "$P_{ij} = e^{S_{ij} - m_i} / \\ell_i = e^{S_{ij} - (m_i + \\log \\ell_i)} "
                "= e^{S_{ij} - \\mathrm{lse}_i}$: one number per row rebuilds $P$, and every "
                "exponent is $\\le 0$",
                None,
                "lse_i holds both the max and the sum; and since lse_i >= S_ij, nothing overflows.",
            ),
            Option(
                "b",
                "$m_i$ only protects against overflow, which does not matter in the backward pass",
                "skip-max",
                "Without a shift e^{S_ij} overflows fp32 as soon as a score passes about "
                "88.7. lse_i is the shift; it is at least every score of its row.",
            ),
            Option(
                "a",
                "the backward pass recomputes $m_i$ and $\\ell_i$ with a first pass over each "
                "row of scores",
                "extra-pass",
                "That would be a second pass over all of K for every query tile, which the "
                "saved lse avoids: P_ij = e^{S_ij - lse_i} needs no max and no sum.",
            ),
            Option(
                "d",
                "lse is an approximation of $m_i$ that is good enough for gradients",
                _APPROX,
                "lse_i = m_i + log l_i exactly; it is the log of the softmax denominator, not "
                "an estimate of the max.",
            ),
        ),
        variable="answer_lse_not_m_l",
    ),
)

_add(
    "why-recompute",
    "07_backward",
    Question(
        label="why recompute P",
        prompt=(
            "Why does FlashAttention recompute $P$ in the backward pass instead of storing it "
            "in the forward pass, and why is that a good trade on a GPU?"
        ),
        options=(
            Option(
                "b",
                "storing $P$ costs $O(N^2)$ memory and HBM traffic; recomputing it from $Q$, "
                "$K$ and lse costs extra FLOPs, which are cheap on an operation that waits for "
                "memory",
                None,
                "The GPU has FLOPs to spare on a memory-bound operation; it is the bytes that "
                "cost time.",
            ),
            Option(
                "a",
                "recomputing $P$ takes fewer FLOPs than reading it back from HBM",
                "recompute-fewer-flops",
                "Reading costs no FLOPs at all; recomputing costs 2 N^2 d of them. The trade "
                "is FLOPs for bytes, and it pays because bytes are the slow resource.",
            ),
            Option(
                "c",
                "a saved $P$ in bf16 would be too inaccurate for the gradients",
                "bf16-p",
                "Precision is not the reason: P could be saved in fp32. Its size, N^2 per "
                "head and layer, and the traffic to write and read it are.",
            ),
            Option(
                "d",
                "the forward pass never computes $P$, so there is nothing to store",
                "forward-no-p",
                "The forward pass computes every tile of P (as p = e^{S - m_new}) and throws "
                "it away after the tile's update; storing those tiles is what it avoids.",
            ),
        ),
        variable="answer_why_recompute",
    ),
)


def check_concept(name: str, answer) -> None:
    """Grade the answer to the concept question `name` (a key of QUESTIONS)."""
    if name not in QUESTIONS:
        raise CheckFailure(f"name: no concept question {name!r}; known: {sorted(QUESTIONS)}")
    check_choice(QUESTIONS[name], answer)
