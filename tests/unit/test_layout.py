"""The package stays readable in one sitting: no module over 450 lines, no class over 250, no
function over 60. The one exception is the pod builder, whose single function shows the whole
pod of an attempt in the shape Kubernetes reads it; split, that shape would be hidden.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "trainingrun"
MAX_MODULE, MAX_CLASS, MAX_FUNCTION = 450, 250, 60
LONG_ON_PURPOSE = {"decide/pod.py:build_pod"}

MODULES = sorted(PACKAGE.rglob("*.py"))


def _span(node: ast.AST) -> int:
    return int(getattr(node, "end_lineno", 0)) - int(getattr(node, "lineno", 0)) + 1


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_class_and_function_sizes(path: Path) -> None:
    rel = path.relative_to(PACKAGE).as_posix()
    source = path.read_text()
    assert len(source.splitlines()) <= MAX_MODULE, f"{rel} has over {MAX_MODULE} lines"
    too_long = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and _span(node) > MAX_CLASS:
            too_long.append(f"class {node.name}: {_span(node)} lines")
        is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        if (
            is_function
            and _span(node) > MAX_FUNCTION
            and f"{rel}:{node.name}" not in LONG_ON_PURPOSE
        ):
            too_long.append(f"{node.name}(): {_span(node)} lines")
    assert not too_long, f"{rel}: {', '.join(too_long)}"


def test_the_walk_sees_the_package() -> None:
    names = {p.relative_to(PACKAGE).as_posix() for p in MODULES}
    expected = {"operator/reconciler.py", "operator/handlers.py", "decide/pod.py", "contract.py"}
    assert expected <= names


def _layers_contracts() -> dict[str, set[str]]:
    """Each layers contract of pyproject.toml: its container and the names its layers hold
    (import-linter checks only those: a module left out of a layer is held by none)."""
    config = tomllib.loads((PACKAGE.parents[1] / "pyproject.toml").read_text())
    held: dict[str, set[str]] = {}
    for c in config["tool"]["importlinter"]["contracts"]:
        if c.get("type") == "layers":
            [container] = c["containers"]
            names = {n.strip() for line in c["layers"] for n in line.replace(":", "|").split("|")}
            held[container] = names
    return held


def _children(folder: Path) -> set[str]:
    return {
        p.name.removesuffix(".py")
        for p in folder.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()
    }


# Folders of one or two modules, whose order their docstrings say.
UNLAYERED = {"cli", "checkpoint/layouts", "storage/s3", "storage/gcs", "storage/azure"}


@pytest.mark.parametrize(
    "folder",
    sorted(p.parent for p in PACKAGE.rglob("__init__.py")),
    ids=lambda p: str(p.relative_to(PACKAGE.parent)),
)
def test_every_module_of_a_folder_is_in_its_layers(folder: Path) -> None:
    rel = folder.relative_to(PACKAGE).as_posix()
    if rel in UNLAYERED:
        return
    container = ".".join(folder.relative_to(PACKAGE.parent).parts)
    contracts = _layers_contracts()
    assert container in contracts, f"add a layers contract for {container} to pyproject.toml"
    unlayered = sorted(_children(folder) - contracts[container])
    assert not unlayered, (
        f"add {', '.join(unlayered)} to the layers contract of {container} in pyproject.toml"
    )
