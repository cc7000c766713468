"""OperatorSettings.from_env: defaults with nothing set, each variable read, and every malformed
value refused with a ConfigurationError that names the variable; the agents' resources as JSON
(requests and limits, quantities checked), an empty object meaning none, and the resources
reaching the containers ``build_pod`` makes."""

from __future__ import annotations

import pytest

from tests.unit.builders import make_run
from trainingrun import contract as c
from trainingrun.api import DEFAULT_NOTICE_TAINTS
from trainingrun.decide.pod import AgentSettings, build_pod, resume_of
from trainingrun.operator.settings import ConfigurationError, OperatorSettings


def test_defaults_with_nothing_set() -> None:
    s = OperatorSettings.from_env({})
    assert s == OperatorSettings()
    assert (s.resync_seconds, s.checkpoint_refresh_seconds, s.workers) == (10.0, 15.0, 8)
    assert s.resync_rate == 10.0
    assert s.agent == AgentSettings()
    assert s.notice_taints == tuple(DEFAULT_NOTICE_TAINTS)


def test_every_variable_is_read() -> None:
    s = OperatorSettings.from_env(
        {
            "TRAININGRUN_AGENT_IMAGE": "reg.example/agent:7",
            "TRAININGRUN_AGENT_PULL_POLICY": "Always",
            "TRAININGRUN_RESYNC_SECONDS": "30",
            "TRAININGRUN_RESYNC_RATE": "7.5",
            "TRAININGRUN_CHECKPOINT_REFRESH_SECONDS": "2.5",
            "TRAININGRUN_PROGRESS_REFRESH_SECONDS": "90",
            "TRAININGRUN_NOTICE_TAINTS": " example.com/reclaim, ,other/notice ",
            "TRAININGRUN_WORKERS": "3",
            "TRAININGRUN_CLUSTER_DOMAIN": "Corp.Example",
            "TRAININGRUN_AGENT_RESOURCES": '{"requests": {"cpu": "250m", "memory": 256}, '
            '"limits": {"memory": "1Gi"}}',
        }
    )
    assert (s.agent.image, s.agent.image_pull_policy) == ("reg.example/agent:7", "Always")
    assert s.agent.resources == {
        "requests": {"cpu": "250m", "memory": "256"},
        "limits": {"memory": "1Gi"},
    }
    assert (s.resync_seconds, s.checkpoint_refresh_seconds, s.workers) == (30.0, 2.5, 3)
    assert s.resync_rate == 7.5
    assert s.progress_refresh_seconds == 90.0
    assert s.agent.cluster_domain == "corp.example"
    assert s.extra_notice_taints == ("example.com/reclaim", "other/notice")
    assert s.notice_taints[-2:] == ("example.com/reclaim", "other/notice")


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("TRAININGRUN_RESYNC_SECONDS", "ten", "is not a number"),
        ("TRAININGRUN_RESYNC_SECONDS", "0", ">= 0.1"),
        ("TRAININGRUN_RESYNC_SECONDS", "nan", "finite"),
        ("TRAININGRUN_RESYNC_RATE", "0", ">= 0.1"),
        ("TRAININGRUN_RESYNC_RATE", "fast", "is not a number"),
        ("TRAININGRUN_CHECKPOINT_REFRESH_SECONDS", "-1", ">= 0.1"),
        ("TRAININGRUN_CHECKPOINT_REFRESH_SECONDS", "inf", "finite"),
        ("TRAININGRUN_WORKERS", "0", ">= 1"),
        ("TRAININGRUN_WORKERS", "2.5", "whole number"),
        ("TRAININGRUN_CLUSTER_DOMAIN", "cluster.local.", "not a DNS domain"),
        ("TRAININGRUN_CLUSTER_DOMAIN", "svc cluster", "not a DNS domain"),
        ("TRAININGRUN_AGENT_PULL_POLICY", "Sometimes", "Always, IfNotPresent, Never"),
        ("TRAININGRUN_AGENT_RESOURCES", "limits: {memory: 1Gi}", "is not JSON"),
        ("TRAININGRUN_AGENT_RESOURCES", '["100m"]', "only requests and limits"),
        ("TRAININGRUN_AGENT_RESOURCES", '{"claims": {}}', "only requests and limits"),
        ("TRAININGRUN_AGENT_RESOURCES", '{"limits": "512Mi"}', "must be an object"),
        ("TRAININGRUN_AGENT_RESOURCES", '{"limits": {"memory": "512MiB"}}', "not a Kubernetes"),
        ("TRAININGRUN_AGENT_RESOURCES", '{"limits": {"memory": true}}', "not a Kubernetes"),
        ("TRAININGRUN_AGENT_RESOURCES", '{"requests": {"cpu": "1 core"}}', "requests.cpu"),
    ],
)
def test_malformed_values_are_refused_by_name(name: str, value: str, words: str) -> None:
    with pytest.raises(ConfigurationError, match=name) as err:
        OperatorSettings.from_env({name: value})
    assert words in str(err.value)


def test_default_agent_resources() -> None:
    resources = OperatorSettings.from_env({}).agent.resources
    assert resources == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "512Mi"},
    }


def test_empty_agent_resources_mean_none() -> None:
    assert OperatorSettings.from_env({"TRAININGRUN_AGENT_RESOURCES": "{}"}).agent.resources == {}


def test_agent_resources_reach_the_agent_containers() -> None:
    settings = OperatorSettings.from_env(
        {"TRAININGRUN_AGENT_RESOURCES": '{"limits": {"memory": "2Gi", "cpu": "2"}}'}
    )
    ref = make_run("r1").ref()
    pod = build_pod(ref, 2, resume_of(ref, 10), settings.agent, epoch=2)
    agents = {c["name"]: c["resources"] for c in pod["spec"]["initContainers"]}
    assert agents == {
        c.RESTORE_CONTAINER: {"limits": {"memory": "2Gi", "cpu": "2"}},
        c.SYNC_CONTAINER: {"limits": {"memory": "2Gi", "cpu": "2"}},
    }
