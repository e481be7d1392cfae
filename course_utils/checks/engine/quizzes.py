"""Quick checks: one number (or one choice) per question.

check_answer(label, yours, expected, rtol=, hint=)   a number within a relative tolerance
hinted_answer(label, yours, expected, hints, default, rtol=)
                                                     a wrong number that matches a known
                                                     wrong computation is named
Question, Option, check_choice(question, yours)      a multiple-choice or true/false question
tolerance_phrase, significant_digits, plain_text
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from course_utils.checks.engine.display import describe
from course_utils.checks.engine.failures import CheckFailure
from course_utils.checks.engine.feedback import close

# ---------------------------------------------------------------------------------------------
# Quick checks: one number (or choice) per question
# ---------------------------------------------------------------------------------------------


def tolerance_phrase(rtol: float) -> str:
    """How a quick check's tolerance reads beside its question and in its feedback: "exact" for
    an integer count (rtol below 1e-6), else the relative tolerance in percent ("0.5%")."""
    if rtol < 1e-6:
        return "exact"
    return f"{rtol * 100:.10g}%"


def significant_digits(rtol: float) -> int:
    """Digits that always meet a relative tolerance: rounding to N significant digits is off by
    at most 5 x 10^-N of the value (leading digit 1), so N = ceil(log10(5 / rtol))."""
    return max(2, math.ceil(math.log10(5.0 / rtol) - 1e-9))


def check_answer(
    label: str,
    yours,
    expected,
    *,
    rtol: float = 1e-3,
    atol: float = 1e-9,
    hint: str = "",
    near: bool = True,
) -> None:
    """Check a numeric quick-check answer; print a pass line or raise CheckFailure with a hint.

    An answer within 10 times the tolerance (and `near`: the hint is not one for a known wrong
    value) is a right result given with too few digits: the reply asks for more digits instead
    of the hint, which would send the learner re-deriving a right result.
    """
    if yours is None or yours is Ellipsis:
        raise CheckFailure(f"{label}: no answer yet (replace the placeholder with a number)")
    if isinstance(yours, str):
        raise CheckFailure(f"✗ {label}: the answer is the text {yours!r}; give a number")
    if close(yours, expected, rtol=rtol, atol=atol):
        print(f"✓ {label}: {describe(yours)} is right")
        return
    try:
        flat = np.ravel(np.asarray(yours, dtype=np.float64))
    except (TypeError, ValueError):
        flat = None
    if flat is not None and flat.size == 1 and np.ndim(yours) > np.ndim(expected):
        if close(flat[0], expected, rtol=rtol, atol=atol):
            raise CheckFailure(
                f"✗ {label}: the value is right, but it is {type(yours).__name__} of shape "
                f"{np.shape(yours)}; give a plain number (for example float(...) of it)"
            )
    tolerance = tolerance_phrase(rtol)
    if near and rtol >= 1e-6 and close(yours, expected, rtol=10 * rtol, atol=10 * atol):
        raise CheckFailure(
            f"✗ {label}: {describe(yours, 8)} is close, but not within the tolerance "
            f"({tolerance}): give {significant_digits(rtol)} significant digits (or the "
            f"expression itself, such as np.exp(-1))."
        )
    msg = f"✗ {label}: {describe(yours)} is not right (tolerance: {tolerance})."
    raise CheckFailure(msg + (f"\n  hint: {hint}" if hint else ""))


def hinted_answer(
    label: str, yours, expected, wrong_answers, default_hint: str, rtol: float = 1e-3
) -> None:
    """check_answer whose hint is chosen by the wrong answer given, when it is a known one.

    wrong_answers: (value, hint) pairs, e.g. (8 / 10, "that is the ratio the other way round").
    An answer gets the hint of the nearest known wrong value when it lies within 1% of it and
    closer to it than to any other known value (the right one included): windows never overlap.
    Any other wrong answer gets default_hint, or, within 10 times the tolerance of the right
    value, the request for more digits (check_answer).
    """
    hint, known_wrong = default_hint, False
    try:
        value = float(yours)
    except (TypeError, ValueError):
        value = None
    if value is not None and np.isfinite(value):
        known = [float(expected)] + [float(w) for w, _ in wrong_answers]
        for k, (wrong, why) in enumerate(wrong_answers):
            wrong = float(wrong)
            others = [abs(o - wrong) for j, o in enumerate(known) if j != k + 1 and o != wrong]
            window = max(1e-2, rtol) * abs(wrong)
            if others:
                window = min(window, 0.5 * min(others))
            if abs(value - wrong) <= window:
                hint, known_wrong = why, True
                break
    check_answer(label, yours, expected, rtol=rtol, hint=hint, near=not known_wrong)


@dataclass(frozen=True)
class Option:
    """One option of a concept question.

    key: what the learner types ("a", "b", ...; "true" or "false" for a true/false question).
    text: the option as the notebook shows it.  slug: the misconception a learner who picks it
    holds (None for a right option).  why: the feedback when it is picked: why it is right, or
    what is wrong with it.
    """

    key: str
    text: str
    slug: str | None = None
    why: str = ""


@dataclass(frozen=True)
class Question:
    """A graded concept question: one right option (or `pick` right ones), each wrong option tied
    to a named misconception so that the class report counts them.

    label: short name in feedback.  prompt: the question (markdown).  variable: the name the
    learner sets in the answer cell.  pick: how many options to choose (1: a single choice).
    The notebook shows `markdown()`; tests/checks/test_concepts.py checks that it does.
    """

    label: str
    prompt: str
    options: tuple[Option, ...]
    variable: str
    pick: int = 1

    def __post_init__(self):
        keys = [o.key for o in self.options]
        if len(set(keys)) != len(keys):
            raise ValueError(f"{self.label}: option keys repeat: {keys}")
        right = [o for o in self.options if o.slug is None]
        if len(right) != self.pick:
            raise ValueError(f"{self.label}: {len(right)} right options, expected {self.pick}")
        if any(o.slug is not None and not o.why for o in self.options):
            raise ValueError(f"{self.label}: every wrong option needs its explanation")

    @property
    def right(self) -> frozenset[str]:
        return frozenset(o.key for o in self.options if o.slug is None)

    @property
    def true_false(self) -> bool:
        return {o.key for o in self.options} == {"true", "false"}

    def markdown(self) -> str:
        """The question as the notebook shows it: prompt, options, and how to answer."""
        if self.true_false:
            how = f"Set `{self.variable}` to `True` or `False`."
            return f"{self.prompt}\n\n{how}"
        lines = [self.prompt, ""]
        options = sorted(self.options, key=lambda o: o.key)
        lines += [f"- **({o.key})** {o.text}" for o in options]
        letters = ", ".join(f'`"{o.key}"`' for o in options)
        if self.pick == 1:
            how = f"Set `{self.variable}` to the letter of your choice as a string ({letters})."
        else:
            how = (
                f"Choose {self.pick}. Set `{self.variable}` to a string with the letters of your "
                f"{self.pick} choices, in any order."
            )
        return "\n".join(lines) + f"\n\n{how}"


_TRUE = {"true", "t", "yes", "y", "1"}
_FALSE = {"false", "f", "no", "n", "0"}


def _chosen_keys(question: Question, yours) -> frozenset[str]:
    """The option keys the learner chose; CheckFailure when the answer is not a choice."""
    label = question.label
    if yours is None or yours is Ellipsis:
        raise CheckFailure(
            f"{label}: no answer yet (set {question.variable} to "
            + ("True or False)" if question.true_false else "a letter, as a string)")
        )
    if question.true_false:
        if isinstance(yours, bool | np.bool_):
            return frozenset({"true" if yours else "false"})
        if isinstance(yours, str) and yours.strip().lower() in _TRUE | _FALSE:
            return frozenset({"true" if yours.strip().lower() in _TRUE else "false"})
        raise CheckFailure(f"✗ {label}: {describe(yours)} is not True or False")
    if isinstance(yours, str):
        letters = [c for c in yours.lower() if c.isalnum()]
    elif isinstance(yours, list | tuple | set | frozenset) and all(
        isinstance(x, str) for x in yours
    ):
        letters = [c for x in yours for c in x.lower() if c.isalnum()]
    else:
        raise CheckFailure(
            f"✗ {label}: the answer is {type(yours).__name__} {describe(yours)}; give the "
            f'letter of an option as a string, for example "a"'
        )
    keys = {o.key for o in question.options}
    unknown = sorted(set(letters) - keys)
    if unknown or not letters:
        raise CheckFailure(
            f"✗ {label}: {yours!r} is not one of the options ({', '.join(sorted(keys))})"
        )
    if len(set(letters)) != question.pick:
        raise CheckFailure(
            f"✗ {label}: you chose {len(set(letters))} option(s); choose exactly {question.pick}"
        )
    return frozenset(letters)


_LATEX_SYMBOLS = {
    r"\times": "×", r"\Theta": "Θ", r"\le": "≤", r"\ge": "≥", r"\ell": "ℓ", r"\propto": "∝",
    r"\top": "ᵀ", r"\infty": "∞", r"\log": "log", r"\max": "max", r"\min": "min", r"\exp": "exp",
    r"\cdot": "·", r"\sqrt": "√", r"\sum": "Σ", r"\,": " ", "{,}": ",",
}  # fmt: skip
_SUPERSCRIPT = str.maketrans("0123456789+-()nijkT", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁽⁾ⁿⁱʲᵏᵀ")
_SUBSCRIPT = str.maketrans("0123456789+-()ijkrs", "₀₁₂₃₄₅₆₇₈₉₊₋₍₎ᵢⱼₖᵣₛ")
_MATH = re.compile(r"\$([^$]*)\$")
_SCRIPT = re.compile(r"([\^_])(\{([^{}]*)\}|\w)")


def _math_plain(math_text: str) -> str:
    """One $...$ of a concept option as plain text (N \\times N -> N×N, N^2 d -> N²d)."""
    text = math_text
    for name in ("mathrm", "text", "tilde"):
        text = re.sub(rf"\\{name}\s*\{{([^{{}}]*)\}}", r"\1", text)
    text = re.sub(r"\\tilde\s*(\w)", "\\1\u0303", text)
    for latex, symbol in sorted(_LATEX_SYMBOLS.items(), key=lambda kv: -len(kv[0])):
        text = re.sub(re.escape(latex) + r"(?![A-Za-z])", lambda _m, s=symbol: s, text)

    def script(m: re.Match) -> str:
        body = m.group(3) if m.group(3) is not None else m.group(2)
        table = _SUPERSCRIPT if m.group(1) == "^" else _SUBSCRIPT
        converted = body.translate(table)
        if all(c != d or c in "ᵀ" for c, d in zip(converted, body, strict=True)):
            return converted
        return m.group(1) + (f"({body})" if len(body) > 1 else body)

    while (scripted := _SCRIPT.sub(script, text)) != text:  # innermost braces first
        text = scripted
    text = re.sub(r"(?<=[²³⁴ⁿᵀ])\s+(?=[A-Za-z])", "", text)  # N^2 d: N²d
    text = re.sub(r"\s*×\s*", "×", text)
    return text.replace("{", "").replace("}", "").replace("\\", "")


def plain_text(markdown: str) -> str:
    """A concept option's markdown as feedback prints it: math in plain Unicode, no LaTeX
    ($N \\times N$ -> N×N, $\\Theta(N^2 d)$ -> Θ(N²d)); feedback is plain text, and it is the
    only place where an option's text becomes feedback (check_choice)."""
    return _MATH.sub(lambda m: _math_plain(m.group(1)), markdown).replace("**", "")


def _shown(key: str) -> str:
    return {"true": "True", "false": "False"}.get(key, f"({key})")


def check_choice(question: Question, yours) -> None:
    """Check the answer to a concept question: print why it is right, or raise CheckFailure
    naming the misconception of the (first) wrong option chosen."""
    chosen = _chosen_keys(question, yours)
    by_key = {o.key: o for o in question.options}
    if chosen == question.right:
        why = " ".join(by_key[k].why for k in sorted(chosen) if by_key[k].why)
        shown = " and ".join(_shown(k) for k in sorted(chosen))
        verb = "is" if len(chosen) == 1 else "are"
        print(f"✓ {question.label}: {shown} {verb} right." + (f" {why}" if why else ""))
        return
    wrong = next(by_key[k] for k in sorted(chosen) if k not in question.right)
    shown = _shown(wrong.key)
    raise CheckFailure(
        f"✗ {question.label}: {shown} is not right.\n"
        f"  likely mistake: {plain_text(wrong.text)} [misconception: {wrong.slug}]\n"
        f"  {wrong.why}"
    )
