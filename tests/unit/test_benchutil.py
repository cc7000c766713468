"""benchutil.write_section: a benchmark rewrites its own section of docs/benchmarks.md only.

Covers: a section replaced in place between its neighbours (which stay byte for byte), a
heading with a date in parentheses matched whatever the date, a new section appended, the
first section written to a missing file under a title.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchutil import write_section

DOC = """# Benchmarks

Intro.

## Alpha

alpha body

## Beta (2026-11-01)

old beta

## Gamma

gamma body
"""


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        pytest.param(
            "## Alpha\n\nnew alpha\n",
            DOC.replace("alpha body", "new alpha"),
            id="first-section-replaced",
        ),
        pytest.param(
            "## Beta (2026-11-23)\n\nnew beta\n",
            DOC.replace("## Beta (2026-11-01)\n\nold beta", "## Beta (2026-11-23)\n\nnew beta"),
            id="dated-heading-replaced",
        ),
        pytest.param(
            "## Gamma\n\nnew gamma\n",
            DOC.replace("gamma body", "new gamma"),
            id="last-section-replaced",
        ),
        pytest.param(
            "## Delta\n\ndelta body\n",
            DOC + "\n## Delta\n\ndelta body\n",
            id="new-section-appended",
        ),
    ],
)
def test_write_section_replaces_only_its_own(tmp_path: Path, section: str, expected: str) -> None:
    path = tmp_path / "benchmarks.md"
    path.write_text(DOC)

    write_section(path, section)

    assert path.read_text() == expected


def test_write_section_to_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.md"

    write_section(path, "## Alpha\n\nbody\n")

    assert path.read_text() == "# Benchmarks\n\n## Alpha\n\nbody\n"
