"""One version: pyproject.toml's, as installed, is the package's, the agent image's default tag
and the chart's appVersion (which the chart's default image tags use)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

import trainingrun
from trainingrun.decide.pod import AgentSettings

ROOT = Path(__file__).resolve().parents[2]


def _project_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def test_the_package_has_the_projects_version() -> None:
    assert trainingrun.__version__ == _project_version()


def test_the_agent_image_defaults_to_the_same_version() -> None:
    assert AgentSettings().image.endswith(f":{_project_version()}")


def test_the_charts_app_version_is_the_same() -> None:
    chart = yaml.safe_load((ROOT / "charts" / "trainingrun" / "Chart.yaml").read_text())
    assert chart["appVersion"] == _project_version()
