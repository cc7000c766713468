"""The chart's ``agent.resources``: rendered into the operator's TRAININGRUN_AGENT_RESOURCES as
JSON, its default the operator's own (AgentSettings), a value of the admin's read back by
OperatorSettings as given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.chart.support import only, template
from trainingrun.decide.pod import AgentSettings
from trainingrun.operator.settings import OperatorSettings


def _env(helm: Path, values: dict[str, Any] | None = None) -> dict[str, str]:
    pod = only(template(helm, values), "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_default_agent_resources_are_the_operators(helm: Path) -> None:
    raw = _env(helm)["TRAININGRUN_AGENT_RESOURCES"]
    assert json.loads(raw) == AgentSettings().resources
    assert OperatorSettings.from_env({"TRAININGRUN_AGENT_RESOURCES": raw}) == OperatorSettings()


def test_agent_resources_follow_the_values(helm: Path) -> None:
    values = {
        "agent": {
            "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": None},
        }
    }
    env = _env(helm, values)
    settings = OperatorSettings.from_env(
        {"TRAININGRUN_AGENT_RESOURCES": env["TRAININGRUN_AGENT_RESOURCES"]}
    )
    assert settings.agent.resources == {"requests": {"cpu": "250m", "memory": "256Mi"}}
