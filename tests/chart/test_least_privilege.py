"""The chart's least privilege, without a cluster (``helm template``):

- namespaced mode (``operator.watchNamespaces``): no ClusterRole grants pods (list, create,
  patch...) or ``secrets get``; they are Roles in the listed namespaces only, and the pods on a
  node need no list across namespaces (the operator's pod cache answers);
- ``rbac.restrictPodPatches``: a ValidatingAdmissionPolicy and its binding that match UPDATEs of
  pods by the operator's ServiceAccount only (its name follows the release and
  ``serviceAccount.name``), deny, fail closed; none when off; refused before Kubernetes 1.30.

What the policy's CEL allows and denies is checked against a real API server in
tests/integration/test_chart.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.chart.rbac import Grant
from tests.chart.support import CHART, grants, helm_run, of_kind, only, template

NAMESPACED = {"operator": {"watchNamespaces": ["team-a", "team-b"]}}
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


@pytest.mark.parametrize(
    "grant",
    [
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods", "get"),
        ("", "pods", "create"),
        ("", "pods", "patch"),
        ("", "pods", "delete"),
        ("", "secrets", "get"),
    ],
    ids=lambda g: f"{g[1]}-{g[2]}",
)
def test_namespaced_no_cluster_role_grants_pods_or_secrets(helm: Path, grant: Grant) -> None:
    objects = template(helm, NAMESPACED, release="ops")
    for role in of_kind(objects, "ClusterRole"):
        assert grant not in grants(role), role["metadata"]["name"]
    roles = [r for r in of_kind(objects, "Role") if r["metadata"]["name"] == "ops-trainingrun"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert all(grant in grants(r) for r in roles)


def test_clusterwide_pods_and_secrets_are_in_one_cluster_role(helm: Path) -> None:
    """The default: the same rules, in every namespace (what watchNamespaces narrows)."""
    objects = template(helm, release="ops")
    holders = [
        r["metadata"]["name"]
        for r in of_kind(objects, "ClusterRole")
        if {("", "secrets", "get"), ("", "pods", "create")} <= grants(r)
    ]
    assert holders == ["ops-trainingrun"]


def policy(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    return (
        only(objects, "ValidatingAdmissionPolicy")["spec"],
        only(objects, "ValidatingAdmissionPolicyBinding")["spec"],
    )


@pytest.mark.parametrize(
    ("values", "account"),
    [
        pytest.param({}, "system:serviceaccount:ops-ns:ops-trainingrun", id="chart-account"),
        pytest.param(
            {"serviceAccount": {"create": False, "name": "own"}},
            "system:serviceaccount:ops-ns:own",
            id="own-account",
        ),
        pytest.param(NAMESPACED, "system:serviceaccount:ops-ns:ops-trainingrun", id="namespaced"),
    ],
)
def test_pod_patch_policy_matches_the_operators_pod_updates_only(
    helm: Path, values: dict[str, Any], account: str
) -> None:
    spec, binding = policy(template(helm, values, release="ops", namespace="ops-ns"))
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}
    ]
    (condition,) = spec["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{account}'"
    assert spec["failurePolicy"] == "Fail"
    assert binding == {"policyName": "ops-trainingrun-pod-patches", "validationActions": ["Deny"]}
    checked = " ".join(v["expression"] for v in spec["validations"])
    for field in ("spec", "labels", "finalizers", "ownerReferences", "variables.others"):
        assert field in checked
    for validation in spec["validations"]:
        assert validation["message"].startswith("the trainingrun operator may change a pod only")
        assert validation["reason"] == "Forbidden"  # 403, as Kube.annotate_pod expects


def test_pod_patch_policy_is_on_by_default_and_off_when_asked(helm: Path) -> None:
    assert len(of_kind(template(helm), *POLICY_KINDS)) == 2
    assert not of_kind(template(helm, {"rbac": {"restrictPodPatches": False}}), *POLICY_KINDS)


@pytest.mark.parametrize(
    ("kube_version", "refused"),
    [pytest.param("1.29.5", True, id="1.29"), pytest.param("1.30.0", False, id="1.30")],
)
def test_pod_patch_policy_needs_kubernetes_1_30(
    helm: Path, kube_version: str, refused: bool
) -> None:
    args = ["template", "tr", str(CHART), "--kube-version", kube_version, "--values", "-"]
    proc = helm_run(helm, *args, stdin=json.dumps({}))
    assert (proc.returncode != 0) == refused, proc.stderr
    if refused:
        assert "rbac.restrictPodPatches needs Kubernetes 1.30" in proc.stderr
        off = json.dumps({"rbac": {"restrictPodPatches": False}})
        assert helm_run(helm, *args, stdin=off).returncode == 0
