"""The pod template is checked by the real API server at apply, against Kubernetes' own
PodTemplateSpec schema (operator/trainingrun/podtemplate.schema.json). Nothing here needs the
operator.

Covers:

- the CRD installs (the ``crd`` fixture applies it client-side, so it also fits kubectl's
  last-applied annotation): Established, structural, and the API server keeps the typed template;
- ``resources.limits.cpu: lots`` is refused at create, naming the field;
- an unknown container field (``comand``) is refused under strict field validation, naming it;
- a container, init container or volume named with the operator's ``trainingrun-`` prefix is
  refused, naming the field;
- the example manifest (examples/trainingrun-finetune.yaml) is accepted under strict field
  validation and stored as sent: nothing valid is refused or pruned.
"""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.localenv import LocalEnv
from trainingrun import api

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "trainingrun-finetune.yaml"

VALID: dict[str, Any] = {
    "apiVersion": f"{api.GROUP}/{api.VERSION}",
    "kind": api.KIND,
    "metadata": {"name": "valid"},
    "spec": {
        "template": {"spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]}},
        "checkpoint": {"storage": {"uri": "s3://bucket/runs"}},
    },
}


def _create(
    api_client: Any, namespace: str, body: dict[str, Any], strict: bool = True
) -> dict[str, Any]:
    """Creates the run; ``strict`` is kubectl's default field validation (unknown fields are
    errors), otherwise the API server's default for API clients."""
    validation = {"field_validation": "Strict"} if strict else {}
    created: dict[str, Any] = client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, body, **validation
    )
    return created


def _refused(
    api_client: Any, namespace: str, body: dict[str, Any], strict: bool = False
) -> ApiException:
    with pytest.raises(ApiException) as refused:
        _create(api_client, namespace, body, strict)
    listed = client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL
    )
    assert listed["items"] == []
    return refused.value


def _run(**pod_spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(VALID)
    body["metadata"]["name"] = f"bad-{uuid.uuid4().hex[:6]}"
    body["spec"]["template"]["spec"].update(pod_spec)
    return body


def _trainer(**fields: Any) -> dict[str, Any]:
    return {"name": "trainer", "image": "trainer:1", **fields}


def test_crd_is_installed_with_the_typed_pod_template(localenv: LocalEnv, crd: str) -> None:
    got = json.loads(localenv.kubectl("get", "crd", crd, "-o", "json"))
    conditions = {c["type"]: c["status"] for c in got["status"]["conditions"]}
    schema = got["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    template = schema["properties"]["spec"]["properties"]["template"]
    container = template["properties"]["spec"]["properties"]["containers"]["items"]

    assert conditions["Established"] == "True"
    assert "NonStructuralSchema" not in conditions
    assert "x-kubernetes-preserve-unknown-fields" not in container
    assert {"command", "args", "resources"} <= set(container["properties"])


def test_malformed_quantity_is_refused_naming_the_field(
    api_client: Any, crd: str, namespace: str
) -> None:
    body = _run(containers=[_trainer(resources={"limits": {"cpu": "lots"}})])

    refused = _refused(api_client, namespace, body)

    assert refused.status == 422, refused.body
    assert "spec.template.spec.containers[0].resources.limits.cpu" in refused.body
    assert "lots" in refused.body


def test_unknown_container_field_is_refused_under_strict_validation(
    api_client: Any, crd: str, namespace: str
) -> None:
    body = _run(containers=[_trainer(comand=["python", "train.py"])])

    refused = _refused(api_client, namespace, body, strict=True)

    assert refused.status == 400, refused.body
    assert 'unknown field \\"spec.template.spec.containers[0].comand\\"' in refused.body


@pytest.mark.parametrize(
    ("pod_spec", "field"),
    [
        pytest.param(
            {"initContainers": [{"name": "trainingrun-restore", "image": "x:1"}]},
            "spec.template.spec.initContainers[0].name",
            id="init-container-trainingrun-restore",
        ),
        pytest.param(
            {"containers": [_trainer(), {"name": "trainingrun-restore", "image": "x:1"}]},
            "spec.template.spec.containers[1].name",
            id="container-trainingrun-restore",
        ),
        pytest.param(
            {"volumes": [{"name": "trainingrun-checkpoints", "emptyDir": {}}]},
            "spec.template.spec.volumes[0].name",
            id="volume-trainingrun-checkpoints",
        ),
    ],
)
def test_operator_names_are_refused(
    api_client: Any, crd: str, namespace: str, pod_spec: dict[str, Any], field: str
) -> None:
    refused = _refused(api_client, namespace, _run(**pod_spec))

    assert refused.status == 422, refused.body
    assert field in refused.body
    assert "'trainingrun-'" in refused.body
    assert "reserved for" in refused.body


def test_example_is_accepted_and_stored_as_sent(api_client: Any, crd: str, namespace: str) -> None:
    body = yaml.safe_load(EXAMPLE.read_text())

    created = _create(api_client, namespace, body)

    template = json.loads(json.dumps(body["spec"]["template"]))
    assert created["spec"]["template"] == template
