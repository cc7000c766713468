"""The storage pages (docs/storage.md and one page per store, docs/storage-*.md) and every link
to them.

Covers: each page says what it is for in its first paragraph; every markdown link to a storage
page, from the README, any page under docs/ or a storage page itself (a bare ``#anchor`` in it
included), names a page that exists and a heading on it; every ``docs/storage*.md#anchor`` in
the package's messages, the chart and the tests does too. A section moved from one page to
another without its links shows here rather than as a dead link in an error message.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("storage*.md"))
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]*)\)")
# in code, messages and comments: docs/storage.md#bucket-permissions
CITED = re.compile(r"docs/(storage[\w-]*\.md)(?:#([\w-]+))?")


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lowercase, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    found: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else re.match(r"#{1,6} (.*)", line)
        if match:
            slug = base = _slug(match.group(1))
            n = 0
            while slug in found:  # GitHub numbers a repeated heading: -1, -2, ...
                n += 1
                slug = f"{base}-{n}"
            found.add(slug)
    return found


def _links() -> list[tuple[str, Path, str]]:
    """(where, target page, anchor or '') for every link to a storage page."""
    links = []
    for source in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for target in MARKDOWN_LINK.findall(source.read_text()):
            path, _, anchor = target.partition("#")
            page = source if not path else (source.parent / path).resolve()
            if page.parent == DOCS and page.name.startswith("storage"):
                where = f"{source.relative_to(ROOT)} -> {target}"
                links.append((where, page, anchor))
    for folder in ("operator/trainingrun", "tests", "charts"):
        for source in sorted((ROOT / folder).rglob("*")):
            if source.suffix not in {".py", ".yaml", ".tpl", ".txt", ".md"}:
                continue
            for name, anchor in CITED.findall(source.read_text()):
                where = f"{source.relative_to(ROOT)} -> docs/{name}#{anchor}"
                links.append((where, DOCS / name, anchor))
    return links


def test_there_is_a_page_per_store() -> None:
    names = {p.name for p in PAGES}
    assert {"storage.md", "storage-s3.md", "storage-gcs.md", "storage-azure.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_each_page_says_what_it_is_for_first(page: Path) -> None:
    lines = page.read_text().splitlines()
    assert lines[0].startswith("# ")
    assert lines[2].startswith("This page is for "), "the first line after the title"


@pytest.mark.parametrize("link", _links(), ids=lambda link: link[0])
def test_every_link_to_a_storage_page_lands(link: tuple[str, Path, str]) -> None:
    where, page, anchor = link
    assert page.exists(), f"{where}: no such page"
    if anchor:
        assert anchor in _anchors(page), f"{where}: no heading #{anchor} on {page.name}"


def test_the_links_are_found() -> None:
    """The scan itself works: it sees links from other pages and from the package's messages."""
    wheres = [where for where, _, _ in _links()]
    assert any(w.startswith("docs/troubleshooting.md") for w in wheres)
    assert any(w.startswith("operator/trainingrun/") for w in wheres)
