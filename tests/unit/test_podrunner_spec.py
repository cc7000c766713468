"""The local pod runner's pure pod-spec rules (tests/podrunner/spec.py): ``$(VAR)`` expansion,
the downward API file format, fieldRef values, env resolution order and errors, and the
termination message with and without FallbackToLogsOnError."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.podrunner.spec import (
    ConfigError,
    command_line,
    container_env,
    expand,
    field_value,
    format_map,
    termination_message,
)

POD: dict[str, Any] = {
    "metadata": {
        "name": "run-1",
        "namespace": "ml",
        "uid": "u-1",
        "labels": {"b": "2", "a": "1"},
        "annotations": {"note": 'say "hi"\n'},
    },
    "spec": {"nodeName": "local-1"},
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)/x", "1/x"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("$(A)$(B)", "1two"),
        ("plain $A", "plain $A"),
    ],
    ids=["defined", "undefined-kept", "escaped", "adjacent", "shell-syntax-untouched"],
)
def test_expand(text: str, expected: str) -> None:
    assert expand(text, {"A": "1", "B": "two"}) == expected


def test_format_map_sorts_keys_and_quotes_values() -> None:
    assert format_map({"b": "x", "a": 'q"\n'}) == 'a="q\\"\\n"\nb="x"'


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("metadata.name", "run-1"),
        ("metadata.namespace", "ml"),
        ("metadata.uid", "u-1"),
        ("spec.nodeName", "local-1"),
        ("status.podIP", "127.0.0.1"),
        ("metadata.labels", 'a="1"\nb="2"'),
        ("metadata.labels['b']", "2"),
        ("metadata.annotations['absent']", ""),
    ],
)
def test_field_value(path: str, expected: str) -> None:
    assert field_value(POD, path) == expected


def test_unsupported_field_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"spec\.hostname"):
        field_value(POD, "spec.hostname")


def lookup(kind: str, namespace: str, name: str) -> dict[str, str] | None:
    data = {("Secret", "ml", "creds"): {"KEY": "k"}, ("ConfigMap", "ml", "cfg"): {"M": "m"}}
    return data.get((kind, namespace, name))


def test_env_order_envfrom_then_env_with_expansion() -> None:
    container = {
        "name": "c",
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CM_"}],
        "env": [
            {"name": "CM_M", "value": "overridden"},
            {"name": "S", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "KEY"}}},
            {"name": "JOINED", "value": "$(S)-$(CM_M)"},
            {
                "name": "OPT",
                "valueFrom": {"secretKeyRef": {"name": "nope", "key": "x", "optional": True}},
            },
        ],
    }
    env = container_env(POD, container, lookup)
    assert (env["CM_M"], env["S"], env["JOINED"]) == ("overridden", "k", "k-overridden")
    assert "OPT" not in env
    assert env["PATH"].split(":")[0].endswith(".venv/bin")


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ({"name": "nope", "key": "KEY"}, 'secret "nope" not found'),
        ({"name": "creds", "key": "OTHER"}, "couldn't find key OTHER"),
    ],
)
def test_missing_secret_or_key_is_a_config_error(ref: dict[str, str], message: str) -> None:
    container = {"name": "c", "env": [{"name": "X", "valueFrom": {"secretKeyRef": ref}}]}
    with pytest.raises(ConfigError, match=message):
        container_env(POD, container, lookup)


def test_no_command_says_images_are_not_run() -> None:
    with pytest.raises(ValueError, match="ignores the image"):
        command_line({"name": "trainer", "image": "x"}, {})


@pytest.mark.parametrize(
    ("policy", "file_text", "code", "expected"),
    [
        ("File", "", 1, ""),
        ("File", "written", 0, "written"),
        ("FallbackToLogsOnError", "", 2, "l2\nl3"),
        ("FallbackToLogsOnError", "", 0, ""),
        ("FallbackToLogsOnError", "written", 2, "written"),
    ],
    ids=["file-empty", "file", "fallback-on-error", "no-fallback-on-success", "file-wins"],
)
def test_termination_message(
    tmp_path: Path, policy: str, file_text: str, code: int, expected: str
) -> None:
    (tmp_path / "term").write_text(file_text)
    (tmp_path / "log").write_text("l2\nl3\n")
    container = {"name": "c", "terminationMessagePolicy": policy}
    assert termination_message(container, tmp_path / "term", tmp_path / "log", code) == expected
