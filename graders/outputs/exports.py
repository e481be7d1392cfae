"""Grades as files an LMS imports: Canvas's and Moodle's gradebook CSV, Moodle's grading worksheet.

    python -m graders grade PATH --export canvas,moodle [--roster roster.csv]

writes grades_canvas.csv and grades_moodle.csv beside grades.csv, and with moodle, for a Moodle
download, grades_moodle-worksheet_<assignment>.csv too. One row per student, one
column per assignment; a student with nothing handed in for an assignment of the class gets 0,
its feedback saying `missing` (graders/grade.py: the roster is the class). With --course-dir the
scores are the gradebook's, so
a manual score set in Formgrader is the one exported.

Canvas (Grades > Import): the columns of Canvas's own gradebook export, which its import reads
back: `Student, ID, SIS User ID, SIS Login ID, Section`, then one column per assignment, and a
second row `Points Possible` holding each assignment's maximum under its column (the first five
cells of that row stay empty but for the label). Only one of the name, the Canvas ID or the SIS
User ID is needed to match a student (Ohio State's guide to importing a CSV into CarmenCanvas,
teaching.resources.osu.edu, "Import CSV File for Carmen Grades"; VCU's Canvas gradebook notes,
ts.vcu.edu, on the exported columns). An assignment column named without Canvas's numeric id in
parentheses is a new assignment for Canvas: here it is `<title> (<assignment id>)`; to update an
assignment that already exists in Canvas, map the column to it on the import's preview page.

Moodle (Grades > Import > CSV file): any columns; on the preview page you map one column to a
user field (`Email address` to useremail, `ID number` to useridnumber, or `Username`) and each
grade column to a grade item (MoodleDocs, "Grade import"). Moodle warns that importing feedback
overwrites the grades linked to that item, so each assignment's feedback column comes with its
grade column (`<assignment>` and `<assignment> (feedback)`).

Moodle, one assignment (Assignment > View all submissions > Grading action "Upload grading
worksheet", the assignfeedback_offline plugin), written by --export moodle beside the gradebook
CSV: when PATH was Moodle's "Download all submissions", each file name holds the student's
participant id (graders/intake/lms.py), and the assignment's own offline grading worksheet keyed by
it is the most faithful import: no user field to map, no name to match.
grades_moodle-worksheet_<assignment>.csv has the worksheet's columns (Moodle's "Download grading
worksheet": `Identifier, Full name, Email address, Status, Grade, Maximum Grade, Grade can be
changed, Last modified (submission), Last modified (grade), Feedback comments`), one row per
student with a participant id. Moodle's importer (mod/assign/feedback/offline/importgradeslib.php)
needs `Identifier` = `Participant <id>` (the string `hiddenuser`, "Participant ", then the id),
`Grade` and `Last modified (grade)`: a row whose date is more than a minute older than the grade
in Moodle is skipped unless "Allow updating records that have been modified more recently in
Moodle than in the spreadsheet" is ticked, so the date written is the export's (ISO 8601 with its
UTC offset, which PHP's strtotime reads). `Feedback comments` is the column of the
assignfeedback_comments plugin. Moodle skips a grade above the assignment's maximum there: give
the Moodle assignment the notebook's maximum (the `Maximum Grade` column).

A student maps to the LMS through an optional roster CSV (--roster), one row per student:
    student   the grader's student id (required; as in grades.csv)
    name      the name shown in the LMS (Canvas: "Last, First")      (optional)
    lms_id    Canvas: the user's Canvas ID; Moodle: the ID number    (optional)
    sis_id    Canvas: the SIS User ID                                (optional)
    login     Canvas: the SIS Login ID; Moodle: the username         (optional)
    section   Canvas: the section                                    (optional)
    email     Moodle: the email address                              (optional)
Without a roster, or for a student the roster lacks, the grader's student id is the identifier:
Canvas's SIS User ID and SIS Login ID, Moodle's ID number and Username; Canvas's ID is the
roster's lms_id, else the Canvas user id in the name of the file graded (a Canvas download).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

KINDS = ("canvas", "moodle")
ROSTER_COLUMNS = ("student", "name", "lms_id", "sis_id", "login", "section", "email")
CANVAS_FIXED = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
POINTS_POSSIBLE = "    Points Possible"  # as Canvas writes the label in its own export


class RosterError(ValueError):
    """A roster file that cannot be used; the message names the file, the line and the column."""


@dataclass
class Person:
    student: str
    name: str = ""
    lms_id: str = ""
    sis_id: str = ""
    login: str = ""
    section: str = ""
    email: str = ""


def parse_kinds(values: list[str] | None) -> list[str]:
    """`--export` values (repeated or comma-separated) as a list of known kinds, in order."""
    kinds: list[str] = []
    for value in values or []:
        for kind in value.split(","):
            kind = kind.strip().lower()
            if not kind:
                continue
            if kind not in KINDS:
                raise ValueError(f"--export must be one of {', '.join(KINDS)}, got {kind!r}")
            if kind not in kinds:
                kinds.append(kind)
    return kinds


def read_roster(path: Path) -> dict[str, Person]:
    """{student id: Person} from a roster CSV (see the module's docstring)."""
    path = Path(path)
    if not path.is_file():
        raise RosterError(f"--roster: no such file {path}")
    try:
        text = path.read_text(encoding="utf-8-sig")  # Excel writes a byte-order mark
    except UnicodeDecodeError as exc:
        raise RosterError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    rows = list(csv.reader(text.splitlines()))
    if not rows or not any(cell.strip() for cell in rows[0]):
        raise RosterError(
            f"{path}, line 1: no header; expected columns {', '.join(ROSTER_COLUMNS)}"
        )
    header = [cell.strip().lower() for cell in rows[0]]
    if "student" not in header:
        raise RosterError(
            f"{path}, line 1: missing column 'student' (the grader's student id); the header "
            f"has {', '.join(repr(h) for h in header)}; expected {', '.join(ROSTER_COLUMNS)}"
        )
    unknown = [h for h in header if h and h not in ROSTER_COLUMNS]
    if unknown:
        raise RosterError(
            f"{path}, line 1: unknown column {unknown[0]!r}; the columns are "
            f"{', '.join(ROSTER_COLUMNS)}"
        )
    people: dict[str, Person] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) > len(header):
            raise RosterError(
                f"{path}, line {line}: {len(row)} values for {len(header)} columns "
                f"({', '.join(header)})"
            )
        values = dict(zip(header, (cell.strip() for cell in row), strict=False))
        student = values.get("student", "")
        if not student:
            raise RosterError(f"{path}, line {line}: empty column 'student'")
        if student in people:
            raise RosterError(f"{path}, line {line}: student {student!r} is listed twice")
        people[student] = Person(**{k: values.get(k, "") for k in ROSTER_COLUMNS})
    return people


def _num(x: float) -> str:
    text = f"{x:.4f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


@dataclass
class Table:
    """What an export needs: students, assignments, maxima, and each (student, assignment)'s
    score, status and problems."""

    students: list[str]
    names: dict[str, str]  # the name as found in the submissions
    assignments: list[str]
    titles: dict[str, str]
    max_score: dict[str, float]
    scores: dict[tuple[str, str], float]
    notes: dict[tuple[str, str], str]
    # the student's key in the LMS the graded file came from (graders.intake.lms.identify):
    canvas_ids: dict[str, str] = field(default_factory=dict)  # student -> Canvas user id
    participants: dict[tuple[str, str], str] = field(default_factory=dict)  # -> Moodle participant


def table(
    results: list[dict],
    assignments: list[str],
    max_score: dict[str, float],
    final: dict[tuple[str, str], tuple[float, float]] | None = None,
) -> Table:
    """The export's content from the grader's results; `final` (gradebook.final_scores) replaces
    the grader's score of each submission it holds."""
    from graders.intake.lms import identify

    students = sorted({r["student"] for r in results})
    names, scores, notes, canvas_ids, participants = {}, {}, {}, {}, {}
    for r in results:
        key = (r["student"], r["assignment"])
        found = identify(r.get("source", ""))
        if found is not None and found.lms == "canvas" and found.key.isdigit():
            canvas_ids.setdefault(r["student"], found.key)
        elif found is not None and found.lms == "moodle":
            participants[key] = found.key
        names.setdefault(r["student"], r.get("name") or r["student"])
        score = float(r["score"])
        if final and key in final:
            score = final[key][0]
        scores[key] = score
        note = f"{_num(score)} / {_num(float(r['max_score']))} ({r['status']})"
        if final and key in final and final[key][0] != float(r["score"]):
            note += f"; the autograder gave {_num(float(r['score']))}, changed by hand"
        if r.get("problems"):
            note += ". " + " | ".join(r["problems"])
        notes[key] = note
    return Table(
        students,
        names,
        list(assignments),
        {a: assignment_title(a) for a in assignments},
        {a: float(max_score.get(a, 0.0)) for a in assignments},
        scores,
        notes,
        canvas_ids,
        participants,
    )


def assignment_title(assignment: str) -> str:
    """The assignment's title: the first Markdown heading of its release, else its id."""
    import nbformat

    from graders.run import pipeline

    path = pipeline.REPO / "notebooks" / assignment / f"{assignment}.ipynb"
    try:
        nb = nbformat.read(path, 4)
    except (OSError, ValueError):
        return assignment
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            if line.startswith("# "):
                return line[2:].strip() or assignment
    return assignment


def _person(student: str, tab: Table, roster: dict[str, Person] | None) -> Person:
    found = (roster or {}).get(student)
    if found is None:
        return Person(student, name=tab.names.get(student, student))
    return found


def write_canvas(tab: Table, path: Path, roster: dict[str, Person] | None = None) -> Path:
    columns = [f"{tab.titles[a]} ({a})" for a in tab.assignments]
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow([*CANVAS_FIXED, *columns])
        w.writerow(
            [POINTS_POSSIBLE, "", "", "", "", *(_num(tab.max_score[a]) for a in tab.assignments)]
        )
        for s in tab.students:
            p = _person(s, tab, roster)
            sis_id = p.sis_id or ("" if p.lms_id or s in tab.canvas_ids else s)
            scores = [
                _num(tab.scores[(s, a)]) if (s, a) in tab.scores else "" for a in tab.assignments
            ]
            lms_id = p.lms_id or tab.canvas_ids.get(s, "")
            w.writerow([p.name or s, lms_id, sis_id, p.login or s, p.section, *scores])
    return Path(path)


def write_moodle(tab: Table, path: Path, roster: dict[str, Person] | None = None) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        items = [col for a in tab.assignments for col in (a, f"{a} (feedback)")]
        w.writerow(["Full name", "ID number", "Username", "Email address", *items])
        for s in tab.students:
            p = _person(s, tab, roster)
            cells = []
            for a in tab.assignments:
                got = (s, a) in tab.scores
                cells += [_num(tab.scores[(s, a)]) if got else "", tab.notes.get((s, a), "")]
            w.writerow([p.name or s, p.lms_id or s, p.login or s, p.email, *cells])
    return Path(path)


WORKSHEET = (
    "Identifier",
    "Full name",
    "Email address",
    "Status",
    "Grade",
    "Maximum Grade",
    "Grade can be changed",
    "Last modified (submission)",
    "Last modified (grade)",
    "Feedback comments",
)
PARTICIPANT = "Participant "  # Moodle's string hiddenuser, which the importer strips


def write_moodle_worksheet(
    tab: Table, out: Path, roster: dict[str, Person] | None = None
) -> list[Path]:
    """grades_moodle-worksheet_<assignment>.csv for each assignment with a student whose Moodle
    participant id is known; students without one are left out (Moodle could not place them)."""
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    paths = []
    for a in tab.assignments:
        rows = [s for s in tab.students if (s, a) in tab.participants and (s, a) in tab.scores]
        if not rows:
            continue
        path = Path(out) / f"grades_moodle-worksheet_{a}.csv"
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(WORKSHEET)
            for s in rows:
                p = _person(s, tab, roster)
                w.writerow(
                    [
                        f"{PARTICIPANT}{tab.participants[(s, a)]}",
                        p.name or s,
                        p.email,
                        "Submitted for grading",
                        _num(tab.scores[(s, a)]),
                        _num(tab.max_score[a]),
                        "Yes",
                        "",
                        when,
                        tab.notes.get((s, a), ""),
                    ]
                )
        paths.append(path)
    return paths


WRITERS = {"canvas": write_canvas, "moodle": write_moodle}


def write(
    kinds: list[str], tab: Table, out: Path, roster: dict[str, Person] | None = None
) -> list[Path]:
    """Write grades_<kind>.csv into `out` for each kind (and for moodle the grading worksheets,
    write_moodle_worksheet); returns the files."""
    paths = []
    for k in kinds:
        paths.append(WRITERS[k](tab, Path(out) / f"grades_{k}.csv", roster))
        if k == "moodle":  # and the worksheet of each assignment, where a download gave ids
            paths += write_moodle_worksheet(tab, out, roster)
    return paths
