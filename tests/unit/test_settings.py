"""OperatorSettings.from_env: defaults with nothing set, each variable read, and every malformed
value refused with a ConfigurationError that names the variable."""

from __future__ import annotations

import pytest

from trainingrun.api import DEFAULT_NOTICE_TAINTS
from trainingrun.decide.pod import AgentSettings
from trainingrun.settings import ConfigurationError, OperatorSettings


def test_defaults_with_nothing_set() -> None:
    s = OperatorSettings.from_env({})
    assert s == OperatorSettings()
    assert (s.resync_seconds, s.checkpoint_refresh_seconds, s.workers) == (10.0, 15.0, 8)
    assert s.agent == AgentSettings()
    assert s.notice_taints == tuple(DEFAULT_NOTICE_TAINTS)


def test_every_variable_is_read() -> None:
    s = OperatorSettings.from_env(
        {
            "TRAININGRUN_AGENT_IMAGE": "reg.example/agent:7",
            "TRAININGRUN_AGENT_PULL_POLICY": "Always",
            "TRAININGRUN_RESYNC_SECONDS": "30",
            "TRAININGRUN_CHECKPOINT_REFRESH_SECONDS": "2.5",
            "TRAININGRUN_NOTICE_TAINTS": " example.com/reclaim, ,other/notice ",
            "TRAININGRUN_WORKERS": "3",
        }
    )
    assert (s.agent.image, s.agent.image_pull_policy) == ("reg.example/agent:7", "Always")
    assert (s.resync_seconds, s.checkpoint_refresh_seconds, s.workers) == (30.0, 2.5, 3)
    assert s.extra_notice_taints == ("example.com/reclaim", "other/notice")
    assert s.notice_taints[-2:] == ("example.com/reclaim", "other/notice")


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("TRAININGRUN_RESYNC_SECONDS", "ten", "is not a number"),
        ("TRAININGRUN_RESYNC_SECONDS", "0", ">= 0.1"),
        ("TRAININGRUN_RESYNC_SECONDS", "nan", "finite"),
        ("TRAININGRUN_CHECKPOINT_REFRESH_SECONDS", "-1", ">= 0.1"),
        ("TRAININGRUN_CHECKPOINT_REFRESH_SECONDS", "inf", "finite"),
        ("TRAININGRUN_WORKERS", "0", ">= 1"),
        ("TRAININGRUN_WORKERS", "2.5", "whole number"),
        ("TRAININGRUN_AGENT_PULL_POLICY", "Sometimes", "Always, IfNotPresent, Never"),
    ],
)
def test_malformed_values_are_refused_by_name(name: str, value: str, words: str) -> None:
    with pytest.raises(ConfigurationError, match=name) as err:
        OperatorSettings.from_env({name: value})
    assert words in str(err.value)
