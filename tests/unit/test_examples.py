"""The framework examples' manifests: valid specs that run their script with the format named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainingrun.api import TrainingRunSpec

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("framework", ["lightning", "composer"])
def test_framework_manifest_runs_its_example(framework: str) -> None:
    manifest = yaml.safe_load((REPO / "examples" / f"trainingrun-{framework}.yaml").read_text())
    spec = TrainingRunSpec.model_validate(manifest["spec"])
    (trainer,) = spec.template["spec"]["containers"]
    assert trainer["command"] == ["python", f"examples/{framework}_finetune.py"]
    assert (REPO / trainer["command"][1]).is_file()
    assert {"name": "PYTHONPATH", "value": "/app/operator"} in trainer["env"]
    assert spec.checkpoint.format == framework
    assert (REPO / "requirements" / f"{framework}.txt").is_file()
