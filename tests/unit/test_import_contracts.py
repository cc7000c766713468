"""The import contracts of pyproject.toml fail when a planted import crosses them: a copy of the
package, each plant added to one module, checked by import-linter with the project's own
configuration. The contracts hold on the real package in ``make verify`` (``lint-imports``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

# (module, planted line, the contract it breaks)
PLANTS = [
    (
        "agent/sync.py",
        "import trainingrun.operator.kube",
        "The agent never imports the operator",
    ),
    (
        "operator/buckets.py",
        "import trainingrun.agent.transfer",
        "The operator never imports the agent",
    ),
    (
        "integrations/hf.py",
        "import trainingrun.storage.base",
        "The trainer integrations import only the contract and the checkpoint folder",
    ),
    (
        "decide/pod.py",
        "import boto3",
        "Decision code imports neither kubernetes nor boto3",
    ),
    (
        "checkpoint/manifest.py",
        "import trainingrun.decide.reasons",
        "Programs: cli > operator | agent | integrations > decide > checkpoint > storage",
    ),
    (
        "storage/base.py",
        "import trainingrun.storage.opener",
        "Storage: opener > s3 | gcs | azure > deadline > base > checksum",
    ),
    (
        "operator/kubeconn.py",
        "import trainingrun.operator.reconciler",
        "Operator: handlers > reconciler > starts > launch | applier > rooms > API client",
    ),
    (
        "operator/cache.py",
        "import kubernetes",
        "The product imports no kubernetes client library",
    ),
]


def _broken(output: str) -> set[str]:
    """The names of the contracts import-linter reports broken (a name may wrap)."""
    flat = re.sub(r"\s*\n\s*", " ", output)
    return {
        name
        for _, _, name in PLANTS
        if re.search(re.escape(name) + r"[^\n]*? BROKEN", flat) is not None
    }


def _plant(package: Path, module: str, line: str) -> None:
    path = package / module
    source = path.read_text()
    # After the module's ``from __future__`` import, the first statement it allows before.
    anchor = "from __future__ import annotations\n"
    assert anchor in source, module
    path.write_text(source.replace(anchor, f"{anchor}\n{line}  # planted\n", 1))


@pytest.fixture(scope="module")
def planted_output(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("contracts")
    package = tmp / "operator" / "trainingrun"
    shutil.copytree(
        ROOT / "operator" / "trainingrun", package, ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    for module, line, _ in PLANTS:
        _plant(package, module, line)
    env = {**os.environ, "PYTHONPATH": str(tmp / "operator")}
    done = subprocess.run(
        [str(LINT_IMPORTS), "--config", str(tmp / "pyproject.toml"), "--no-cache"],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode != 0, done.stdout
    return done.stdout


@pytest.mark.parametrize(("module", "line", "contract"), PLANTS, ids=[m for m, _, _ in PLANTS])
def test_a_planted_import_breaks_its_contract(
    planted_output: str, module: str, line: str, contract: str
) -> None:
    assert contract in _broken(planted_output), planted_output[-3000:]
    short = line.removeprefix("import ")
    assert short in planted_output, f"the report does not name {short}"


def test_the_copy_without_plants_keeps_every_contract(tmp_path: Path) -> None:
    package = tmp_path / "operator" / "trainingrun"
    shutil.copytree(
        ROOT / "operator" / "trainingrun", package, ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "operator")}
    done = subprocess.run(
        [str(LINT_IMPORTS), "--config", str(tmp_path / "pyproject.toml"), "--no-cache"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert _broken(done.stdout) == set()
