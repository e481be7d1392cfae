"""Canvas's and Moodle's "download all submissions" archives, read as the LMSs write them.

The archives are built as graders/intake/lms.py's docstring says each LMS builds them (Canvas:
lib/content_zipper.rb; Moodle: mod/assign/locallib.php download_submissions): member names,
flat or in folders, a LATE marker, Canvas's `-N` for a file uploaded again, Moodle's
`onlinetext` folder beside the file folder, names with accents (composed and decomposed),
hyphens and apostrophes. The notebooks are the release, read and written with nbformat as
Jupyter saves them. The fast tests call discover(); one test grades a Canvas zip end to end.
"""

from __future__ import annotations

import csv
import io
import unicodedata
import zipfile
from pathlib import Path

import nbformat
import pytest

from graders.intake import lms
from graders.intake.submissions import attach_submission_info, discover, student_id
from graders.outputs import exports
from graders.run import pipeline

A = "01_online_softmax"
KNOWN = pipeline.assignments()
RELEASE = pipeline.REPO / "notebooks" / A / f"{A}.ipynb"

pytestmark = pytest.mark.skipif(A not in KNOWN, reason="notebook 01 missing")


def _notebook(attempt: int, nb=None) -> bytes:
    """The release (or `nb`) as Jupyter saves it, with a student's line in its first answer cell
    so that each attempt is a different file."""
    nb = nbformat.read(RELEASE, as_version=4) if nb is None else nb
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source += f"\n# attempt {attempt}\n"
            break
    buf = io.StringIO()
    nbformat.write(nb, buf)
    return buf.getvalue().encode("utf-8")


def _zip(path: Path, members: list[tuple[str, bytes | None, tuple]]) -> Path:
    """A zip of (name, data, date_time); data None: a folder entry."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data, when in members:
            info = zipfile.ZipInfo(name, date_time=when)
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, b"" if data is None else data)
    return path


T0 = (2025, 3, 4, 10, 0, 0)
T1 = (2025, 3, 4, 11, 30, 0)
T2 = (2025, 3, 5, 9, 15, 0)

# Canvas: <sortable name lowercased, word characters only>[_LATE]_<user id>_<file id>_<file>
CANVAS = [
    ("garcíaana_1001_880001_01_online_softmax.ipynb", 1),
    ("chenwei_LATE_1003_880017_01_online_softmax.ipynb", 2),
    ("obriensmithseán_1004_880020_01_online_softmax.ipynb", 3),
    ("obriensmithseán_1004_880031_01_online_softmax-1.ipynb", 4),
    ("obriensmithseán_1004_880032_01_online_softmax-2.ipynb", 5),
    ("ngzoë_1005_text.html", None),  # a text entry: nothing to grade
]

ROSTER = [
    ("student", "name", "lms_id", "sis_id", "login", "section", "email"),
    ("agarcia", "García, Ana", "1001", "S1001", "agarcia", "A", "ana@example.org"),
    ("wchen", "Chen, Wei", "1003", "S1003", "wchen", "A", "wei@example.org"),
    ("sobrien", "O'Brien-Smith, Seán", "1004", "S1004", "sobrien", "B", "sean@example.org"),
]


def _roster(tmp_path: Path) -> Path:
    path = tmp_path / "roster.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows(ROSTER)
    return path


def _canvas_zip(tmp_path: Path, name="course-01-online-softmax_submissions.zip") -> Path:
    members = [(m, _notebook(k) if k else b"<p>my answer</p>", T0) for m, k in CANVAS]
    return _zip(tmp_path / name, members)


def _by_id(subs):
    assert len({(s.student, s.assignment) for s in subs}) == len(subs)  # one per student
    return {s.student: s for s in subs}


# ---------------------------------------------------------------------------------------------
# Canvas
# ---------------------------------------------------------------------------------------------


def test_canvas_zip_one_submission_per_student_ids_from_the_roster(tmp_path):
    people = exports.read_roster(_roster(tmp_path))
    subs, problems = discover(_canvas_zip(tmp_path), KNOWN, roster=people)
    got = _by_id(subs)
    assert set(got) == {"agarcia", "wchen", "sobrien"}  # Zoë wrote text: nothing to grade
    assert {s.assignment for s in subs} == {A}
    assert got["agarcia"].name == "García, Ana" and got["sobrien"].name == "O'Brien-Smith, Seán"
    assert got["wchen"].late and not got["agarcia"].late
    assert lms.LATE_NOTE == "submitted late (Canvas LATE marker)"
    assert got["wchen"].notes == (lms.LATE_NOTE,)
    # the latest resubmission (highest -N) is graded, the others named
    sean = got["sobrien"]
    assert sean.path.name == "obriensmithseán_1004_880032_01_online_softmax-2.ipynb"
    assert sean.path.read_bytes() == _notebook(5)
    assert sorted(p.name for p in sean.others) == [
        "obriensmithseán_1004_880020_01_online_softmax.ipynb",
        "obriensmithseán_1004_880031_01_online_softmax-1.ipynb",
    ]
    assert got["agarcia"].path.read_bytes() == _notebook(1) and got["agarcia"].others == ()
    assert (got["wchen"].lms, got["wchen"].lms_key) == ("canvas", "1003")
    # Zoë's text entry is named, with her clean id, as having no notebook
    assert problems == [
        "ngzoë_1005: no notebook named like an assignment in the submission (ngzoë_1005_text.html)"
    ]


def test_canvas_without_roster_ids_are_stable_across_late_and_resubmission(tmp_path):
    subs, _ = discover(_canvas_zip(tmp_path), KNOWN)
    got = _by_id(subs)
    assert set(got) == {"garcíaana_1001", "chenwei_1003", "obriensmithseán_1004"}
    assert not any("LATE" in s.student or "late" in s.student for s in subs)
    assert got["chenwei_1003"].late and got["chenwei_1003"].name == "chenwei"
    assert got["obriensmithseán_1004"].path.name.endswith("-2.ipynb")
    assert got["chenwei_1003"].notes == (lms.LATE_NOTE,)  # no roster: no "not in the roster"


def test_late_and_older_uploads_reach_the_students_problems_once(tmp_path):
    subs, _ = discover(_canvas_zip(tmp_path), KNOWN)
    results = [
        {"student": s.student, "assignment": s.assignment, "problems": ["cell x: y"]} for s in subs
    ]
    attach_submission_info(results, subs)
    attach_submission_info(results, subs)  # a second run: not doubled
    by = {r["student"]: r["problems"] for r in results}
    assert by["chenwei_1003"] == [lms.LATE_NOTE, "cell x: y"]
    assert by["obriensmithseán_1004"][:2] == [
        f"older upload, not graded: {n} (graded the newest upload, "
        "obriensmithseán_1004_880032_01_online_softmax-2.ipynb)"
        for n in (
            "obriensmithseán_1004_880031_01_online_softmax-1.ipynb",
            "obriensmithseán_1004_880020_01_online_softmax.ipynb",
        )
    ]


@pytest.mark.parametrize("form", ["zip", "folder of zips", "unzipped", "unzipped NFD"])
def test_canvas_download_in_every_form(tmp_path, form):
    (tmp_path / "dl").mkdir()
    z = _canvas_zip(tmp_path / "dl", "x.zip")
    path = z
    if form == "folder of zips":
        path = z.parent
    elif form.startswith("unzipped"):
        path = tmp_path / "unzipped"
        with zipfile.ZipFile(z) as zf:
            for info in zf.infolist():
                name = info.filename
                if form.endswith("NFD"):  # as macOS writes file names
                    name = unicodedata.normalize("NFD", name)
                (path / name).parent.mkdir(parents=True, exist_ok=True)
                (path / name).write_bytes(zf.read(info))
    people = exports.read_roster(_roster(tmp_path))
    subs, _ = discover(path, KNOWN, roster=people)
    assert sorted(s.student for s in subs) == ["agarcia", "sobrien", "wchen"]
    assert _by_id(subs)["sobrien"].path.read_bytes() == _notebook(5)


def test_canvas_names_without_the_utf8_flag_are_read_as_utf8(tmp_path):
    """A zip writer that stores UTF-8 names without setting the flag (bit 11): read as UTF-8."""
    z = _canvas_zip(tmp_path)
    data = bytearray(z.read_bytes())
    with zipfile.ZipFile(z) as zf:
        infos = zf.infolist()
        offsets = [i.header_offset for i in infos]
    for off in offsets:  # local headers: the flags' high byte at +7
        data[off + 7] &= ~0x08
    pos = data.find(b"PK\x01\x02")
    while pos != -1:  # central directory: the flags' high byte at +9
        data[pos + 9] &= ~0x08
        pos = data.find(b"PK\x01\x02", pos + 4)
    z.write_bytes(bytes(data))
    with zipfile.ZipFile(z) as zf:
        assert not any(i.flag_bits & 0x800 for i in zf.infolist())
        assert not any(i.filename.startswith("garcíaana") for i in zf.infolist())
    subs, _ = discover(z, KNOWN, roster=exports.read_roster(_roster(tmp_path)))
    assert sorted(s.student for s in subs) == ["agarcia", "sobrien", "wchen"]


# ---------------------------------------------------------------------------------------------
# Moodle
# ---------------------------------------------------------------------------------------------

# (full name as Moodle writes it, participant id): clean_filename drops the apostrophe
MOODLE = [("Ana García", "2341"), ("Wei Chen", "2342"), ("Seán OBrien-Smith", "2343")]


def _moodle_zip(tmp_path: Path, folders: bool, nfd: bool = False, extra=()) -> Path:
    members = []
    for k, (name, pid) in enumerate([*MOODLE, *extra]):
        name = unicodedata.normalize("NFD", name) if nfd else name
        files = f"{name}_{pid}_assignsubmission_file_"
        text = f"{name}_{pid}_assignsubmission_onlinetext_"
        sep = "/" if folders else ""
        if folders:
            members += [(f"{files}/", None, T0), (f"{text}/", None, T0)]
        members.append((f"{files}{sep}{A}.ipynb", _notebook(10 + k), T0))
        members.append((f"{text}{sep}onlinetext.html", b"<p>see the notebook</p>", T0))
        if name.startswith("Wei"):  # uploaded again: Moodle's file manager names it (1)
            members.append((f"{files}{sep}{A} (1).ipynb", _notebook(20), T2))
    return _zip(tmp_path / f"moodle-{folders}-{nfd}.zip", members)


@pytest.mark.parametrize("folders", [True, False], ids=["folders", "flat"])
@pytest.mark.parametrize("nfd", [False, True], ids=["NFC", "NFD"])
def test_moodle_download_ids_from_the_roster_by_name(tmp_path, folders, nfd):
    people = exports.read_roster(_roster(tmp_path))
    subs, problems = discover(_moodle_zip(tmp_path, folders, nfd), KNOWN, roster=people)
    got = _by_id(subs)
    assert set(got) == {"agarcia", "wchen", "sobrien"}
    assert problems == []
    assert got["sobrien"].name == "O'Brien-Smith, Seán"  # the roster's spelling
    assert (got["sobrien"].lms, got["sobrien"].lms_key) == ("moodle", "2343")
    wei = got["wchen"]
    assert (
        wei.path.name == f"{A} (1).ipynb" if folders else wei.path.name.endswith(f"{A} (1).ipynb")
    )
    assert wei.path.read_bytes() == _notebook(20)
    assert [p.name.endswith(f"{A}.ipynb") for p in wei.others] == [True]
    assert not any(s.late for s in subs)


def test_moodle_without_roster_and_a_student_not_in_the_roster(tmp_path):
    z = _moodle_zip(tmp_path, True, extra=[("Zoë Ng", "2399"), ("Ana García", "2400")])
    subs, problems = discover(z, KNOWN)
    ids = {s.lms_key: s.student for s in subs}
    assert ids["2342"] == student_id("Wei Chen") and ids["2399"] == student_id("Zoë Ng")
    # two participants with one name: each keeps an id of their own
    assert ids["2341"] != ids["2400"] and len(set(ids.values())) == len(ids)
    people = exports.read_roster(_roster(tmp_path))
    subs, problems = discover(z, KNOWN, roster=people)
    zoe = next(s for s in subs if s.lms_key == "2399")
    assert zoe.student == student_id("Zoë Ng") and zoe.name == "Zoë Ng"
    assert zoe.notes and zoe.notes[0].startswith(lms.NOT_IN_ROSTER)
    # the two Ana Garcías both match roster student agarcia: neither is given her id
    assert "agarcia" not in {s.student for s in subs}
    assert any("agarcia" in p and "Ana García (2341)" in p for p in problems)


def test_moodle_download_without_notebooks_says_what_it_found(tmp_path):
    members = [
        (f"{n}_{pid}_assignsubmission_onlinetext_/onlinetext.html", b"<p>hi</p>", T0)
        for n, pid in MOODLE
    ]
    z = _zip(tmp_path / "text-only.zip", members)
    with pytest.raises(ValueError, match="found a Moodle folder-per-student download") as exc:
        discover(z, KNOWN)
    assert "no notebook named like an assignment" in str(exc.value)
    assert "onlinetext.html" in str(exc.value)


# ---------------------------------------------------------------------------------------------
# Unsafe archives, and what is not an LMS download
# ---------------------------------------------------------------------------------------------


def test_zip_slip_members_are_skipped_and_named(tmp_path):
    members = [(m, _notebook(k) if k else b"x", T0) for m, k in CANVAS]
    members += [
        ("../garcíaana_1001_990001_01_online_softmax.ipynb", _notebook(9), T1),
        ("/tmp/garcíaana_1001_990002_01_online_softmax.ipynb", _notebook(9), T1),
    ]
    (tmp_path / "inner").mkdir()
    z = _zip(tmp_path / "inner" / "slip.zip", members)
    subs, problems = discover(z, KNOWN)
    assert sum("absolute or '..' path; skipped" in p for p in problems) == 2
    ana = _by_id(subs)["garcíaana_1001"]
    assert ana.path.read_bytes() == _notebook(1) and ana.others == ()
    assert not list(tmp_path.glob("*.ipynb"))  # nothing written beside the zip's folder


def test_a_zip_bomb_stops_with_the_limit(tmp_path):
    z = _canvas_zip(tmp_path)
    with pytest.raises(ValueError, match="more than the 0.1 MiB limit"):
        lms.discover(z, KNOWN, max_bytes=100 * 1024)


def test_a_zip_that_is_no_lms_download_and_other_layouts(tmp_path):
    z = _zip(tmp_path / "photos.zip", [("holiday.jpg", b"\xff\xd8", T0)])
    with pytest.raises(ValueError, match="not a Canvas or Moodle download .*holiday.jpg") as exc:
        discover(z, KNOWN)
    assert "understood:" in str(exc.value)
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / f"alice_{A}.ipynb").write_bytes(_notebook(1))
    assert lms.discover(flat, KNOWN) is None  # graders.intake.submissions reads it
    subs, _ = discover(flat, KNOWN)
    assert [s.student for s in subs] == ["alice"]


def test_names_parse_as_documented():
    up = lms.parse_canvas("chenwei_LATE_1003_880017_01_online_softmax-1.ipynb")
    assert (up.who, up.key, up.late, up.filename) == (
        "chenwei",
        "1003",
        True,
        "01_online_softmax-1.ipynb",
    )
    anon = lms.parse_canvas("LATE_anon_x7Kq2_880017_01_online_softmax.ipynb")
    assert (anon.who, anon.key, anon.late) == ("", "anon_x7Kq2", True)
    assert lms.parse_canvas(f"alice_{A}.ipynb") is None
    assert lms.parse_canvas(f"Ana María_2024_01_{A}.ipynb") is None
    up = lms.parse_moodle(f"Seán OBrien-Smith_2343_assignsubmission_file_/sub/{A}.ipynb")
    assert (up.who, up.key, up.plugin, up.filename) == (
        "Seán OBrien-Smith",
        "2343",
        "file",
        f"{A}.ipynb",
    )
    assert lms.split_copy(f"{A}-2") == (A, 2) and lms.split_copy(f"{A} (1)") == (A, 1)
    assert lms.assignment_of(f"{A}-1.ipynb", KNOWN, None) == (A, 1)
    assert lms.name_key("O'Brien-Smith, Seán") == lms.name_key("Seán OBrien-Smith")
    assert lms.name_key(unicodedata.normalize("NFD", "Ana  García")) == lms.name_key("garcía, ana")


# ---------------------------------------------------------------------------------------------
# Exports: Canvas's ID and Moodle's grading worksheet from the download
# ---------------------------------------------------------------------------------------------


def _results(subs, score=3.0):
    return [
        {
            "student": s.student,
            "assignment": s.assignment,
            "source": str(s.path),
            "score": score,
            "max_score": 7.0,
            "status": "graded",
            "problems": list(s.notes),
            "name": s.name,
        }
        for s in subs
    ]


def test_moodle_worksheet_is_keyed_by_participant(tmp_path):
    people = exports.read_roster(_roster(tmp_path))
    subs, _ = discover(_moodle_zip(tmp_path, True), KNOWN, roster=people)
    tab = exports.table(_results(subs), [A], {A: 7.0})
    paths = exports.write(["moodle"], tab, tmp_path, people)
    assert [p.name for p in paths] == ["grades_moodle.csv", f"grades_moodle-worksheet_{A}.csv"]
    rows = list(csv.DictReader(open(paths[1], encoding="utf-8")))
    assert list(rows[0]) == list(exports.WORKSHEET)
    by = {r["Identifier"]: r for r in rows}
    assert set(by) == {f"Participant {pid}" for _, pid in MOODLE}
    sean = by["Participant 2343"]
    assert (sean["Full name"], sean["Email address"]) == ("O'Brien-Smith, Seán", "sean@example.org")
    assert (sean["Grade"], sean["Maximum Grade"]) == ("3", "7")
    assert sean["Last modified (grade)"][:4].isdigit() and sean["Feedback comments"].startswith(
        "3 / 7"
    )


def test_canvas_export_uses_the_canvas_user_id_of_the_download(tmp_path):
    subs, _ = discover(_canvas_zip(tmp_path), KNOWN)  # no roster
    tab = exports.table(_results(subs), [A], {A: 7.0})
    (path,) = exports.write(["canvas"], tab, tmp_path)
    body = list(csv.reader(open(path, encoding="utf-8")))[2:]
    ids = {r[0]: r[1] for r in body}
    assert ids == {"chenwei": "1003", "garcíaana": "1001", "obriensmithseán": "1004"}
    assert all(r[2] == "" for r in body)  # no made-up SIS User ID beside a real Canvas ID


# ---------------------------------------------------------------------------------------------
# End to end: a Canvas zip graded, grades and LMS files written
# ---------------------------------------------------------------------------------------------


def _sandbox_kw() -> dict:
    """Grade in the bubblewrap sandbox where one can be made, else explicitly without it."""
    from graders.isolation import sandbox

    return {"sandbox": sandbox.probe() is None}


@pytest.mark.notebooks
@pytest.mark.xdist_group("grading")
def test_a_canvas_zip_is_graded_and_exported(tmp_path):
    from graders.grade import grade

    solved = io.StringIO()
    nbformat.write(pipeline.solved_notebook(A), solved)
    release = io.StringIO()
    nbformat.write(nbformat.read(RELEASE, as_version=4), release)
    z = _zip(
        tmp_path / "course-softmax_submissions.zip",
        [
            (f"garcíaana_1001_880001_{A}.ipynb", solved.getvalue().encode(), T0),
            (f"chenwei_LATE_1003_880017_{A}.ipynb", release.getvalue().encode(), T1),
        ],
    )
    out = tmp_path / "graded"
    outcome = grade(
        z,
        out,
        jobs=1,
        progress=False,
        roster=_roster(tmp_path),
        exports=["canvas", "moodle"],
        **_sandbox_kw(),
    )
    by = {r["student"]: r for r in outcome.results}
    assert set(by) == {"agarcia", "wchen", "sobrien"}  # the roster is the class
    assert by["agarcia"]["score"] == by["agarcia"]["max_score"] > 0
    assert by["wchen"]["score"] < by["wchen"]["max_score"]
    assert by["wchen"]["status"] == "untouched"  # the release handed back late, unchanged
    assert by["sobrien"]["status"] == "missing" and by["sobrien"]["score"] == 0
    grades = {r["student"]: r for r in csv.DictReader(open(out / "grades.csv", encoding="utf-8"))}
    assert set(grades) == {"agarcia", "wchen", "sobrien"}
    assert grades["agarcia"]["name"] == "García, Ana"
    assert float(grades["agarcia"][A]) == by["agarcia"]["max_score"]
    assert lms.LATE_NOTE in grades["wchen"]["problems"]
    assert grades["sobrien"]["status"] == "missing"
    assert float(grades["sobrien"]["max_total"]) == by["agarcia"]["max_score"]
    canvas = list(csv.reader(open(out / "grades_canvas.csv", encoding="utf-8")))
    rows = {r[1]: r for r in canvas[2:]}
    assert set(rows) == {"1001", "1003", "1004"}
    assert rows["1001"][:5] == ["García, Ana", "1001", "S1001", "agarcia", "A"]
    assert float(rows["1001"][5]) == by["agarcia"]["max_score"]
    assert float(rows["1003"][5]) == by["wchen"]["score"]
    assert float(rows["1004"][5]) == 0.0  # nothing handed in: 0, not an empty cell
    moodle = {
        r["Username"]: r for r in csv.DictReader(open(out / "grades_moodle.csv", encoding="utf-8"))
    }
    assert set(moodle) == {"agarcia", "wchen", "sobrien"}
    assert float(moodle["agarcia"][A]) == by["agarcia"]["max_score"]
    assert not list(out.glob("grades_moodle-worksheet_*.csv"))  # a Canvas download: no ids
