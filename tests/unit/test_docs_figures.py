"""docs/benchmarks.md holds the measured figures; other pages cite them. A figure cited from
that page is a link whose text carries the figure, to the section it comes from, for example
``[11.1 s](benchmarks.md#operator-failover)``; every number in the link's text must then appear
in that section of the page, so a benchmark rerun that changes a figure fails here until the
pages citing it are brought in line. The page itself stays a page for users: under 400 lines,
and each of its sections says its command, the commit and date it was measured at, and whether
its target is met.

Covers, on the repository's pages: every link to docs/benchmarks.md or docs/dev/benchmark-log.md
names a section that exists, every figure cited is in its section, no figure is cited without a
section, the page's length and each section's command, commit, date and verdict. On planted
pages: a cited figure that changed on the page, a figure written with a thousands separator, a
link to a section that is gone, a figure cited from the page as a whole, and a page without
links, each found or passed as it should be.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = Path("docs/benchmarks.md")
LOG = Path("docs/dev/benchmark-log.md")
MAX_LINES = 430  # 14 questions, one table each
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")
HEADING = re.compile(r"^(#{2,4}) (.+)$", re.MULTILINE)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections(text: str) -> dict[str, str]:
    """Anchor -> the text under that heading, up to the next heading of its level or above."""
    found = list(HEADING.finditer(text))
    out: dict[str, str] = {}
    for i, m in enumerate(found):
        level = len(m.group(1))
        end = next((n.start() for n in found[i + 1 :] if len(n.group(1)) <= level), len(text))
        out.setdefault(slug(m.group(2)), text[m.end() : end])
    return out


def numbers(text: str) -> set[str]:
    """The numbers in ``text``, thousands separators dropped: "5,000" and "5000" are one."""
    return {n.replace(",", "") for n in NUMBER.findall(text)}


def citing_pages(root: Path) -> list[Path]:
    """README.md and the docs pages other than the benchmarks page and the contributors' log."""
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    return [p for p in pages if p.exists() and p.relative_to(root) not in (PAGE, LOG)]


def problems(root: Path) -> list[str]:
    """Every link to the benchmarks page or the log whose section is missing, and every figure
    cited from the benchmarks page that its section does not hold."""
    targets = {
        (root / rel).resolve(): sections((root / rel).read_text())
        for rel in (PAGE, LOG)
        if (root / rel).exists()
    }
    page = (root / PAGE).resolve()
    found: list[str] = []
    for source in citing_pages(root):
        for lineno, line in enumerate(source.read_text().splitlines(), 1):
            for text, href in LINK.findall(line):
                path, _, anchor = href.partition("#")
                if not path.endswith(".md") or "://" in path:
                    continue
                target = (source.parent / path).resolve()
                if target not in targets:
                    continue
                where = f"{source.relative_to(root)}:{lineno}: [{text}]({href})"
                cited = numbers(text) if target == page else set()
                if not anchor:
                    if cited:
                        found.append(f"{where}: a figure cited without its section")
                    continue
                if anchor not in targets[target]:
                    found.append(f"{where}: no section #{anchor} on {target.name}")
                    continue
                missing = sorted(cited - numbers(targets[target][anchor]))
                if missing:
                    found.append(f"{where}: {', '.join(missing)} not in that section")
    return found


def page_problems(root: Path) -> list[str]:
    """The benchmarks page over its length, or a section of it without its command, the commit
    and the date it was measured at, or a verdict on its target."""
    text = (root / PAGE).read_text()
    found = []
    if len(text.splitlines()) >= MAX_LINES:
        found.append(f"{PAGE}: {len(text.splitlines())} lines, the page keeps under {MAX_LINES}")
    for m in re.finditer(r"^## (.+)$", text, re.MULTILINE):
        body = text[m.end() :].split("\n## ", 1)[0]
        lacks = [
            what
            for what, pattern in (
                ("a command", r"Command"),
                ("a date", r"\b20\d\d-\d\d-\d\d\b"),
                ("a commit", r"\bcommit\b.*?\b[0-9a-f]{7,40}\b|\| [0-9a-f]{7,40} \|"),
                ("a verdict on its target", r"\bmet\b|[Nn]o target"),
            )
            if not re.search(pattern, body, re.DOTALL)
        ]
        if lacks:
            found.append(f"{PAGE}: section {m.group(1)!r} lacks {', '.join(lacks)}")
    return found


def test_every_cited_figure_matches_its_section() -> None:
    assert problems(ROOT) == []


def test_the_benchmarks_page_is_short_and_each_section_says_where_from() -> None:
    assert page_problems(ROOT) == []


BENCH = """# Benchmarks

## Operator failover

Measured 2026-11-24 at commit 61b1ca4. Command: `pytest x`.

| SIGKILL of the leader to the standby holding the Lease | 11.1 s | under 15 s: met |
| runs | 5000 |
"""


def plant(tmp_path: Path, citing: str, bench: str = BENCH) -> Path:
    (tmp_path / "docs" / "dev").mkdir(parents=True)
    (tmp_path / PAGE).write_text(bench)
    (tmp_path / LOG).write_text("# Benchmark log\n\n## Old run (2026-11-20)\n\n9.9 s\n")
    (tmp_path / "docs" / "operations.md").write_text(citing)
    (tmp_path / "README.md").write_text("# Project\n")
    return tmp_path


@pytest.mark.parametrize(
    ("citing", "bench", "expected"),
    [
        pytest.param(
            "A standby leads [11.1 s after](benchmarks.md#operator-failover) a SIGKILL.\n",
            BENCH,
            [],
            id="figure-held-by-its-section",
        ),
        pytest.param(
            "A standby leads [11.1 s after](benchmarks.md#operator-failover) a SIGKILL.\n",
            BENCH.replace("11.1 s", "12.4 s"),
            [
                "docs/operations.md:1: [11.1 s after](benchmarks.md#operator-failover): 11.1 not "
                "in that section"
            ],
            id="figure-changed-on-the-page",
        ),
        pytest.param(
            "Measured at [5,000 runs](benchmarks.md#operator-failover).\n",
            BENCH,
            [],
            id="thousands-separator-is-the-same-number",
        ),
        pytest.param(
            "See [11.1 s](benchmarks.md#operator-failover-2026-11-24).\n",
            BENCH,
            [
                "docs/operations.md:1: [11.1 s](benchmarks.md#operator-failover-2026-11-24): no "
                "section #operator-failover-2026-11-24 on benchmarks.md"
            ],
            id="section-gone",
        ),
        pytest.param(
            "A standby leads in [11.1 s](benchmarks.md).\n",
            BENCH,
            ["docs/operations.md:1: [11.1 s](benchmarks.md): a figure cited without its section"],
            id="figure-without-a-section",
        ),
        pytest.param(
            "History: [9.9 s](dev/benchmark-log.md#old-run-2026-11-20), "
            "[the log](dev/benchmark-log.md#gone).\n",
            BENCH,
            [
                "docs/operations.md:1: [the log](dev/benchmark-log.md#gone): no section #gone on "
                "benchmark-log.md"
            ],
            id="log-links-checked-for-their-section-only",
        ),
        pytest.param("No links here, 11.1 s.\n", BENCH, [], id="nothing-cited"),
    ],
)
def test_problems_on_planted_pages(
    tmp_path: Path, citing: str, bench: str, expected: list[str]
) -> None:
    assert problems(plant(tmp_path, citing, bench)) == expected


def test_a_section_without_its_commit_is_named(tmp_path: Path) -> None:
    root = plant(tmp_path, "", BENCH.replace("at commit 61b1ca4", "at some point"))

    assert page_problems(root) == ["docs/benchmarks.md: section 'Operator failover' lacks a commit"]


def test_a_page_too_long_is_named(tmp_path: Path) -> None:
    long = BENCH + "\n" * MAX_LINES
    root = plant(tmp_path, "", long)

    lines = len(long.splitlines())
    assert lines >= MAX_LINES
    assert page_problems(root) == [
        f"docs/benchmarks.md: {lines} lines, the page keeps under {MAX_LINES}"
    ]


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Transfer on gs:// and az:// (emulators)", "transfer-on-gs-and-az-emulators"),
        ("The restore's write size", "the-restores-write-size"),
        (
            "Operator: failed gang member to the next attempt's pods",
            "operator-failed-gang-member-to-the-next-attempts-pods",
        ),
        ("`make demo` then `make test`", "make-demo-then-make-test"),
    ],
)
def test_anchors_as_github_makes_them(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor
