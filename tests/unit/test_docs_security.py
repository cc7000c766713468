"""docs/operations.md "Security": every protection the page claims names the test that holds
it, and every test it names exists, so a renamed or deleted test shows here rather than as a
claim no test backs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "operations.md"
NAMED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _rows() -> list[str]:
    text = PAGE.read_text()
    section = text[text.index("## Security") :]
    section = section[: section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [r for r in rows[1:] if not r.startswith("|---")]  # less the header


def _defined(path: str) -> set[str]:
    tree = ast.parse((ROOT / path).read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_the_section_has_its_table() -> None:
    assert len(_rows()) >= 20


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r.split("|")[1].strip()[:50])
def test_every_protection_names_tests_that_exist(row: str) -> None:
    named = NAMED.findall(row.split("|")[-2])
    assert named, "the row names no test in its last column"
    missing = [f"{path}::{name}" for path, name in named if name not in _defined(path)]
    assert not missing, f"named but not found: {missing}"
