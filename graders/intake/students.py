"""Who handed in what: the Submission record, and the student id a name becomes.

    Submission(student, assignment, path, others, name, ignored, notes)   one graded upload
    student_id("Ana María") -> "Ana_María-1f0c2d3e"   a folder name and nbgrader student id

Shared by the folder layouts (graders/intake/submissions.py) and the LMS downloads
(graders/intake/lms.py), which both make Submissions; graders.intake.submissions offers both
names too.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Submission:
    student: str  # the id: folder and gradebook name (see student_id)
    assignment: str
    path: Path  # the upload that is graded: the newest
    others: tuple[Path, ...] = ()  # the other uploads of this student for this assignment
    name: str = ""  # the student's name as the folder or file name gave it
    ignored: tuple[Path, ...] = ()  # other notebooks in the folder: not this assignment's (scratch)
    notes: tuple[str, ...] = ()  # lines for this student's problems (an LMS's: late, not rostered)


_NOT_ID = re.compile(r"[^\w.-]+")  # \w: Unicode letters and digits, and _


def student_id(raw: str) -> str:
    """A folder name and nbgrader student id for the name `raw`, never the same for two names.

    A name of letters and digits of any script (and `_ . -`) is its own id: `José`, `张伟`. Any
    other name (spaces, `+`, `/`, glob characters, a leading dot) is cleaned and gets a short
    hash of the name: `Ana María` -> `Ana_María-1f0c2d3e`, so `Ana María` and `Ana_María` stay
    two students. Names are compared in Unicode NFC: a name spelled decomposed (as macOS writes
    file names) is the same name as its composed spelling.
    """
    name = unicodedata.normalize("NFC", raw)
    cleaned = _NOT_ID.sub("_", name).strip("_.-")[:80]
    if cleaned and cleaned == name:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{cleaned or 'student'}-{digest}"
