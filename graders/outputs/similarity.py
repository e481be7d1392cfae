"""Near-copies among a class's answers, and of the course's own code, for the instructor to review.

Only the student-editable answer cells (nbgrader solution cells) are compared, with copydetect
(https://github.com/blingenf/copydetect): the code is tokenized (names become V, F, O, strings
S, comments and layout dropped), k-grams of tokens are hashed and winnowed (the method of MOSS),
and what the release gave every student (the answer cells' stubs: signatures, docstrings, `raise
NotImplementedError()`) is removed as boilerplate. For a pair, the share of each answer's tokens
found in the other is reported.

    two students   listed when each has at least `threshold` of its answer in the other's;
    the course     listed when a student has `threshold` of the answer in the course's reference
                   code: the instructor solution's answer cells, or a course_utils/*.py or
                   course_utils/references/*.py file.

A pair is a question for the instructor, not a verdict: short exercises leave little room to
differ, and the report says so. Without copydetect (pip install copydetect) nothing is compared.

Scale: comparing every pair of a class is quadratic (about 2 ms a pair: 7 hours per notebook for
5,000 students). So answers with the same fingerprints (the same code up to names, comments and
layout) are grouped first, every pair of a group listed (in a group of more than COMMON_MIN,
each member with the group's first); the groups are then paired
through an index of their fingerprint hashes: two are compared in full only when they share
enough hashes that few other groups hold (at most max(COMMON_MIN, COMMON_SHARE * groups)). Up
to COMMON_MIN distinct answers per notebook nothing is left out; past that, two answers whose
shared code is also in more than 1 % of the class's distinct answers are not paired (each is
still compared with the course's code).
"""

from __future__ import annotations

import functools
import io
from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import nbformat

from graders.intake.submissions import read_notebook, source_text
from graders.run import pipeline

THRESHOLD = 0.8  # share of an answer's tokens found in the other one
MIN_TOKENS = 50  # answers shorter than this (after the stubs are removed) are not compared
COMMON_MIN = 100  # a fingerprint hash held by this many answers still pairs them ...
COMMON_SHARE = 0.01  # ... or by this share of the class, whichever is more
PREFILTER = 0.5  # a pair is compared when its rare hashes in common reach this * threshold


@dataclass(frozen=True)
class Pair:
    assignment: str
    student: str
    other: str  # another student's id, or "reference: solutions" / "reference: course_utils/x.py"
    share: float  # share of the student's answer tokens found in `other`
    other_share: float | None  # share of the other's tokens found in the student's (None: a file)

    @property
    def reference(self) -> bool:
        return self.other.startswith("reference: ")


def answer_code(nb) -> str:
    """The code of the notebook's answer cells (nbgrader solution cells), magics left out."""
    parts = []
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {}) or {}
        if cell.get("cell_type") == "code" and meta.get("solution") and not meta.get("locked"):
            lines = source_text(cell.get("source")).splitlines()
            parts.append("\n".join(ln for ln in lines if not ln.lstrip().startswith(("%", "!"))))
    return "\n\n".join(parts)


def reference_sources(assignment: str, root: Path = pipeline.REPO) -> dict[str, str]:
    """The course's own code a student could copy: the solution's answers, course_utils/*.py and
    the references (course_utils/references/*.py)."""
    solution = nbformat.read(root / "solutions" / assignment / f"{assignment}.ipynb", 4)
    code = answer_code(solution)
    refs = {
        "solutions": "\n".join(
            ln
            for ln in code.splitlines()
            if ln.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION")
        )
    }
    package = root / "course_utils"
    for path in sorted([*package.glob("*.py"), *(package / "references").glob("*.py")]):
        refs[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
    return refs


def available() -> str | None:
    """None when copydetect can be used, else why not (one line for the report)."""
    try:
        import copydetect  # noqa: F401
    except ImportError:
        return "copydetect is not installed (pip install copydetect): answers were not compared"
    return None


def _fingerprint(code: str, boilerplate=None):
    from copydetect import CodeFingerprint
    from copydetect.defaults import GUARANTEE_THRESHOLD, NOISE_THRESHOLD

    return CodeFingerprint(
        "answer.py",
        k=NOISE_THRESHOLD,
        win_size=max(1, GUARANTEE_THRESHOLD - NOISE_THRESHOLD + 1),
        boilerplate=boilerplate,
        fp=io.StringIO(code),
        language="python",
    )


@functools.lru_cache(maxsize=512)
def _reference_fingerprint(text: str):
    """A reference's fingerprint, made once per run however many assignments are compared with
    it (the course_utils files are the same for every assignment). It is made without the
    assignment's boilerplate: that changes nothing in a student's share, which counts the
    student's own hashes, from which the boilerplate is already gone."""
    return _fingerprint(text)


def _shares(a, b) -> tuple[float, float]:
    from copydetect import compare_files

    _, (sa, sb), _ = compare_files(a, b)
    return float(sa), float(sb)


def similar_pairs(
    results: list[dict], threshold: float = THRESHOLD, root: Path = pipeline.REPO
) -> list[Pair]:
    """The pairs to review among `results` (graded submissions), most similar first."""
    import numpy as np

    if available() is not None:
        return []
    pairs: list[Pair] = []
    for assignment in sorted({r["assignment"] for r in results}):
        release = nbformat.read(root / "notebooks" / assignment / f"{assignment}.ipynb", 4)
        stub = _fingerprint(answer_code(release))
        boilerplate = np.unique(np.array(list(stub.hashes), dtype=np.int64))
        prints = {}
        for r in sorted(results, key=lambda r: r["student"]):
            if r["assignment"] != assignment or r["status"] == "invalid-notebook":
                continue
            if not r.get("source"):  # nothing handed in (a `missing` row of the roster)
                continue
            try:
                code = answer_code(read_notebook(Path(r["source"])))
            except (OSError, ValueError):
                continue
            fp = _fingerprint(code, boilerplate)
            if fp.token_coverage >= MIN_TOKENS:
                prints[r["student"]] = fp
        for name, text in reference_sources(assignment, root).items():
            ref = _reference_fingerprint(text)
            for student, fp in prints.items():
                share, _ = _shares(fp, ref)
                if share >= threshold:
                    pairs.append(Pair(assignment, student, f"reference: {name}", share, None))
        groups = same_code_groups(prints)
        for first, *others in groups.values():
            if others:
                share = _shares(prints[first], prints[others[0]])[0]
                if share < threshold:
                    continue
                members = [first, *others]  # every pair of a small group, a star for a large one
                twins = (
                    combinations(members, 2)
                    if len(members) <= COMMON_MIN
                    else ((first, o) for o in others)
                )
                pairs += [Pair(assignment, a, b, share, share) for a, b in twins]
        group_of = {members[0]: members for members in groups.values()}
        firsts = {first: prints[first] for first in group_of}
        for s1, s2 in candidate_pairs(firsts, threshold):
            a, b = _shares(prints[s1], prints[s2])
            if min(a, b) < threshold:
                continue
            g1, g2 = group_of[s1], group_of[s2]  # the same code: the same shares, member by member
            if len(g1) * len(g2) > COMMON_MIN:
                g1, g2 = [s1], [s2]
            pairs += [Pair(assignment, x, y, a, b) for x in g1 for y in g2]
    pairs.sort(key=lambda p: (-min(p.share, p.other_share or p.share), p.assignment, p.student))
    return pairs


def same_code_groups(prints: dict) -> dict[tuple[int, ...], list[str]]:
    """Students whose answers have the same fingerprint hashes (the same code once names,
    comments and layout are normalised), in order; {hashes: [students]}."""
    groups: dict[tuple[int, ...], list[str]] = defaultdict(list)
    for student in sorted(prints):
        groups[tuple(sorted({int(x) for x in prints[student].hashes}))].append(student)
    return dict(groups)


def candidate_pairs(prints: dict, threshold: float) -> list[tuple[str, str]]:
    """The pairs of students whose answers may be near-copies, without comparing every pair.

    prints: {student: copydetect fingerprint}. An inverted index maps each winnowed hash to the
    answers holding it; a hash held by more than max(COMMON_MIN, COMMON_SHARE * len(prints))
    answers is common code and pairs no one. Two answers are a candidate when the rare hashes
    they share reach PREFILTER * threshold of the smaller one's rare hashes (a near-copy shares
    nearly all of them). Cost: the sum over rare hashes of (answers holding it)^2, not N^2.
    """
    holders: dict[int, list[str]] = defaultdict(list)
    for student in sorted(prints):
        for h in set(int(x) for x in prints[student].hashes):
            holders[h].append(student)
    cap = max(COMMON_MIN, int(COMMON_SHARE * len(prints)))
    rare: Counter = Counter()
    shared: Counter = Counter()
    for who in holders.values():
        if len(who) > cap:
            continue
        for student in who:
            rare[student] += 1
        for pair in combinations(who, 2):
            shared[pair] += 1
    return sorted(
        pair
        for pair, n in shared.items()
        if n >= PREFILTER * threshold * min(rare[pair[0]], rare[pair[1]])
    )
