"""Rules on what notebook 06's kernels load, judged from the interpreter's load log.

A wrong load often leaves the output right: a row of `a` past M read without a mask only lands
in a row of c that is never stored, and a second pass over K gives the same numbers as one. The
runners of course_utils.harness.triton_puzzles record, in the interpreter, which elements of
each input every program loads (triton_attention.load_log: a _core.LoadLog per program and
input, and the lanes read outside the input's view); these rules read that summary once the
values are right, each a _core.Rule whose judge sees the summary as a CallReport:

    inside_rule(case, names, what)        no load reads a cell outside the matrix (the guard
                                          band around it): a cell past the matrix reads as 0
    once_rule(case, name, what)           per program, no element of `name` loaded twice
                                          (_core.single_pass_rule on that program's LoadLog)
    launches_rule(case, kernel)           the launcher launches the learner's kernel
    reads_inputs_rule(case, names)        the learner's kernel reads every element of q, k, v
    broken(name, rules, summary, input)   the first broken rule's message, or None

On a GPU nothing is recorded ({"recorded": False}); the checks then say in their pass line that
these rules were checked in the interpreter only.
"""

from __future__ import annotations

from course_utils.checks.engine.cases import Case
from course_utils.checks.engine.failures import Mistake
from course_utils.checks.engine.rules import Rule, single_pass_rule
from course_utils.checks.engine.tracing import LoadLog
from course_utils.checks.engine.watch import CallReport

__all__ = [
    "KERNEL_NOT_LAUNCHED",
    "LOAD_MISTAKES",
    "TORCH_COMPUTES",
    "TRITON_TILE_RELOADED",
    "broken",
    "inside_rule",
    "launches_rule",
    "once_rule",
    "reads_inputs_rule",
    "rule_case",
]

_MASK_WHY = (
    "A cell past the matrix must read as 0 (or -inf where a max is taken): the memory after "
    "the last row or column is not the matrix's. On a GPU an unmasked load there reads another "
    "tensor's data, or faults; the values may still come out right when they only reach cells "
    "that are never stored, so this check watched the loads themselves. Mask every dimension the "
    "tile can run past, e.g. mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), "
    "other=0.0 (or tl.where on the loaded tile with the same mask)."
)
LOAD_UNMASKED = Mistake(
    "mask-missing",
    "a load reads cells past the matrix: no lane of its tile is masked off",
    _MASK_WHY,
    None,
)
LOAD_ONE_DIMENSION = Mistake(
    "mask-one-dimension",
    "a 2-D load masked on one dimension only reads cells past the matrix in the other",
    _MASK_WHY,
    None,
)
LOAD_OFF_BY_ONE = Mistake(
    "mask-off-by-one",
    "the load's mask keeps the index one past the last (<= instead of <)",
    "Indices run 0 .. n - 1: the mask is offs < n. " + _MASK_WHY,
    None,
)
LOAD_MISTAKES = {"none": LOAD_UNMASKED, "rows": LOAD_ONE_DIMENSION, "cols": LOAD_ONE_DIMENSION,
                 "partial": LOAD_ONE_DIMENSION}  # fmt: skip
TRITON_TILE_RELOADED = Mistake(
    "tile-reloaded",
    "K or V (or q) elements are loaded more than once by one program",
    "One program loads its query tile once and streams K and V past it: each K/V tile is "
    "loaded once, used for the scores, the softmax and p @ v, then the next one. A second pass "
    "over K (to find the max first, say) doubles the reads of K; the online softmax rescales "
    "instead. A tile loaded once stays on chip (in registers) while the program uses it: "
    "computing with it again is free, a tl.load of the same addresses again is a second read.",
    None,
)
KERNEL_NOT_LAUNCHED = Mistake(
    "launcher-skips-kernel",
    "attention_fwd never launches attention_fwd_kernel",
    "The exercise is the Triton kernel: attention_fwd checks the inputs, allocates out and lse, "
    "and launches attention_fwd_kernel[grid](...) to compute them. Computing out and lse with "
    "torch (matmul and softmax, scaled_dot_product_attention) gives the right numbers without "
    "the kernel.",
    None,
)
TORCH_COMPUTES = Mistake(
    "attention-outside-kernel",
    "attention_fwd launches its kernel, but the kernel does not read all of q, k and v",
    "Every query, key and value enters the result, so the kernel launched on q, k and v must "
    "load each of their elements (at least once): grid = (cdiv(N_q, BLOCK_M), B * H), each "
    "program one query tile of one head, looping over all the keys it sees. A result that "
    "torch computes beside the kernel (or a kernel launched on part of the inputs) does not.",
    None,
)

# The kinds of the load log's lanes, in the words of a message
_DIMS = {2: ("row", "column"), 4: ("batch", "head", "row", "column")}


def rule_case(label: str) -> Case:
    """The Case a Rule of these checks carries: its label only (the input is described by the
    check, which knows its shapes)."""
    return Case(label, ())


def _summary_of(report: CallReport) -> dict:
    return report.result or {}


def _where(name: str, info: dict) -> str:
    ex = info["example"]
    shape, index = info["shape"], ex["index"]
    dims = _DIMS.get(len(shape), tuple(f"dim {k}" for k in range(len(shape))))
    past = [
        f"{dim} {i}, past the last ({dim}s 0 .. {n - 1})"
        for dim, i, n in zip(dims, index, shape, strict=True)
        if i >= n
    ]
    at = f"({', '.join(str(i) for i in index)})"
    if past and past[0].startswith(dims[0]) and len(shape) > 2:
        beyond = f"past {name}'s last element (its {dims[0]} index would be {index[0]})"
    else:
        beyond = ", ".join(past) or "between its rows"
    pid = ", ".join(str(p) for p in ex["program"]) or "0"
    mask = {
        "none": "no lane masked off",
        "rows": "a mask on the rows only",
        "cols": "a mask on the columns only",
        "partial": "a mask that lets them through",
    }
    return (
        f"{ex['kernel']}'s program ({pid}) loads {ex['lanes']} cells outside {name} "
        f"({' x '.join(str(n) for n in shape)}), e.g. index {at}: {beyond}; the tile's load has "
        f"{mask.get(ex['mask'], ex['mask'])}; {info['outside']} cells outside in all"
    )  # fmt: skip


def inside_rule(case: Case, names: tuple[str, ...], what: str) -> Rule:
    """A Rule: no active lane of a load of the inputs `names` lies outside the input's view."""

    def judge(report: CallReport, case: Case):
        args = _summary_of(report).get("args", {})
        for name in names:
            info = args.get(name)
            if info and info["outside"]:
                ex = info["example"]
                mistake = LOAD_MISTAKES.get(ex["mask"], LOAD_ONE_DIMENSION)
                one_past = all(
                    i <= n for i, n in zip(ex["index"], info["shape"], strict=True)
                ) and any(i == n for i, n in zip(ex["index"], info["shape"], strict=True))
                if ex["mask"] == "partial" and one_past:
                    mistake = LOAD_OFF_BY_ONE
                return mistake, _where(name, info)
        return None

    return Rule(case, judge, what)


def once_rule(case: Case, name: str, what: str) -> Rule:
    """A Rule: one program loads no element of `name` twice (single_pass_rule on the program
    that loads some element most often)."""
    single = single_pass_rule(case, what, TRITON_TILE_RELOADED, arg=name)

    def judge(report: CallReport, case: Case):
        info = _summary_of(report).get("args", {}).get(name)
        if not info or info["worst"] is None:
            return None
        worst = CallReport(loads={name: LoadLog.from_dict(info["worst"])}, traced={name: name})
        verdict = single.judge(worst, case)
        if verdict is None:
            return None
        mistake, measured = verdict
        pid = ", ".join(str(p) for p in info["worst_program"]) or "0"
        return mistake, f"{measured}, by program ({pid}) alone"

    return Rule(case, judge, what)


_LAUNCHES = "attention_fwd launches attention_fwd_kernel"


def launches_rule(case: Case, kernel: str) -> Rule:
    """A Rule: the learner's function launches its @triton.jit `kernel` at least once."""

    def judge(report: CallReport, case: Case):
        summary = _summary_of(report)
        if summary.get("of_kernel", 0) > 0:
            return None
        others = sorted(set(summary.get("kernels", [])))
        launched = f"it launched {', '.join(others)}" if others else "it launched no kernel"
        return KERNEL_NOT_LAUNCHED, f"your function launched {kernel} 0 times ({launched})"

    return Rule(case, judge, _LAUNCHES)


def reads_inputs_rule(case: Case, names: tuple[str, ...]) -> Rule:
    """A Rule: the kernels launched load every element of each input in `names` at least once."""

    def judge(report: CallReport, case: Case):
        args = _summary_of(report).get("args", {})
        for name in names:
            info = args.get(name)
            if info is None:
                continue
            size = 1
            for n in info["shape"]:
                size *= n
            if info["read"] < size:
                return TORCH_COMPUTES, (
                    f"the kernel loaded {info['read']:,} of the {size:,} elements of {name} "
                    f"({' x '.join(str(n) for n in info['shape'])}); if your launcher copies "
                    f"{name} (contiguous, padding, a cast), launch on {name} itself"
                )
        return None

    return Rule(case, judge, "the kernel computes out and lse from all of q, k and v")


def broken(name: str, rules, summary: dict, input_text: str) -> str | None:
    """The message of the first rule the summary breaks (in _core._rule_message's words), or
    None when every rule holds or nothing was recorded (a GPU)."""
    if not summary:
        return None
    if not summary.get("recorded"):  # a GPU: only the launches, when they were counted
        if not summary.get("counted"):
            return None
        rules = [r for r in rules if r.what == _LAUNCHES]
    report = CallReport(result=summary)
    for rule in rules:
        verdict = rule.judge(report, rule.case)
        if verdict is None:
            continue
        mistake, measured = verdict
        return "\n".join(
            [
                f"✗ {name} gives the right values but breaks a rule of the exercise on "
                f"{rule.case.label}: {rule.what}.",
                f"  input:    {input_text}",
                f"  measured: {measured}",
                f"  likely mistake: {mistake.title} [misconception: {mistake.slug}]",
                f"  {mistake.explanation}",
            ]
        )
    return None
