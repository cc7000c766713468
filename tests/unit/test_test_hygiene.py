"""The tests' own house rules, read from their source (no test is run).

Covers:

- every pytest fixture name under tests/ is defined once (a builder per name, in the conftest.py
  or the module that uses it), and no test module or conftest.py has a plain function of a
  fixture's name;
- tests use the product through its public names: no ``from trainingrun... import _name``, no
  ``obj._name`` where ``_name`` is a private name the product defines (or a metric's private
  ``_value``), no ``monkeypatch.setattr(module, "_name", ...)`` of one;
- each check finds a planted breach, so a check that finds nothing has looked.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
PRODUCT = REPO / "operator" / "trainingrun"

# Private attributes of the client libraries' objects that the product hands out: read through
# the library's public API instead (a metric through its registry's ``get_sample_value``).
LIBRARY_PRIVATES = frozenset({"_value", "_sum", "_metrics"})


def _sources(root: Path) -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(root.rglob("*.py")):
        yield str(path.relative_to(REPO)), ast.parse(path.read_text(), str(path))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_fixture(node: ast.AST) -> bool:
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr == "fixture":
            return True
        if isinstance(target, ast.Name) and target.id == "fixture":
            return True
    return False


def fixture_clashes(sources: Iterable[tuple[str, ast.Module]]) -> list[str]:
    """Fixture names defined more than once, and plain functions of a test module or conftest
    named like a fixture."""
    fixtures: dict[str, list[str]] = defaultdict(list)
    helpers: dict[str, list[str]] = defaultdict(list)
    for path, tree in sources:
        for node in ast.walk(tree):
            if _is_fixture(node):
                assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                fixtures[node.name].append(f"{path}:{node.lineno}")
        if Path(path).name.startswith("test_") or Path(path).name == "conftest.py":
            for node in tree.body:
                if isinstance(node, ast.FunctionDef) and not _is_fixture(node):
                    helpers[node.name].append(f"{path}:{node.lineno}")
    clashes = [
        f"fixture {n!r} defined {len(w)} times: {w}" for n, w in fixtures.items() if len(w) > 1
    ]
    clashes += [
        f"{helpers[n]} named like the fixture {n!r} ({fixtures[n]})"
        for n in sorted(fixtures.keys() & helpers.keys())
    ]
    return clashes


def product_privates(sources: Iterable[tuple[str, ast.Module]]) -> frozenset[str]:
    """Every private name the product defines: functions, classes, module names, attributes."""
    names: set[str] = set()
    for _, tree in sources:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return frozenset(n for n in names if _private(n))


def private_reaches(
    sources: Iterable[tuple[str, ast.Module]], privates: frozenset[str]
) -> list[str]:
    """Where a test reaches into the product past its public names."""
    found: list[str] = []
    for path, tree in sources:
        for node in ast.walk(tree):
            where = f"{path}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trainingrun"):
                found += [f"{where}: imports {a.name}" for a in node.names if _private(a.name)]
            elif isinstance(node, ast.Attribute) and (
                node.attr in privates or node.attr in LIBRARY_PRIVATES
            ):
                if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    found.append(f"{where}: {ast.unparse(node)}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("setattr", "delattr")
            ):
                for arg in node.args[:2]:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        last = arg.value.rsplit(".", 1)[-1]
                        if last in privates and (
                            arg.value.startswith("trainingrun") or last == arg.value
                        ):
                            found.append(f"{where}: {ast.unparse(node)}")
    return found


def test_each_fixture_name_is_one_builder() -> None:
    assert fixture_clashes(_sources(TESTS)) == []


def test_tests_use_the_products_public_names() -> None:
    privates = product_privates(_sources(PRODUCT))
    assert "_translate" in privates  # the product does have private names to look for
    assert private_reaches(_sources(TESTS), privates) == []


PLANTED_FIXTURES = {
    "tests/a/test_one.py": "@pytest.fixture\ndef store():\n    return 1\n",
    "tests/b/conftest.py": "@pytest.fixture(scope='module')\ndef store():\n    return 2\n",
    "tests/b/test_two.py": "def store():\n    return 3\n",
}
PLANTED_REACHES = [
    "from trainingrun.storage.s3.store import _socket_reader\n",
    "S3Store(None, 'b')._translate(err, 'k')\n",
    "metrics.events_dropped._value.get()\n",
    "monkeypatch.setattr(cli, '_limit_malloc_arenas', lambda: None)\n",
    "monkeypatch.setattr('trainingrun.cli._limit_malloc_arenas', lambda: None)\n",
]


def test_the_fixture_check_finds_a_planted_clash() -> None:
    sources = [(path, ast.parse(text)) for path, text in PLANTED_FIXTURES.items()]
    clashes = fixture_clashes(sources)
    assert len(clashes) == 2
    assert "fixture 'store' defined 2 times" in clashes[0]
    assert "tests/b/test_two.py:1" in clashes[1]


@pytest.mark.parametrize("planted", PLANTED_REACHES, ids=range(len(PLANTED_REACHES)))
def test_the_private_check_finds_a_planted_reach(planted: str) -> None:
    privates = frozenset({"_socket_reader", "_translate", "_limit_malloc_arenas"})
    assert len(private_reaches([("tests/unit/test_x.py", ast.parse(planted))], privates)) == 1


def test_the_private_check_leaves_an_objects_own_privates_alone() -> None:
    own = "class A:\n    def f(self):\n        return self._translate\n"
    assert private_reaches([("tests/x.py", ast.parse(own))], frozenset({"_translate"})) == []
