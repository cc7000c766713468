"""Smoke tests of the local environment, with real processes and no mocks.

Covers: a CRD applied to the real API server and read back; a pod bound by the real scheduler
to a kwok node and marked Running by kwok; an eviction through the Eviction API that sets the
``DisruptionTarget`` condition; SeaweedFS refusing a second create-only PutObject with 412.
"""

from __future__ import annotations

import uuid
from typing import Any

import botocore.exceptions
import pytest
from kubernetes import client, watch

from tests import localenv as localenv_mod
from tests.integration.support import wait_for

SMOKE_GROUP = "smoke.trainingrun.test"


def test_crd_is_served_and_a_custom_object_reads_back(api_client: Any, namespace: str) -> None:
    ext = client.ApiextensionsV1Api(api_client)
    plural = f"widgets{uuid.uuid4().hex[:6]}"
    name = f"{plural}.{SMOKE_GROUP}"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": SMOKE_GROUP,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": plural[:-1], "kind": "Widget" + plural[7:]},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {"size": {"type": "integer", "minimum": 1}},
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    ext.create_custom_resource_definition(crd)
    try:
        wait_for(
            lambda: any(
                c.type == "Established" and c.status == "True"
                for c in (ext.read_custom_resource_definition(name).status.conditions or [])
            ),
            30,
            "CRD Established",
        )
        custom = client.CustomObjectsApi(api_client)
        body = {
            "apiVersion": f"{SMOKE_GROUP}/v1",
            "kind": crd["spec"]["names"]["kind"],  # type: ignore[index]
            "metadata": {"name": "w1"},
            "spec": {"size": 3},
        }
        wait_for(
            lambda: _try_create(custom, namespace, plural, body),
            30,
            "the new resource to be served",
        )
        got = custom.get_namespaced_custom_object(SMOKE_GROUP, "v1", namespace, plural, "w1")
        assert got["spec"] == {"size": 3}
        bad = {**body, "metadata": {"name": "w2"}, "spec": {"size": 0}}
        with pytest.raises(client.ApiException) as err:
            custom.create_namespaced_custom_object(SMOKE_GROUP, "v1", namespace, plural, bad)
        assert err.value.status == 422
        assert "spec.size" in err.value.body
    finally:
        ext.delete_custom_resource_definition(name)


def _try_create(custom: Any, namespace: str, plural: str, body: dict[str, Any]) -> bool:
    try:
        custom.create_namespaced_custom_object(SMOKE_GROUP, "v1", namespace, plural, body)
    except client.ApiException as e:
        if e.status == 404:  # discovery not refreshed yet
            return False
        raise
    return True


def test_pod_is_scheduled_to_kwok_node_runs_and_eviction_sets_disruption_target(
    core_v1: Any, namespace: str, kwok_node: Any
) -> None:
    node = kwok_node()
    wait_for(
        lambda: any(
            c.type == "Ready" and c.status == "True"
            for c in (core_v1.read_node(node).status.conditions or [])
        ),
        30,
        f"node {node} Ready",
    )
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="smoke"),
        spec=client.V1PodSpec(
            node_selector={"kubernetes.io/hostname": node},
            containers=[client.V1Container(name="main", image="example.invalid/none:1")],
        ),
    )
    # The node selector steers the real scheduler; nodeName is never set by the test.
    core_v1.create_namespaced_pod(namespace, pod)

    def running() -> Any:
        p = core_v1.read_namespaced_pod("smoke", namespace)
        return p if p.status.phase == "Running" else None

    p = wait_for(running, 60, "pod Running")
    assert p.spec.node_name == node
    assert any(c.type == "PodScheduled" and c.status == "True" for c in p.status.conditions)

    seen: list[Any] = []
    w = watch.Watch()
    stream = w.stream(
        core_v1.list_namespaced_pod,
        namespace,
        field_selector="metadata.name=smoke",
        resource_version=p.metadata.resource_version,
        timeout_seconds=30,
    )
    core_v1.create_namespaced_pod_eviction(
        "smoke",
        namespace,
        client.V1Eviction(metadata=client.V1ObjectMeta(name="smoke", namespace=namespace)),
    )
    for event in stream:
        conds = event["object"].status.conditions or []
        seen.extend(c for c in conds if c.type == "DisruptionTarget")
        if seen or event["type"] == "DELETED":
            break
    w.stop()
    assert seen, "no DisruptionTarget condition was observed after the eviction"
    assert seen[0].status == "True"
    assert seen[0].reason == "EvictionByEvictionAPI"


def test_seaweedfs_refuses_second_create_only_put_with_412(
    s3: Any, localenv: localenv_mod.LocalEnv
) -> None:
    key = f"smoke/{uuid.uuid4().hex}/MANIFEST.json"
    first = s3.put_object(Bucket=localenv.bucket, Key=key, Body=b"first", IfNoneMatch="*")
    assert first["ResponseMetadata"]["HTTPStatusCode"] == 200
    with pytest.raises(botocore.exceptions.ClientError) as err:
        s3.put_object(Bucket=localenv.bucket, Key=key, Body=b"second", IfNoneMatch="*")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    body = s3.get_object(Bucket=localenv.bucket, Key=key)["Body"].read()
    assert body == b"first"
