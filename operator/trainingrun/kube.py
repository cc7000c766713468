"""The one wrapper around the Kubernetes API: every call the operator makes goes through here,
and this module alone decides what 404, 409 and 422 mean.

- 404 on read: ``None``; on delete: already done.
- 409 on create: the object exists (deterministic names make retries safe): return it.
- 422 on create: the object is invalid: ``Invalid`` with the API server's message.
- 403 on create: ``Forbidden`` (quota, terminating namespace, admission), retried later.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from trainingrun import api


class Invalid(Exception):
    """The API server refused an object as invalid (422); retrying cannot help."""


class Forbidden(Exception):
    """403: RBAC, quota, a terminating namespace or admission; may pass later."""


def load_config(kubeconfig: str | None = None) -> client.ApiClient:
    """In-cluster config when running in a pod, else the kubeconfig (KUBECONFIG or given)."""
    try:
        config.load_incluster_config()
        return client.ApiClient()
    except config.ConfigException:
        return config.new_client_from_config(config_file=kubeconfig)


def _message(err: ApiException) -> str:
    try:
        return str(json.loads(err.body).get("message", err.reason))
    except (TypeError, ValueError):
        return str(err.reason)


class Kube:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    # -- TrainingRuns ----------------------------------------------------------------------

    def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            run: dict[str, Any] = self.custom.get_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace, api.PLURAL, name
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return run

    def patch_run_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """JSON merge patch of the status subresource; None values remove fields."""
        try:
            self.custom.patch_namespaced_custom_object_status(
                api.GROUP, api.VERSION, namespace, api.PLURAL, name, {"status": status}
            )
        except ApiException as e:
            if e.status != 404:  # the run was deleted meanwhile: nothing to record
                raise

    # -- Pods -------------------------------------------------------------------------------

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            pod = self.core.read_namespaced_pod(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return self._plain(pod)

    def create_pod(self, pod: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Creates the pod, or returns the one that exists under its name. (pod, created)."""
        meta = pod["metadata"]
        try:
            created = self.core.create_namespaced_pod(meta["namespace"], pod)
        except ApiException as e:
            if e.status == 409:
                existing = self.get_pod(meta["namespace"], meta["name"])
                if existing is not None:
                    return existing, False
            if e.status in (400, 422):
                raise Invalid(_message(e)) from e
            if e.status == 403:
                raise Forbidden(_message(e)) from e
            raise
        return self._plain(created), True

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        try:
            self.core.delete_namespaced_pod(
                name, namespace, grace_period_seconds=grace_seconds, propagation_policy="Background"
            )
        except ApiException as e:
            if e.status != 404:
                raise

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        try:
            self.core.patch_namespaced_pod(
                name, namespace, {"metadata": {"annotations": annotations}}
            )
        except ApiException as e:
            if e.status != 404:
                raise

    def run_pods_on_node(self, node: str, label: str) -> list[dict[str, Any]]:
        pods = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", label_selector=label
        )
        return [self._plain(p) for p in pods.items]

    # -- Nodes and Secrets ------------------------------------------------------------------

    def get_node(self, name: str) -> dict[str, Any] | None:
        try:
            node = self.core.read_node(name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return self._plain(node)

    def get_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """The Secret's data, base64-decoded; None when it does not exist. Never logged."""
        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}

    # -- Events -----------------------------------------------------------------------------

    def event(self, run: dict[str, Any], type_: str, reason: str, message: str) -> None:
        meta = run["metadata"]
        now = datetime.now(UTC)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                generate_name=f"{meta['name']}.", namespace=meta["namespace"]
            ),
            involved_object=client.V1ObjectReference(
                api_version=f"{api.GROUP}/{api.VERSION}",
                kind=api.KIND,
                name=meta["name"],
                namespace=meta["namespace"],
                uid=meta["uid"],
            ),
            type=type_,
            reason=reason,
            message=message[:1024],
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            source=client.V1EventSource(component="trainingrun-operator"),
            reporting_component="trainingrun.dev/operator",
            reporting_instance="trainingrun-operator",
        )
        try:
            self.core.create_namespaced_event(meta["namespace"], body)
        except ApiException as e:
            if e.status not in (403, 404):  # Events are best effort
                raise

    def _plain(self, obj: Any) -> dict[str, Any]:
        """API JSON (camelCase), as the pure code expects."""
        plain: dict[str, Any] = self.api_client.sanitize_for_serialization(obj)
        return plain
