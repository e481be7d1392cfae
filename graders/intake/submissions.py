"""Finding submissions in a folder, and making a submitted notebook safe and fair to grade.

Two layouts are understood:
    nbgrader:  PATH[/submitted]/<student>/<assignment>/<assignment>.ipynb
    flat:      PATH/<student>_<assignment>.ipynb   (an LMS export; any separator, any order)
               PATH/<student>.ipynb                with --assignment
Of several uploads of one student for one assignment (`01_x.ipynb`, `01_x (1).ipynb`, ...) the
newest file (modification time) is graded; the others are named in that student's problems.

Reading a submission is what Jupyter does: `nbformat.reads(text, as_version=4)`, so every
nbformat 4 minor, list-of-lines or string sources, outputs, widget state and attachments, and
nbformat 3 (upgraded) are read as the notebook they are. Then the tooling accidents of honest
students are repaired before nbgrader sees the notebook (`prepare`), each with a one-line note:
cell ids made unique (a cell copied and pasted), a test or locked cell that appears twice kept
once (the release's copy), an answer cell that appears twice run as written (both copies, in
order), and locked cells that were deleted put back.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import warnings
from pathlib import Path

import nbformat

from graders.intake.students import Submission as Submission
from graders.intake.students import student_id as student_id
from graders.isolation.tampering import (
    find_tampering as find_tampering,  # moved; importable here too
)

OLDER_UPLOAD = "older upload, not graded:"  # the start of the note naming an upload left out
IGNORED_FILE = "skipped, not the assignment's notebook:"  # the note naming a scratch notebook

_student_id = student_id  # the old name

# What an LMS or a browser appends to a file uploaded twice: " (1)", "-1", "-Copy1", "_v2"
_COPY_MARK = re.compile(r"^[\s_.-]*(\(\d+\)|\d{1,3}|v\d{1,3}|copy\s*\d*)$", re.IGNORECASE)


def _flat_name(stem: str, assignment: str) -> str:
    """The student part of a flat file name, without the assignment id and upload copy marks."""
    before, _, after = stem.partition(assignment)
    if _COPY_MARK.match(after) or not after.strip(" _.-"):
        after = ""
    return f"{before.strip(' _.-')} {after.strip(' _.-')}".strip()


def discover(
    path: Path, known: list[str], assignment: str | None = None, roster: dict | None = None
) -> tuple[list[Submission], list[str]]:
    """All submissions under `path` and a list of problems (files that could not be placed).

    A Canvas or Moodle download (a .zip, a folder of them, or unzipped) is read by
    graders.intake.lms, which maps each file to one student through `roster` ({student:
    exports.Person}).
    """
    from graders.intake import lms

    if (found := lms.discover(Path(path), known, assignment, roster)) is not None:
        return found
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"PATH must be a folder of submissions, got {path}")
    if (path / "submitted").is_dir():
        path = path / "submitted"
    found: list[tuple[str, str, Path]] = []  # (raw name, assignment, file)
    ignored: dict[tuple[str, str], tuple[Path, ...]] = {}  # scratch notebooks beside the upload
    problems = []
    for student_dir in sorted(p for p in path.iterdir() if p.is_dir()):
        for a_dir in sorted(p for p in student_dir.iterdir() if p.is_dir()):
            if a_dir.name not in known:
                if not a_dir.name.startswith("."):
                    problems.append(f"{a_dir}: not a course assignment ({', '.join(known)})")
                continue
            notebooks = sorted(a_dir.glob("*.ipynb"))
            if not notebooks:
                problems.append(f"{a_dir}: no notebook in this folder")
            uploads, skipped = assignment_notebooks(a_dir.name, notebooks)
            found += [(student_dir.name, a_dir.name, nb) for nb in uploads]
            if skipped:
                ignored[(student_id(student_dir.name), a_dir.name)] = tuple(skipped)
    for nb_path in sorted(path.glob("*.ipynb")):
        stem = nb_path.stem
        match = max((a for a in known if a in stem), key=len, default=None)
        if match is not None:
            raw = _flat_name(stem, match)
        elif assignment is not None:
            raw = stem
        else:
            problems.append(
                f"{nb_path.name}: no assignment id in the file name; pass --assignment "
                f"(one of {', '.join(known)})"
            )
            continue
        if not raw:
            problems.append(f"{nb_path.name}: no student name in the file name")
            continue
        found.append((raw, match or assignment, nb_path))
    if assignment is not None:
        found = [f for f in found if f[1] == assignment]
    groups: dict[tuple[str, str], list[tuple[str, Path]]] = {}
    for raw, a, nb_path in found:
        groups.setdefault((student_id(raw), a), []).append((raw, nb_path))
    subs = []
    for (sid, a), uploads in groups.items():
        newest_first = sorted(uploads, key=lambda u: _upload_order(u[1], a), reverse=True)
        (raw, graded), rest = newest_first[0], newest_first[1:]
        subs.append(
            Submission(sid, a, graded, tuple(p for _, p in rest), raw, ignored.get((sid, a), ()))
        )
    for (sid, a), skipped in ignored.items():
        if (sid, a) not in groups:
            names = ", ".join(p.name for p in skipped)
            problems.append(f"{sid}/{a}: no notebook of the assignment, only {names} (skipped)")
    subs.sort(key=lambda s: (s.student, known.index(s.assignment)))
    return subs, problems


def _upload_order(path: Path, assignment: str) -> tuple:
    """Newest first; on equal times the file named exactly <assignment>.ipynb, then by name."""
    return (path.stat().st_mtime_ns, path.name == f"{assignment}.ipynb", str(path))


@functools.cache
def release_grade_ids(assignment: str) -> frozenset[str]:
    """The nbgrader grade ids of the released notebook of `assignment` (empty when none)."""
    from graders.authoring.course import REPO

    path = REPO / "notebooks" / assignment / f"{assignment}.ipynb"
    return _grade_ids(path) if path.is_file() else frozenset()


def _grade_ids(path: Path) -> frozenset[str]:
    """The nbgrader grade ids a notebook file carries (empty for any file that is not one)."""
    try:
        raw = json.loads(Path(path).read_bytes().decode("utf-8-sig"))
        cells = raw.get("cells") or [c for ws in raw.get("worksheets", []) for c in ws["cells"]]
        return frozenset(
            str(gid)
            for c in cells
            if (gid := ((c.get("metadata") or {}).get("nbgrader") or {}).get("grade_id"))
        )
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return frozenset()


def assignment_notebooks(assignment: str, notebooks: list[Path]) -> tuple[list[Path], list[Path]]:
    """Of the notebooks in a student's assignment folder, the uploads of the assignment and the
    notebooks to skip.

    `nbgrader collect` copies the whole folder, so a scratch `Untitled.ipynb` or a notebook of
    the student's own often lies beside the real one. An upload is a notebook named with the
    assignment id (`01_x.ipynb`, `01_x (1).ipynb`, `01_x-Copy1.ipynb`); where there is none, a
    notebook that carries the release's nbgrader cells (renamed by the student). Every other
    notebook is skipped and named, as nbgrader's "Skipping unknown notebook" does.
    """
    named = [nb for nb in notebooks if assignment in nb.stem]
    if named:
        return named, [nb for nb in notebooks if nb not in named]
    ids = release_grade_ids(assignment)
    carrying = [nb for nb in notebooks if ids & _grade_ids(nb)]
    return carrying, [nb for nb in notebooks if nb not in carrying]


def upload_notes(sub: Submission) -> list[str]:
    """One line per notebook of `sub` that is not graded, after the notes of an LMS download
    (graders.intake.lms: submitted late, not in the roster): older uploads, then scratch
    notebooks."""
    return (
        [*sub.notes]
        + [
            f"{OLDER_UPLOAD} {other.name} (graded the newest upload, {sub.path.name})"
            for other in sub.others
        ]
        + [
            f"{IGNORED_FILE} {other.name} (not named {sub.assignment}.ipynb and without its cells; "
            "nbgrader skips it too)"
            for other in sub.ignored
        ]
    )


def attach_submission_info(results: list[dict], subs: list[Submission]) -> None:
    """Give each result the student's name as found, and name the uploads that were left out in
    its problems (replacing the notes of an earlier run, so they never pile up)."""
    by_key = {(s.student, s.assignment): s for s in subs}
    for res in results:
        sub = by_key.get((res["student"], res["assignment"]))
        notes = upload_notes(sub) if sub else []
        kept = [
            p
            for p in res.get("problems", [])
            if not p.startswith((OLDER_UPLOAD, IGNORED_FILE)) and p not in notes
        ]
        res["problems"] = notes + kept
        if sub and sub.name:
            res["name"] = sub.name


# ---------------------------------------------------------------------------------------------
# Reading a notebook
# ---------------------------------------------------------------------------------------------


def source_text(source) -> str:
    """A cell's source (or an output's text) as one string: nbformat's lists of lines joined."""
    if isinstance(source, list | tuple):
        return "".join(str(s) for s in source)
    return source if isinstance(source, str) else ""


def _invalid(why: str) -> ValueError:
    return ValueError(f"not a notebook Jupyter can open: {why}")


def _first_line(exc: Exception, limit: int = 200) -> str:
    text = str(getattr(exc, "message", None) or exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _read(path: Path) -> tuple[nbformat.NotebookNode, list[str]]:
    """nbformat.reads(as_version=4), upgraded to nbformat 4.5; notes on ids nbformat repaired."""
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise _invalid("the file is not UTF-8 text (a binary file, or another encoding)") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _invalid(f"the file is not JSON ({exc})") from None
    if not isinstance(raw, dict) or "nbformat" not in raw:
        raise _invalid("JSON, but not a notebook (no 'nbformat' field)")
    errors: dict = {}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            nb = nbformat.reads(text, as_version=4, capture_validation_error=errors)
            minor = nb.get("nbformat_minor", 0)
            if minor < 5:  # ids came with nbformat 4.5: give every cell one, as nbformat does
                nb = nbformat.v4.upgrade(nb, from_version=4, from_minor=minor)
                errors.clear()
                nbformat.validate(nb)
        except nbformat.ValidationError as exc:
            raise _invalid(_first_line(exc)) from None
        except Exception as exc:  # NBFormatError (nbformat 5, 2.x), a broken v3 worksheet ...
            raise _invalid(f"{type(exc).__name__}: {_first_line(exc)}") from None
    if errors.get("ValidationError") is not None:
        raise _invalid(_first_line(errors["ValidationError"]))
    repaired = [w for w in seen if w.category.__name__ == "DuplicateCellId"]
    notes = []
    if repaired:
        notes.append(
            f"{len(repaired)} cell(s) had the id of another cell (a cell copied and pasted); "
            "gave them new ids"
        )
    return nb, notes


def read_notebook(path: Path):
    """The notebook at `path` as nbformat 4.5; ValueError (the reason) when it is not one."""
    return _read(path)[0]


def read_submission(path: Path, release) -> tuple[nbformat.NotebookNode, list[str]]:
    """Read and `prepare` a submission: the notebook to grade and one note per repair made.

    Raises ValueError (one line, the reason) for a file that is not a notebook. This is what the
    worker calls in place of read_notebook + restore_locked_cells, so that the notes reach the
    result; read_notebook and restore_locked_cells alone repair the same, silently.
    """
    nb, notes = _read(path)
    return nb, notes + prepare(nb, release)


# ---------------------------------------------------------------------------------------------
# Repairs: what tooling does to an honest student's notebook
# ---------------------------------------------------------------------------------------------


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def _grade_id(cell) -> str | None:
    return _meta(cell).get("grade_id")


def _is_nbgrader_cell(cell) -> bool:
    meta = _meta(cell)
    return bool(meta.get("grade_id")) and bool(
        meta.get("grade") or meta.get("solution") or meta.get("locked") or meta.get("task")
    )


_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def unique_cell_ids(nb) -> int:
    """Give every cell a valid id no other cell has (the first keeps its own); returns how many."""
    seen: set[str] = set()
    changed = 0
    for idx, cell in enumerate(nb.cells):
        cid = cell.get("id")
        if isinstance(cid, str) and _ID.match(cid) and cid not in seen:
            seen.add(cid)
            continue
        base = re.sub(r"[^a-zA-Z0-9_-]", "-", cid)[:56] if isinstance(cid, str) and cid else ""
        base = base or f"cell-{idx:03d}"
        new, k = base, 1
        while new in seen:
            k += 1
            new = f"{base}-{k}"
        cell["id"] = new
        seen.add(new)
        changed += 1
    return changed


def _release_copy(nb, idxs: list[int], gid: str, release) -> int:
    """Of the cells `idxs` carrying `gid`, the one in the release's place, else an unedited one."""
    order = [_grade_id(c) for c in release.cells if _is_nbgrader_cell(c)]
    rel = next((c for c in release.cells if _grade_id(c) == gid), None)
    counts: dict[str, int] = {}
    for c in nb.cells:
        if _is_nbgrader_cell(c):
            counts[_grade_id(c)] = counts.get(_grade_id(c), 0) + 1
    where = {_grade_id(c): i for i, c in enumerate(nb.cells) if _is_nbgrader_cell(c)}
    lo, hi = -1, len(nb.cells)
    if gid in order:
        k = order.index(gid)
        prev = [g for g in order[:k] if counts.get(g) == 1]
        nxt = [g for g in order[k + 1 :] if counts.get(g) == 1]
        lo = where[prev[-1]] if prev else -1
        hi = where[nxt[0]] if nxt else len(nb.cells)

    def rank(i: int):
        in_place = lo < i < hi
        unedited = rel is not None and source_text(nb.cells[i].source) == source_text(rel.source)
        return (in_place, unedited, -i)

    return max(idxs, key=rank)


def _dedupe_grade_ids(nb, release) -> list[str]:
    """Cells that carry the same nbgrader grade_id (copied and pasted): one of each is kept.

    nbgrader would keep the last copy's metadata, blank the others' and then fail the whole
    notebook on the blank metadata (SchemaTooOldError). A locked or test cell is kept once, the
    release's copy; the other copies are removed. An answer cell is code the student wrote: all
    copies stay and run in order, the last one keeps the answer cell's metadata.
    """
    groups: dict[str, list[int]] = {}
    for i, cell in enumerate(nb.cells):
        if _is_nbgrader_cell(cell):
            groups.setdefault(_grade_id(cell), []).append(i)
    notes, drop = [], set()
    release_meta = {_grade_id(c): _meta(c) for c in release.cells if _is_nbgrader_cell(c)}
    for gid, idxs in groups.items():
        if len(idxs) < 2:
            continue
        meta = release_meta.get(gid) or _meta(nb.cells[idxs[-1]])
        n = len(idxs)
        if meta.get("solution") and not meta.get("locked"):
            for i in idxs[:-1]:
                del nb.cells[i].metadata["nbgrader"]
            notes.append(
                f"cell {gid}: the answer cell appears {n} times (copied and pasted); all copies "
                "ran in order, as written"
            )
            continue
        keep = _release_copy(nb, idxs, gid, release)
        drop.update(i for i in idxs if i != keep)
        kind = "test cell" if meta.get("grade") else "locked cell"
        notes.append(
            f"cell {gid}: the {kind} appears {n} times (copied and pasted); graded once, "
            "the release's copy"
        )
    if drop:
        nb.cells = [c for i, c in enumerate(nb.cells) if i not in drop]
    return notes


def _recover_metadata(nb, release) -> list[str]:
    """Give back the release's nbgrader metadata to cells that lost it; returns their grade ids.

    Some tools drop every cell's metadata on save: a git filter that cleans notebooks (nb-clean's
    default, `nb-clean add-filter`, so a notebook handed in through git), a collaborative editor.
    nbgrader would then see no test cells (every test restored at the top, before the student's
    code) and no answer cells: 0 points for honest work. A cell without nbgrader metadata is
    matched to a release cell whose metadata no cell carries, in this order:
      - by its cell id (such tools keep ids), of the same cell type;
      - a locked cell (instructions, tests) by its text, the release's exactly;
      - an answer cell by its place, between the matched cells that come before and after it
        in the release: the one cell there with the release's text (left as given), else the
        one cell there of its type that is not one of the release's ordinary cells as released.
    What matches nothing stays ordinary code (it still runs); a locked cell matched by id is then
    restored from the release like any edited one (_restore_release_cells).
    """
    wanted = [c for c in release.cells if _is_nbgrader_cell(c)]
    have = {_grade_id(c) for c in nb.cells if _meta(c)}
    missing = {_grade_id(c): c for c in wanted if _grade_id(c) not in have}
    if not missing:
        return []
    bare = [i for i, c in enumerate(nb.cells) if not _meta(c)]
    found: dict[int, str] = {}  # nb cell index -> grade id

    def claim(i: int, gid: str) -> None:
        found[i] = gid
        missing.pop(gid)

    def text(i: int) -> str:
        return source_text(nb.cells[i].get("source")).strip()

    by_id = {rel.get("id"): gid for gid, rel in missing.items() if rel.get("id")}
    for i in bare:
        gid = by_id.get(nb.cells[i].get("id"))
        if gid in missing and nb.cells[i].get("cell_type") == missing[gid].cell_type:
            claim(i, gid)
    for gid, rel in list(missing.items()):
        if _meta(rel).get("solution"):
            continue
        released = source_text(rel.source).strip()
        same = [
            i
            for i in bare
            if i not in found
            and nb.cells[i].get("cell_type") == rel.cell_type
            and text(i) == released
        ]
        if same:
            claim(same[0], gid)
    order = [_grade_id(c) for c in wanted]
    # the release's ordinary cells (imports, figures), as released: not an answer's place
    plain = {source_text(c.source).strip() for c in release.cells if not _is_nbgrader_cell(c)}
    place = {gid: i for i, gid in found.items()}
    place.update({_grade_id(c): i for i, c in enumerate(nb.cells) if _meta(c)})
    for gid, rel in list(missing.items()):
        if not _meta(rel).get("solution"):
            continue
        k = order.index(gid)
        prev = [g for g in order[:k] if g in place]
        nxt = [g for g in order[k + 1 :] if g in place]
        lo = place[prev[-1]] if prev else -1
        hi = place[nxt[0]] if nxt else len(nb.cells)
        start = order.index(prev[-1]) + 1 if prev else 0
        stop = order.index(nxt[0]) if nxt else len(order)
        if any(g in missing and g != gid for g in order[start:stop]):
            continue  # another lost cell between the same neighbours: which is which is a guess
        spots = [
            i
            for i in bare
            if lo < i < hi and i not in found and nb.cells[i].get("cell_type") == rel.cell_type
        ]
        stub = [i for i in spots if text(i) == source_text(rel.source).strip()]  # left as given
        spots = stub[:1] or [i for i in spots if text(i) not in plain]
        if len(spots) == 1:
            claim(spots[0], gid)
            place[gid] = spots[0]
    for i, gid in found.items():
        rel = next(c for c in wanted if _grade_id(c) == gid)
        nb.cells[i].setdefault("metadata", {})["nbgrader"] = copy.deepcopy(_meta(rel))
    return [found[i] for i in sorted(found)]


_NBGRADER_KEYS = ("grade", "grade_id", "locked", "points", "schema_version", "solution", "task")


def _set_type(cell, cell_type: str) -> None:
    """Make `cell` a cell of `cell_type` as nbformat would have written it."""
    cell["cell_type"] = cell_type
    if cell_type == "code":
        cell.setdefault("outputs", [])
        cell.setdefault("execution_count", None)
    else:
        cell.pop("outputs", None)
        cell.pop("execution_count", None)


def _points(meta: dict) -> str:
    try:
        return f"{float(meta.get('points') or 0):g}"
    except (TypeError, ValueError):
        return str(meta.get("points"))


def _restore_release_cells(nb, release) -> list[str]:
    """Every cell that carries nbgrader metadata made what the release says it is.

    nbgrader fails a whole notebook on one cell it cannot reconcile (a test cell turned into
    markdown with one key: "Inconsistent checksums"; a graded cell the release does not have:
    "the nbgrader metadata may be corrupted"; a schema_version it does not know), so one cell
    would cost the student every point. Here, as a fair grader does:
      - a locked cell of the release (instructions, test cells) gets back the release's type,
        source and metadata: the student's edit is not graded, the release's cell is;
      - an answer cell keeps the student's code, with the release's type and metadata;
      - a cell whose grade id the release does not have (added or pasted from another
        notebook) loses its nbgrader metadata: it runs as ordinary code, scores nothing, and any
        points it claims are reported.
    """
    by_id = {_grade_id(c): c for c in release.cells if _is_nbgrader_cell(c)}
    notes = []
    for cell in nb.cells:
        meta = _meta(cell)
        gid = meta.get("grade_id")
        if not meta:
            continue
        rel = by_id.get(gid)
        if rel is None:
            del cell.metadata["nbgrader"]
            if meta.get("grade") or meta.get("points"):
                notes.append(
                    f"cell {gid or '(no id)'}: not a cell of the release, but marked as graded "
                    f"({_points(meta)} points); ignored, its code ran ungraded"
                )
            continue
        want = _meta(rel)
        changed = []
        if cell.get("cell_type") != rel.cell_type:
            changed.append(f"turned into {cell.get('cell_type')}")
            _set_type(cell, rel.cell_type)
        if any(meta.get(k) != want.get(k) for k in _NBGRADER_KEYS):
            changed.append("given other nbgrader metadata")
        cell.metadata["nbgrader"] = copy.deepcopy(want)
        if want.get("locked") and not want.get("solution"):
            if source_text(cell.get("source")) != source_text(rel.source):
                changed.append("edited")
            cell["source"] = rel.source
        if changed:
            kind = (
                "test cell"
                if want.get("grade") and not want.get("solution")
                else "answer cell"
                if want.get("solution")
                else "locked cell"
            )
            notes.append(
                f"cell {gid}: the {kind} was {' and '.join(changed)}; restored from the release"
            )
    return notes


def restore_locked_cells(nb, release) -> list[str]:
    """Put back locked cells of the release that the student deleted; returns what was restored.

    nbgrader overwrites edited locked cells from the gradebook, but a deleted test cell would simply
    not run. Restoring it keeps the grade honest (its tests run) and the student is told. Cells
    that appear twice are first made single (see _dedupe_grade_ids), as nbgrader needs.
    """
    _dedupe_grade_ids(nb, release)
    _restore_release_cells(nb, release)
    present = {_grade_id(c) for c in nb.cells}
    restored = []
    order = [_grade_id(c) for c in release.cells]
    for idx, cell in enumerate(release.cells):
        gid = _grade_id(cell)
        meta = _meta(cell)
        if gid is None or gid in present or not (meta.get("locked") or meta.get("grade")):
            continue
        # insert after the nearest earlier release cell that the submission still has
        pos = 0
        for prev in reversed(order[:idx]):
            where = [i for i, c in enumerate(nb.cells) if prev and _grade_id(c) == prev]
            if where:
                pos = where[0] + 1
                break
        nb.cells.insert(pos, copy.deepcopy(cell))
        present.add(gid)
        restored.append(gid)
    unique_cell_ids(nb)  # a restored cell brings the release's id, which a student cell may have
    return restored


def prepare(nb, release) -> list[str]:
    """Repair what tooling did to an honest student's notebook; one line per repair.

    Cell ids made unique, nbgrader metadata a tool dropped given back (_recover_metadata), grade
    ids that appear twice made single (_dedupe_grade_ids), the release's cells restored and cells
    it does not have ungraded (_restore_release_cells), deleted locked cells put back. The
    notebook is changed in place; what the student wrote is kept.
    """
    notes = []
    if unique_cell_ids(nb):
        notes.append("cells had the id of another cell (a cell copied and pasted); gave new ids")
    recovered = _recover_metadata(nb, release)
    if recovered:
        n = len(recovered)
        named = ", ".join(recovered) if n <= 4 else f"{', '.join(recovered[:3])} and {n - 3} more"
        notes.append(
            f"{n} cells had lost their nbgrader metadata (a tool that drops cell metadata, such "
            f"as a git filter that cleans notebooks); matched to the release's cells: {named}"
        )
    notes += _dedupe_grade_ids(nb, release)
    notes += _restore_release_cells(nb, release)
    notes += [
        f"cell {gid}: locked cell was deleted; restored from the release"
        for gid in restore_locked_cells(nb, release)
    ]
    return notes


def _editable_code(nb) -> list[str]:
    """The sources of the code cells a student may edit (answer cells and cells of their own),
    stripped, without the empty ones."""
    found = []
    for cell in nb.cells:
        meta = _meta(cell)
        if cell.get("cell_type") != "code" or (meta.get("locked") and not meta.get("solution")):
            continue
        text = source_text(cell.get("source")).strip()
        if text:
            found.append(text)
    return found


def is_untouched(nb, release) -> bool:
    """True when the student wrote no code: every code cell they may edit is as released.

    Run after `prepare` (which restores the release's locked cells); outputs, markdown and
    cell order are not looked at, so a notebook that was only opened, run and saved is
    untouched, and one with a single line of the student's own is not.
    """
    return _editable_code(nb) == _editable_code(release)


# ---------------------------------------------------------------------------------------------
# Long outputs, one-line causes (tampering: graders/isolation/tampering.py)
# ---------------------------------------------------------------------------------------------


def truncate_outputs(nb, limit: int = 64_000) -> list[str]:
    """Cut stream and text outputs longer than `limit` characters; returns the cells whose
    output was longer, each named as the feedback page names it: a graded cell by its grade_id
    ("Grade cell: <id>"), any other by its prompt ("In [22]", the cell's execution count).

    A graded test cell's output was already cut by the grader (graders/isolation/remote.py keeps the
    first part and notes "[N characters printed in all]"): it counts by what was printed, so a
    long output is reported the same way in every cell."""
    printed_in_all = re.compile(r"\[([\d,]+) characters printed in all\]")
    cut = []
    for idx, cell in enumerate(nb.cells):
        count = cell.get("execution_count")
        label = _grade_id(cell) or (f"In [{count}]" if count else f"#{idx}")
        for out in cell.get("outputs", []):
            text = source_text(out.get("text"))
            if len(text) > limit:
                out["text"] = text[:limit] + f"\n... [output cut: {len(text):,} characters]\n"
                cut.append(label)
            elif any(int(n.replace(",", "")) > limit for n in printed_in_all.findall(text)):
                cut.append(label)
            data = out.get("data", {})
            plain = source_text(data.get("text/plain"))
            if len(plain) > limit:
                data["text/plain"] = plain[:limit] + "\n... [output cut]"
                cut.append(label)
            if len(out.get("traceback", [])) > 200:
                out["traceback"] = out["traceback"][:100] + ["... [traceback cut]"]
    return sorted(set(cut))


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# The last line of a traceback: "KeyError: 'grade_id'", "nbformat.reader.NotJSONError: ..."
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b:?")
_FRAME = re.compile(r'^File "(?P<file>[^"]+)", line (?P<line>\d+)')
_LOG_ERROR = re.compile(r"^\[(?:\w+ \| )?(?:ERROR|CRITICAL)\]\s*(?P<msg>.*)")
# nbgrader's closing words, which say nothing about the cause
_NOISE = (
    "Please see the the above traceback",
    "Please see the above traceback",
    "There was an error",
)


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cause_line(text: str, limit: int = 300) -> str:
    """The one line of a log or traceback that names the cause.

    The last exception of a traceback (with the file it was raised in), else the first error
    message of an nbgrader log (its continuation lines joined), else the last line.
    """
    lines = [_ANSI.sub("", ln).rstrip() for ln in str(text).splitlines()]
    stripped = [ln.strip() for ln in lines]
    for i in range(len(stripped) - 1, -1, -1):
        ln = stripped[i]
        if not _EXCEPTION.match(ln) or any(n in ln for n in _NOISE):
            continue
        for more in stripped[i + 1 :]:  # a message that goes on over several lines
            if not more or more.startswith(("File ", "Traceback", "During handling", "[")):
                break
            ln += " " + more
        ln = re.sub(r"^(?:[A-Za-z_]\w*\.)+(?=[A-Z]\w*:)", "", ln)  # nbgrader.x.y.Error -> Error
        where = next((m for m in map(_FRAME.match, reversed(stripped[:i])) if m), None)
        if where:
            path = where["file"].split("site-packages/")[-1]
            ln += f" (in {Path(path).name if path.startswith('/') else path}, line {where['line']})"
        return _short(ln, limit)
    for i, ln in enumerate(stripped):
        m = _LOG_ERROR.match(ln)
        if not m or not m["msg"] or any(n in m["msg"] for n in _NOISE):
            continue
        msg = [m["msg"]]
        for cont, raw in zip(stripped[i + 1 :], lines[i + 1 :], strict=True):
            if not cont or not raw[:1].isspace():
                break
            msg.append(cont)
        return _short(" ".join(msg), limit)
    rest = [ln for ln in stripped if ln]
    return _short(rest[-1], limit) if rest else "no message"


def one_line(problem: str) -> str:
    """A problem as one line: `<what failed>: <the cause>` out of a multi-line log tail."""
    if "\n" not in problem:
        return problem
    head, sep, rest = problem.partition(": ")
    if sep and "\n" not in head and len(head) <= 60:
        return f"{head}: {cause_line(rest)}"
    return cause_line(problem)
