"""Invalid TrainingRuns are refused by the real API server at ``kubectl apply`` time, each with a
message that names the field; a valid one is accepted. Nothing here needs the operator."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.localenv import LocalEnv

VALID: dict[str, Any] = {
    "apiVersion": "trainingrun.dev/v1alpha1",
    "kind": "TrainingRun",
    "metadata": {"name": "valid"},
    "spec": {
        "template": {"spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]}},
        "checkpoint": {"storage": {"uri": "s3://bucket/runs"}},
    },
}


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = doc
        for p in parents:
            node = node.setdefault(p, {})
        if value is _DELETE:
            node.pop(last)
        else:
            node[last] = value

    return apply


_DELETE = object()

CASES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("no-checkpoint", _set("spec.checkpoint", _DELETE), "spec.checkpoint"),
    ("no-template", _set("spec.template", _DELETE), "spec.template"),
    (
        "uri-unknown-scheme",
        _set("spec.checkpoint.storage.uri", "hdfs://bucket/x"),
        "spec.checkpoint.storage.uri",
    ),
    (
        "az-uri-without-container",
        _set("spec.checkpoint.storage.uri", "az://account"),
        "spec.checkpoint.storage.uri",
    ),
    (
        "no-trainer-container",
        _set("spec.template.spec.containers", [{"name": "main", "image": "x"}]),
        "named 'trainer'",
    ),
    (
        "trainer-without-image",
        _set("spec.template.spec.containers", [{"name": "trainer"}]),
        "spec.template.spec.containers[name=trainer].image",
    ),
    ("no-containers", _set("spec.template.spec.containers", []), "spec.template.spec.containers"),
    (
        "restart-policy-always",
        _set("spec.template.spec.restartPolicy", "Always"),
        "spec.template.spec.restartPolicy",
    ),
    ("keep-zero", _set("spec.checkpoint.keep", 0), "spec.checkpoint.keep"),
    (
        "negative-unprotected-after",
        _set("spec.checkpoint.unprotectedAfterSeconds", -1),
        "spec.checkpoint.unprotectedAfterSeconds",
    ),
    ("relative-local-path", _set("spec.checkpoint.localPath", "ckpt"), "spec.checkpoint.localPath"),
    ("root-local-path", _set("spec.checkpoint.localPath", "/"), "spec.checkpoint.localPath"),
    (
        "endpoint-not-http",
        _set("spec.checkpoint.storage.endpoint", "ftp://store"),
        "spec.checkpoint.storage.endpoint",
    ),
    (
        "secret-name-invalid",
        _set("spec.checkpoint.storage.credentialsSecret", "Bad_Name"),
        "spec.checkpoint.storage.credentialsSecret",
    ),
    (
        "negative-max-restarts",
        _set("spec.restartPolicy", {"maxRestarts": -1}),
        "spec.restartPolicy.maxRestarts",
    ),
    (
        "max-restarts-string",
        _set("spec.restartPolicy", {"maxRestarts": "three"}),
        "spec.restartPolicy.maxRestarts",
    ),
    (
        "negative-max-preemptions",
        _set("spec.restartPolicy", {"maxPreemptions": -2}),
        "spec.restartPolicy.maxPreemptions",
    ),
    (
        "backoff-max-below-initial",
        _set("spec.restartPolicy", {"backoff": {"initialSeconds": 60, "maxSeconds": 5}}),
        "spec.restartPolicy.backoff",
    ),
    (
        "zero-grace-period",
        _set("spec.preemption", {"terminationGracePeriodSeconds": 0}),
        "spec.preemption.terminationGracePeriodSeconds",
    ),
    ("name-too-long", _set("metadata.name", "r" * 53), "metadata.name"),
    # Storage that passes a loose schema but can never work, or reaches into other runs.
    ("region-space", _set("spec.checkpoint.storage.region", "us east"), "storage.region"),
    (
        "endpoint-underscore",
        _set("spec.checkpoint.storage.endpoint", "http://exa_mple:9000"),
        "spec.checkpoint.storage.endpoint",
    ),
    (
        "endpoint-port-out-of-range",
        _set("spec.checkpoint.storage.endpoint", "http://example:99999"),
        "port from 1 to 65535",
    ),
    (
        "endpoint-with-password",
        _set("spec.checkpoint.storage.endpoint", "http://user:secret@example:9000"),
        "spec.checkpoint.storage.endpoint",
    ),
    (
        "uri-inside-checkpoints",
        _set("spec.checkpoint.storage.uri", "s3://bucket/runs/ml/other/checkpoints/x"),
        "'checkpoints'",
    ),
    (
        "uri-empty-part",
        _set("spec.checkpoint.storage.uri", "s3://bucket//runs"),
        "spec.checkpoint.storage.uri",
    ),
    ("size-limit-words", _set("spec.checkpoint.sizeLimit", "lots"), "spec.checkpoint.sizeLimit"),
]


@pytest.mark.parametrize(
    ("mutate", "field"), [(m, f) for _, m, f in CASES], ids=[c[0] for c in CASES]
)
def test_invalid_trainingrun_is_refused_naming_the_field(
    localenv: LocalEnv,
    crd: str,
    namespace: str,
    mutate: Callable[[dict[str, Any]], None],
    field: str,
) -> None:
    doc = copy.deepcopy(VALID)
    doc["metadata"]["name"] = f"bad-{uuid.uuid4().hex[:6]}"
    mutate(doc)
    proc = localenv.kubectl_run("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(doc))
    assert proc.returncode != 0, f"accepted: {proc.stdout}"
    assert "is invalid" in proc.stderr or "Invalid value" in proc.stderr, proc.stderr
    assert field in proc.stderr, proc.stderr
    listed = localenv.kubectl("get", "trainingruns", "-n", namespace, "-o", "name")
    assert listed.strip() == ""


def test_valid_trainingrun_is_accepted_with_defaults(
    localenv: LocalEnv, crd: str, namespace: str
) -> None:
    proc = localenv.kubectl_run("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(VALID))
    assert proc.returncode == 0, proc.stderr
    got = yaml.safe_load(
        localenv.kubectl("get", "trainingrun", "valid", "-n", namespace, "-o", "yaml")
    )
    assert got["spec"]["checkpoint"]["localPath"] == "/checkpoints"
    assert got["spec"]["checkpoint"]["keep"] == 3
    assert got["spec"]["checkpoint"]["unprotectedAfterSeconds"] == 1800
    assert got["spec"]["restartPolicy"]["maxRestarts"] == 3
    assert got["spec"]["restartPolicy"]["backoff"]["maxSeconds"] == 300
    assert "karpenter.sh/disrupted" in got["spec"]["preemption"]["noticeTaints"]


def test_storage_within_the_rules_is_accepted(localenv: LocalEnv, crd: str, namespace: str) -> None:
    doc = copy.deepcopy(VALID)
    doc["metadata"]["name"] = "storage-ok"
    doc["spec"]["checkpoint"]["sizeLimit"] = "50Gi"
    doc["spec"]["checkpoint"]["storage"] = {
        "uri": "s3://bucket/runs/team-a/",
        "endpoint": "http://[::1]:9000/s3",
        "region": "us-east-1",
        "credentialsSecret": "creds",
    }
    proc = localenv.kubectl_run(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(doc)
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("example", "name"),
    [
        ("trainingrun.yaml", "finetune-demo"),
        ("trainingrun-finetune.yaml", "finetune-example"),
        ("trainingrun-lightning.yaml", "lightning-example"),
        ("trainingrun-composer.yaml", "composer-example"),
    ],
)
def test_example_manifest_is_accepted(
    localenv: LocalEnv, crd: str, namespace: str, example: str, name: str
) -> None:
    proc = localenv.kubectl_run(
        "apply", "--dry-run=server", "-n", namespace, "-f", f"examples/{example}"
    )
    assert proc.returncode == 0, proc.stderr
    assert name in proc.stdout
