"""Every import of this package that the docs' and README's examples show exists: a module
moved or renamed (the integrations went to ``trainingrun.integrations``) fails here, not in a
user's training script."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([*REPO.glob("docs/**/*.md"), REPO / "README.md"])
FROM = re.compile(r"^\s*from (trainingrun[\w.]*) import ([\w, ]+?)(?:\s+as\s+\w+)?\s*(?:#.*)?$")
IMPORT = re.compile(r"^\s*import (trainingrun[\w.]*)(?:\s+as\s+\w+)?\s*(?:#.*)?$")


def shown_imports() -> list[tuple[str, str, str | None]]:
    """(page, module, name) of every ``from trainingrun... import name`` and ``import
    trainingrun...`` line in a code block."""
    found = []
    for page in PAGES:
        in_code = False
        for line in page.read_text().splitlines():
            if line.lstrip().startswith("```"):
                in_code = not in_code
                continue
            if not in_code:
                continue
            if m := FROM.match(line):
                for name in m.group(2).split(","):
                    found.append((page.relative_to(REPO).as_posix(), m.group(1), name.strip()))
            elif m := IMPORT.match(line):
                found.append((page.relative_to(REPO).as_posix(), m.group(1), None))
    return found


def test_the_docs_show_imports() -> None:
    assert len(shown_imports()) >= 4  # the integrations' examples, at least


@pytest.mark.parametrize(("page", "module", "name"), shown_imports())
def test_a_shown_import_exists(page: str, module: str, name: str | None) -> None:
    assert importlib.util.find_spec(module) is not None, f"{page}: no module {module}"
    if name is None or importlib.util.find_spec(f"{module}.{name}") is not None:
        return
    assert hasattr(importlib.import_module(module), name), f"{page}: no {name} in {module}"
