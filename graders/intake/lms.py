"""Reading what Canvas and Moodle deliver when an instructor downloads all submissions.

    python -m graders grade course-assignment_submissions.zip [--roster roster.csv]

PATH may be the .zip the LMS delivered, a folder holding one or several such zips, or the folder
it was unzipped into. Each file is mapped to ONE student id (through the roster when there is
one), and of several files of one student for one assignment the latest is graded.

What the LMSs write (read in their source code, which is what their documentation describes):

Canvas, Assignment > "Download Submissions" (instructure/canvas-lms, lib/content_zipper.rb,
`get_filename`, `sanitize_user_name`, `sanitize_file_name`, `add_upload_submission`): one flat
zip, one member per uploaded file,
    <sortable name>[_LATE]_<user id>_<file id>_<file name>
The sortable name ("García, Ana") is lowercased with every non-word character removed
(`garcíaana`; `O'Brien-Smith, Seán` -> `obriensmithseán`); `_<digits>_` inside a name is
collapsed so that `_<user id>_` is the first such run. `LATE` is there when Canvas marks the
submission late. The second number is the uploaded file's (attachment's) id, not the
submission's. With anonymous grading the name is left out and the id is `anon_<anonymous id>`.
The file name is the file's display name in Canvas (`/ \\ : * ? " < > |` made `_`); a file
uploaded again under a name the student's Submissions folder already holds gets Canvas's unique
name `<stem>-1<ext>`, `-2`, ... (Attachment.make_unique_filename, app/models/attachment.rb), so
`01_online_softmax-2.ipynb` is the latest of three uploads. Text entries are
`<name>_<user id>_text.html` and links `..._link.html`: no notebook, nothing to grade.

Moodle, Assignment > "Download all submissions" (moodle/moodle, mod/assign/locallib.php,
`assign::download_submissions`; the "Download submissions in folders" option is the user
preference `assign_downloadasfolders`, on by default since Moodle 3.1): for each student and
each submission plugin a prefix
    clean_filename(str_replace('_', ' ', fullname) . '_' . <participant id>)
        . '_assignsubmission_<plugin>_'
and the file is `<prefix>/<file path><file name>` in folders (the default), or
`<prefix><file name>` flat. `<plugin>` is `file` for uploads and `onlinetext` for the online
text (`onlinetext.html`). Full names therefore carry no `_`, and clean_filename (PARAM_FILE,
lib/moodlelib.php) removes `& < > " ` | ' : \\ /`: `Seán O'Brien-Smith` is written
`Seán OBrien-Smith`. The participant id is `get_uniqueid_for_user` (the assign_user_mapping
table), not the user id: it identifies the student in this assignment only, and is what the
assignment's offline grading worksheet calls `Participant <id>` (graders/outputs/exports.py). With
blind marking the name is `Participant`. A file uploaded twice under one name is renamed by
Moodle's file manager to `<stem> (1)<ext>`; of several files the newest (zip time) is graded.

Mapping to one student id, through the roster (graders/outputs/exports.py `read_roster`):
    Canvas: the user id is the roster's `lms_id`; else the squashed sortable name matches the
            roster's name squashed the same way. Without a roster the id is
            student_id("<sortable name>_<user id>"), the same for late and resubmitted files.
    Moodle: the full name matches the roster's `name` (or `student`, `login`, the email's local
            part) compared in NFC, case-folded, whitespace collapsed, Moodle's cleaned characters
            removed, and "Last, First" the same as "First Last". Without a roster the id is
            student_id(full name); two participants of one name get their participant id added.
A student the roster does not hold is graded under that clean id and reported "not in the
roster". A late file is reported "submitted late (Canvas LATE marker)"; the id never holds it.

Zip members are extracted (only the notebooks that are graded or named) into a temporary folder
removed when the process ends; a member with an absolute path or `..` is skipped and reported,
and the notebooks to extract may not exceed MAX_UNCOMPRESSED bytes (a zip bomb stops with an
error naming the limit).
"""

from __future__ import annotations

import atexit
import re
import shutil
import tempfile
import unicodedata
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from graders.intake.students import Submission, student_id

MAX_UNCOMPRESSED = 2 * 2**30  # bytes of notebooks one run may extract from zips
LATE_NOTE = "submitted late (Canvas LATE marker)"
NOT_IN_ROSTER = "not in the roster"
UNDERSTOOD = (
    "understood: Canvas's 'Download Submissions' zip (<name>[_LATE]_<user id>_<file id>_<file>), "
    "Moodle's 'Download all submissions' zip in folders (<Full Name>_<id>_assignsubmission_file_/"
    "<file>) or flat (<Full Name>_<id>_assignsubmission_file_<file>), each as the .zip, a folder "
    "of such zips or unzipped; nbgrader's [submitted/]<student>/<assignment>/<assignment>.ipynb; "
    "a flat folder of <student>_<assignment>.ipynb"
)


@dataclass(frozen=True)
class LmsSubmission(Submission):
    """A Submission read from an LMS download: which LMS, the student's key there, late or not."""

    lms: str = ""  # "canvas" or "moodle"
    lms_key: str = ""  # Canvas: the user id (or anon_<id>); Moodle: the participant id
    late: bool = False


@dataclass(frozen=True)
class Upload:
    """One file of an LMS download, as its name says."""

    lms: str  # "canvas" or "moodle"
    who: str  # Canvas: the squashed sortable name ("" when anonymous); Moodle: the full name
    key: str  # Canvas user id; Moodle participant id
    late: bool
    filename: str  # the name the file had in the LMS (Canvas: with its -N)
    plugin: str = "file"  # Moodle's submission plugin (file, onlinetext); Canvas: file


# ---------------------------------------------------------------------------------------------
# File names
# ---------------------------------------------------------------------------------------------


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


_CANVAS_IDS = re.compile(r"(?:^|_)(anon_[0-9A-Za-z]+|\d+)_(\d+)_")
_CANVAS_TEXT = re.compile(
    r"^(?P<head>\w*?)_?(?P<key>anon_[0-9A-Za-z]+|\d+)_(?P<kind>text|link)\.html$"
)


def parse_canvas(name: str) -> Upload | None:
    """The Upload a Canvas member name describes, else None (see the module's docstring)."""
    name = nfc(name)
    if "/" in name:
        return None
    m = _CANVAS_IDS.search(name)
    if m is not None and m.end() < len(name):
        head, key, filename, plugin = name[: m.start()], m[1], name[m.end() :], "file"
    elif m := _CANVAS_TEXT.match(name):  # a text entry or a link: no file
        head, key, filename, plugin = m["head"], m["key"], f"{m['kind']}.html", "onlinetext"
    else:
        return None
    late = head.endswith("LATE")
    if late:
        head = head[:-4].rstrip("_")
    if not re.fullmatch(r"\w*", head) or head != head.lower():  # Canvas keeps lowercase \w only
        return None
    return Upload("canvas", head, key, late, filename, plugin)


_MOODLE = re.compile(
    r"^(?P<who>[^/_]+)_(?P<key>\d+)_assignsubmission_(?P<plugin>[a-z0-9]+)_(?P<rest>.*)$", re.S
)


def parse_moodle(member: str) -> Upload | None:
    """The Upload a Moodle member path (folders or flat) describes, else None."""
    m = _MOODLE.match(nfc(member).replace("\\", "/"))
    if m is None:
        return None
    rest = m["rest"]
    filename = rest.rsplit("/", 1)[-1]
    if not filename:  # a folder entry
        return None
    return Upload("moodle", m["who"].strip(), m["key"], False, filename, m["plugin"])


def parse(member: str) -> Upload | None:
    return parse_moodle(member) or parse_canvas(member)


def identify(source: str | Path) -> Upload | None:
    """The Upload that a graded file's path (Submission.path, a result's "source") came from."""
    path = PurePosixPath(nfc(str(source)).replace("\\", "/"))
    return parse_moodle(f"{path.parent.name}/{path.name}") or parse(path.name)


_COPY = re.compile(r"^(?P<base>.+?)(?:-(?P<dash>\d{1,3})|\s\((?P<paren>\d{1,3})\))$")


def split_copy(stem: str) -> tuple[str, int]:
    """`01_x-2` -> (`01_x`, 2); `01_x (1)` -> (`01_x`, 1); `01_x` -> (`01_x`, 0)."""
    m = _COPY.match(stem)
    if m is None:
        return stem, 0
    return m["base"], int(m["dash"] or m["paren"])


def assignment_of(
    filename: str, known: list[str], assignment: str | None
) -> tuple[str | None, int]:
    """The assignment a notebook's file name names (or --assignment), and its copy number."""
    stem = filename[: -len(".ipynb")]
    base, copy = split_copy(stem)
    if stem in known:
        return stem, 0
    if base in known:
        return base, copy
    named = max((a for a in known if a in stem), key=len, default=None)
    return (named or assignment), copy


# ---------------------------------------------------------------------------------------------
# Reading a download: zips and folders
# ---------------------------------------------------------------------------------------------


@dataclass
class _Entry:
    name: str  # the member path (NFC, "/"-separated), relative to the zip or folder
    when: tuple  # zip date_time or mtime: newer is larger
    size: int
    source: Path  # the zip or the folder
    info: zipfile.ZipInfo | None = None  # None: a file of a folder
    file: Path | None = None  # the file of a folder (its name as on disk, maybe NFD)


def _member_name(info: zipfile.ZipInfo) -> str:
    """The member's name as written: UTF-8 also where the zip's UTF-8 flag is not set."""
    name = info.filename
    if not info.flag_bits & 0x800:
        try:
            name = name.encode("cp437").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            pass
    return nfc(name.replace("\\", "/"))


def _unsafe(name: str) -> bool:
    parts = PurePosixPath(name).parts
    return name.startswith("/") or ".." in parts or bool(parts and re.match(r"^\w:", parts[0]))


def _zip_entries(path: Path, problems: list[str]) -> list[_Entry]:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ValueError(f"{path}: not a zip file that can be read ({exc})") from None
    entries = []
    with zf:
        for info in zf.infolist():
            name = _member_name(info)
            if info.is_dir():
                continue
            if _unsafe(name):
                problems.append(
                    f"{path.name}: member {name!r} has an absolute or '..' path; skipped"
                )
                continue
            entries.append(_Entry(name, tuple(info.date_time), info.file_size, path, info))
    return entries


def _folder_entries(path: Path) -> list[_Entry]:
    entries = []
    for file in sorted(path.rglob("*")):
        rel = file.relative_to(path)
        if not file.is_file() or any(p.startswith(".") for p in rel.parts) or file.suffix == ".zip":
            continue
        st = file.stat()
        entries.append(_Entry(nfc(rel.as_posix()), (st.st_mtime_ns,), st.st_size, path, None, file))
    return entries


def _layout(entries: list[_Entry]) -> str | None:
    """ "canvas", "moodle folders", "moodle flat" or None: what most entries are named like."""
    moodle = [parse_moodle(e.name) for e in entries]
    if any(moodle):
        folders = sum(1 for e, u in zip(entries, moodle, strict=True) if u and "/" in e.name)
        return "moodle folders" if folders * 2 >= sum(map(bool, moodle)) else "moodle flat"
    canvas = sum(1 for e in entries if parse_canvas(e.name))
    notebooks = sum(1 for e in entries if e.name.endswith(".ipynb"))
    if canvas and canvas * 2 >= max(notebooks, 1):
        return "canvas"
    return None


_DESCRIBE = {
    "canvas": "Canvas 'Download Submissions' download",
    "moodle folders": "Moodle folder-per-student download",
    "moodle flat": "Moodle flat download (submissions not in folders)",
}


class _Extractor:
    """Zip members written to a temporary folder that is removed when the process ends."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.root: Path | None = None
        self.folders: dict[Path, str] = {}  # a zip -> its folder under root

    def path(self, entry: _Entry) -> Path:
        if entry.file is not None:
            return entry.file
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="graders-lms-"))
            atexit.register(shutil.rmtree, self.root, True)
        folder = self.folders.setdefault(entry.source, f"{len(self.folders)}-{entry.source.stem}")
        dest = self.root / folder / entry.name
        if dest.exists():
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        written = 0
        with (
            zipfile.ZipFile(entry.source) as zf,
            zf.open(entry.info) as src,
            open(dest, "wb") as out,
        ):
            while chunk := src.read(1 << 20):
                written += len(chunk)
                if written > entry.info.file_size or written > self.max_bytes:
                    raise ValueError(
                        f"{entry.source}: member {entry.name!r} unpacks to more than it declares "
                        f"or than the {_size(self.max_bytes)} limit (a zip bomb?); not extracted"
                    )
                out.write(chunk)
        return dest


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


# ---------------------------------------------------------------------------------------------
# Students: the roster
# ---------------------------------------------------------------------------------------------

_MOODLE_DROPS = str.maketrans({c: None for c in "&<>\"`|':\\/"})


def name_key(name: str) -> str:
    """A full name compared as Moodle writes it: NFC, Moodle's dropped characters removed,
    case-folded, whitespace collapsed; "Last, First" is "First Last"."""
    name = nfc(name).replace("\u2019", "'").translate(_MOODLE_DROPS)
    if name.count(",") == 1:
        last, first = name.split(",")
        name = f"{first} {last}"
    return " ".join(name.casefold().split())


def _token_key(name: str) -> str:
    return " ".join(sorted(name_key(name).replace(",", " ").split()))


def canvas_key(name: str) -> str:
    """A name squashed as Canvas squashes the sortable name: lowercased, word characters only."""
    return re.sub(r"\W", "", nfc(name).lower())


class Roster:
    """Finds a roster student (graders.outputs.exports.Person) for a Canvas user or a Moodle
    name."""

    def __init__(self, people: dict | None):
        self.people = people or {}
        self.by_lms_id = {p.lms_id: s for s, p in self.people.items() if p.lms_id}
        self.names: dict[str, set[str]] = {}
        self.tokens: dict[str, set[str]] = {}
        self.squashed: dict[str, set[str]] = {}
        for s, p in self.people.items():
            spellings = [p.name, s, p.login, p.email.split("@")[0]]
            for spelled in filter(None, spellings):
                self.names.setdefault(name_key(spelled), set()).add(s)
                self.tokens.setdefault(_token_key(spelled), set()).add(s)
                self.names.setdefault(name_key(re.sub(r"[._]", " ", spelled)), set()).add(s)
            for spelled in filter(None, [p.name, s]):
                words = spelled.replace(",", " ").split()
                for i in range(len(words)):  # "Ana García" -> "garcíaana" too
                    squashed = canvas_key("".join(words[i:] + words[:i]))
                    self.squashed.setdefault(squashed, set()).add(s)

    @staticmethod
    def _one(found: set[str] | None) -> str | None:
        return next(iter(found)) if found and len(found) == 1 else None

    def canvas(self, up: Upload) -> str | None:
        if up.key in self.by_lms_id:
            return self.by_lms_id[up.key]
        return self._one(self.squashed.get(up.who)) if up.who else None

    def moodle(self, up: Upload) -> str | None:
        return self._one(self.names.get(name_key(up.who))) or self._one(
            self.tokens.get(_token_key(up.who))
        )


def _clean_id(up: Upload) -> str:
    if up.lms == "canvas":
        return student_id(f"{up.who}_{up.key}" if up.who else up.key)
    if up.who == "Participant":  # blind marking
        return student_id(f"Participant_{up.key}")
    return student_id(up.who)


def _identities(
    ups: list[Upload], roster: Roster, with_roster: bool, problems: list[str]
) -> dict[tuple[str, str], tuple[str, str, list[str]]]:
    """{(lms, key): (student id, display name, notes)} for every student of the download."""
    students = {(u.lms, u.key): u for u in ups}
    found = {}
    for k, up in students.items():
        found[k] = roster.canvas(up) if up.lms == "canvas" else roster.moodle(up)
    claimed: dict[str, list[tuple[str, str]]] = {}
    for k, s in found.items():
        if s is not None:
            claimed.setdefault(s, []).append(k)
    for s, keys in claimed.items():
        if len(keys) > 1:
            who = ", ".join(f"{students[k].who} ({k[1]})" for k in keys)
            problems.append(f"{who}: all match roster student {s!r}; graded under their own ids")
            for k in keys:
                found[k] = None
    out = {}
    clean = {k: _clean_id(u) for k, u in students.items() if found[k] is None}
    for k, up in students.items():
        notes = []
        sid = found[k]
        if sid is None:
            sid = clean[k]
            if sum(c == sid for c in clean.values()) > 1:  # two participants of one name
                sid = student_id(f"{up.who}_{up.key}")
            if with_roster:
                where = "user" if up.lms == "canvas" else "participant"
                notes.append(
                    f"{NOT_IN_ROSTER}: graded under the id {sid} "
                    f"({up.lms.capitalize()} {where} {up.key}, {up.who or 'anonymous'})"
                )
            name = up.who
        else:
            name = roster.people[sid].name or up.who
        out[k] = (sid, name, notes)
    return out


# ---------------------------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------------------------


def _sources(path: Path) -> tuple[list[Path], bool]:
    """The zips to read and whether the folder's own files are to be read too."""
    if path.is_file():
        if path.suffix.lower() != ".zip":
            raise ValueError(f"PATH must be a folder of submissions or an LMS .zip, got {path}")
        return [path], False
    if not path.is_dir():
        raise ValueError(f"PATH must be a folder of submissions or an LMS .zip, got {path}")
    return sorted(p for p in path.glob("*.zip") if p.is_file()), True


def discover(
    path: Path,
    known: list[str],
    assignment: str | None = None,
    roster: dict | None = None,
    *,
    max_bytes: int = MAX_UNCOMPRESSED,
) -> tuple[list[Submission], list[str]] | None:
    """The submissions of an LMS download at `path` and the problems found; None when `path`
    is not an LMS download (then graders.intake.submissions.discover reads it as its own
    layouts)."""
    path = Path(path)
    zips, own = _sources(path)
    problems: list[str] = []
    groups: list[tuple[str, Path, list[_Entry]]] = []  # (layout, source, entries)
    seen = []
    for z in zips:
        entries = _zip_entries(z, problems)
        layout = _layout(entries)
        if layout is None:
            names = ", ".join(e.name for e in entries[:3]) or "nothing"
            problems.append(f"{z.name}: not a Canvas or Moodle download (it holds {names})")
            seen.append(f"{z.name} (holding {names})")
            continue
        groups.append((layout, z, entries))
    if own:
        entries = _folder_entries(path)
        layout = _layout(entries)
        if layout is not None:
            groups.insert(0, (layout, path, entries))  # unzipped files before the same in a zip
        elif not groups:
            if zips and not any(e.name.endswith(".ipynb") for e in entries):
                raise ValueError(
                    f"{path}: found {len(zips)} zip(s) but none is a Canvas or Moodle download "
                    f"({'; '.join(seen)}); {UNDERSTOOD}"
                )
            return None  # not an LMS download: graders.intake.submissions reads it
    if not groups:
        raise ValueError(
            f"{path}: not a Canvas or Moodle download ({'; '.join(seen)}); {UNDERSTOOD}"
        )
    return _submissions(path, groups, known, assignment, roster, problems, max_bytes)


def _submissions(path, groups, known, assignment, roster, problems, max_bytes):
    uploads: list[tuple[Upload, _Entry]] = []
    taken = set()
    for _, _, entries in groups:
        for e in entries:
            if e.name in taken:  # the zip beside its unzipped folder: the file once
                continue
            taken.add(e.name)
            up = parse(e.name)
            if up is None:
                if e.name.endswith(".ipynb"):
                    problems.append(
                        f"{e.source.name}/{e.name}: not named as the LMS names files; skipped"
                    )
                continue
            uploads.append((up, e))
    people = Roster(roster)
    ids = _identities([u for u, _ in uploads], people, roster is not None, problems)
    chosen: dict[tuple[str, str], list[tuple[tuple, Upload, _Entry]]] = {}
    unmatched: dict[tuple[str, str], list[str]] = {}
    for up, e in uploads:
        a, copy = (None, 0)
        if up.plugin == "file" and up.filename.endswith(".ipynb"):
            a, copy = assignment_of(up.filename, known, assignment)
        if a is None or (assignment is not None and a != assignment):
            unmatched.setdefault((up.lms, up.key), []).append(e.name)
            continue
        if up.lms == "canvas":  # highest -N, then the newest file id
            file_id = int(_CANVAS_IDS.search(e.name)[2])
            order = (copy, file_id, e.name)
        else:  # Moodle: the newest file, then the highest (N)
            order = (e.when, copy, e.name)
        chosen.setdefault((up.lms, up.key, a), []).append((order, up, e))
    got_one = {(lms, key) for lms, key, _ in chosen}
    for k, files in unmatched.items():
        if k not in got_one:
            sid = ids[k][0]
            problems.append(
                f"{sid}: no notebook named like an assignment in the submission "
                f"({', '.join(sorted(files))})"
            )
    if not chosen:
        layouts = sorted({_DESCRIBE[layout] for layout, _, _ in groups})
        wanted = assignment or ", ".join(known)
        files = sorted({u.filename for u, _ in uploads})[:5]
        raise ValueError(
            f"{path}: found a {' and a '.join(layouts)} ({len(ids)} students) but no notebook "
            f"named like an assignment ({wanted}); files seen: {', '.join(files) or 'none'}; "
            "pass --assignment A when the notebooks have other names"
        )
    total = sum(e.size for files in chosen.values() for _, _, e in files if e.info is not None)
    if total > max_bytes:
        raise ValueError(
            f"{path}: the notebooks of this download unpack to {_size(total)}, more than the "
            f"{_size(max_bytes)} limit (a zip bomb?); graders.intake.lms.MAX_UNCOMPRESSED sets it"
        )
    extract = _Extractor(max_bytes)
    subs = []
    for (lms, key, a), files in chosen.items():
        files.sort(key=lambda f: f[0], reverse=True)
        (_, up, e), rest = files[0], files[1:]
        sid, name, notes = ids[(lms, key)]
        # late and not-in-the-roster are this submission's problem lines (upload_notes), not
        # the class's: the report lists each once
        notes = ([LATE_NOTE] if up.late else []) + notes
        subs.append(
            LmsSubmission(
                sid,
                a,
                extract.path(e),
                tuple(extract.path(r) for _, _, r in rest),
                name,
                lms=lms,
                lms_key=key,
                late=up.late,
                notes=tuple(notes),
            )
        )
    subs.sort(key=lambda s: (s.student, known.index(s.assignment)))
    return subs, problems
