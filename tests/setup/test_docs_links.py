"""Every relative link in README.md and docs/*.md names a file or folder of the repository.

Links to the web (http, https, mailto) and links within a page (#anchor) are not checked; an
anchor after a path is dropped and the path checked. Links inside fenced code blocks are text.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def relative_links(text: str) -> list[str]:
    """The link targets of a markdown text that point into the repository, in order."""
    links = LINK.findall(FENCE.sub("", text))
    return [t for t in links if not re.match(r"[a-z]+:|#", t)]


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """The relative links of page whose path (anchor dropped) is not a file or folder in root."""
    broken = []
    for target in relative_links(page.read_text()):
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists() or root not in (path, *path.parents):
            broken.append(target)
    return broken


def test_the_pages_are_there():
    names = {p.relative_to(REPO).as_posix() for p in PAGES}
    expected = {"README.md", "docs/students.md", "docs/instructors.md", "docs/kernels.md"}
    assert expected | {"docs/architecture.md", "docs/hub.md", "docs/journal.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(page):
    assert not broken_links(page), (
        f"{page.relative_to(REPO)}: links to nothing: {broken_links(page)}"
    )


def test_a_broken_link_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](page.md) [web](https://x.org/a) [here](#top) [gone](missing.md#part)\n"
        "```\n[in code](nowhere.md)\n```\n"
    )
    assert relative_links(page.read_text()) == ["page.md", "missing.md#part"]
    assert broken_links(page, root=tmp_path) == ["missing.md#part"]
