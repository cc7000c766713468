"""The one wrapper around the Kubernetes API: every call the operator makes goes through here,
and this module alone decides what 404, 409 and 422 mean.

- 404 on read: ``None``; on delete: already done.
- 409 on create: the object exists (deterministic names make retries safe): return it.
- 422 on create: the object is invalid: ``Invalid`` with the API server's message.
- 403 on create: ``Forbidden`` (quota, terminating namespace, admission), retried later.
- 403 on a pod's annotation: ``Forbidden`` (no Role in that namespace, an admission policy);
  the caller goes on with the pods of other namespaces.
- 409 on a DELETE with a UID precondition: the name is another pod's now: nothing deleted.
- Any other answer, or none, to a DELETE of an old attempt's pod: ``ApiError``, retried later.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from trainingrun import api
from trainingrun.contract import LABEL_ATTEMPT, LABEL_RANK, LABEL_RUN, rfc3339


class Invalid(Exception):
    """The API server refused an object as invalid (422); retrying cannot help."""


class Forbidden(Exception):
    """403: RBAC, quota, a terminating namespace or admission; may pass later."""


class NotServed(Exception):
    """The API server does not serve the type (its CRD is not installed)."""


class ApiError(Exception):
    """The API server refused a call (an answer the method does not expect) or did not answer
    (a timeout, a lost connection); a later pass tries again."""


class CountingApiClient(client.ApiClient):  # type: ignore[misc]  # untyped base
    """An ApiClient that tells ``on_call(verb, resource)`` of every request it sends, the
    resource being the API path's template with the custom resource's plural filled in
    (``/apis/{group}/{version}/namespaces/{namespace}/trainingruns/{name}/status``): a bounded
    set of labels for the operator's API calls metric."""

    on_call: Callable[[str, str], None] | None = None

    def call_api(self, resource_path: str, method: str, *args: Any, **kwargs: Any) -> Any:
        if self.on_call is not None:
            params = kwargs.get("path_params") or (args[0] if args else None) or {}
            plural = params.get("plural")
            path = resource_path.replace("{plural}", plural) if plural else resource_path
            self.on_call(method, path)
        return super().call_api(resource_path, method, *args, **kwargs)


def load_config(kubeconfig: str | None = None, pool_size: int = 32) -> CountingApiClient:
    """In-cluster config when running in a pod, else the kubeconfig (KUBECONFIG or given).
    The connection pool is as large as the worker pool: urllib3's default of 4 makes every
    extra worker open (and TLS-handshake) a new connection per call."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    return CountingApiClient(configuration)


def _json(response: Any) -> dict[str, Any]:
    """Decodes a raw response: the generated model classes are slow and large for what the
    operator needs, which is the API JSON itself."""
    try:
        data: dict[str, Any] = json.loads(response.data)
    finally:
        # Without preloading, urllib3 keeps the connection until told: give it back to the
        # pool, or the next call opens (and TLS-handshakes) a new one.
        response.release_conn()
    return data


def _create(
    create: Callable[[], Any], existing: Callable[[], dict[str, Any] | None]
) -> tuple[dict[str, Any], bool]:
    """(the object created, True), or (the one that holds its name, False) on 409; Invalid on
    400 and 422, Forbidden on 403."""
    try:
        return _json(create()), True
    except ApiException as e:
        if e.status == 409:
            found = existing()
            if found is not None:
                return found, False
        if e.status in (400, 422):
            raise Invalid(_message(e)) from e
        if e.status == 403:
            raise Forbidden(_message(e)) from e
        raise


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
            return _json(
                self.custom.get_namespaced_custom_object(
                    api.GROUP, api.VERSION, namespace, api.PLURAL, name, _preload_content=False
                )
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def patch_run_status(
        self, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any] | None:
        """JSON merge patch of the status subresource (None values remove fields); returns the
        updated run, or None when the run is gone."""
        try:
            return _json(
                self.custom.patch_namespaced_custom_object_status(
                    api.GROUP,
                    api.VERSION,
                    namespace,
                    api.PLURAL,
                    name,
                    {"status": status},
                    _preload_content=False,
                )
            )
        except ApiException as e:
            if e.status == 404:  # the run was deleted meanwhile: nothing to record
                return None
            raise

    # -- Kueue Workloads (trainingrun.queues) ------------------------------------------------

    def has_api(self, group: str, version: str, plural: str) -> bool:
        """Whether the API server serves ``plural`` in ``group/version`` (Kueue installed)."""
        try:
            found = _json(self.custom.get_api_resources(group, version, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return any(r.get("name") == plural for r in found.get("resources") or [])

    def get_object(
        self, group: str, version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """A custom object (namespaced, or cluster-scoped without ``namespace``), or None."""
        try:
            if namespace is None:
                response = self.custom.get_cluster_custom_object(
                    group, version, plural, name, _preload_content=False
                )
            else:
                response = self.custom.get_namespaced_custom_object(
                    group, version, namespace, plural, name, _preload_content=False
                )
            return _json(response)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def create_object(
        self, group: str, version: str, plural: str, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Creates a namespaced custom object and returns it; None when one holds its name
        already (409), which is left as it is. NotServed when the API server does not serve
        the type (404)."""
        meta = body["metadata"]
        try:
            created, fresh = _create(
                lambda: self.custom.create_namespaced_custom_object(
                    group, version, meta["namespace"], plural, body, _preload_content=False
                ),
                lambda: {},
            )
        except ApiException as e:
            if e.status == 404:
                raise NotServed(f"{plural}.{group}/{version} is not served") from e
            raise
        return created if fresh else None

    def replace_object_status(
        self, group: str, version: str, plural: str, body: dict[str, Any]
    ) -> None:
        """PUT of the status subresource, guarded by the body's resourceVersion (409 when the
        object changed since it was read: a later pass reads it again)."""
        meta = body["metadata"]
        self.custom.replace_namespaced_custom_object_status(
            group, version, meta["namespace"], plural, meta["name"], body, _preload_content=False
        ).release_conn()

    # -- Pods -------------------------------------------------------------------------------

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _json(self.core.read_namespaced_pod(name, namespace, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def create_pod(self, pod: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Creates the pod, or returns the one that exists under its name. (pod, created)."""
        return _create(
            lambda: self.core.create_namespaced_pod(
                pod["metadata"]["namespace"], pod, _preload_content=False
            ),
            lambda: self.get_pod(pod["metadata"]["namespace"], pod["metadata"]["name"]),
        )

    def create_service(self, service: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Creates the Service, or returns the one that exists under its name. (service,
        created)."""
        meta = service["metadata"]
        return _create(
            lambda: self.core.create_namespaced_service(
                meta["namespace"], service, _preload_content=False
            ),
            lambda: _json(
                self.core.read_namespaced_service(
                    meta["name"], meta["namespace"], _preload_content=False
                )
            ),
        )

    def delete_pod_by_uid(
        self, namespace: str, name: str, uid: str | None, grace_seconds: int | None = None
    ) -> bool:
        """Deletes the pod if it is still the one with ``uid`` (a precondition: a pod that took
        the name since is never deleted). True when the API server accepted the DELETE (the pod
        may take its grace period to go); False when it is gone (404) or the name is another
        pod's (409); ``ApiError`` for any other answer, or none."""
        options = client.V1DeleteOptions(
            grace_period_seconds=grace_seconds,
            propagation_policy="Background",
            preconditions=client.V1Preconditions(uid=uid) if uid else None,
        )
        try:
            response = self.core.delete_namespaced_pod(
                name, namespace, body=options, _preload_content=False
            )
        except ApiException as e:
            if e.status in (404, 409):
                return False
            raise ApiError(f"{e.status} {_message(e)}") from e
        except urllib3.exceptions.HTTPError as e:
            raise ApiError(f"no answer: {e}") from e
        _json(response)  # read to the end: a connection given back unread garbles the next call
        return True

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Adds annotations (trainingrun.dev/ keys: the chart's admission policy refuses any
        other change of a pod by the operator); a pod gone is nothing to do."""
        try:
            self.core.patch_namespaced_pod(
                name, namespace, {"metadata": {"annotations": annotations}}
            )
        except ApiException as e:
            if e.status == 403:
                raise Forbidden(_message(e)) from e
            if e.status != 404:
                raise

    # -- Nodes and Secrets ------------------------------------------------------------------

    def attempt_pods(self, namespace: str, run: str, attempt: int) -> list[dict[str, Any]]:
        """The pods of one attempt of a run, by their labels (the user CLI's status)."""
        selector = f"{LABEL_RUN}={run},{LABEL_ATTEMPT}={attempt}"
        pods = _json(
            self.core.list_namespaced_pod(
                namespace, label_selector=selector, _preload_content=False
            )
        )
        items = list(pods.get("items") or [])
        return sorted(items, key=lambda pod: int(pod["metadata"]["labels"].get(LABEL_RANK, 0)))

    def get_node(self, name: str) -> dict[str, Any] | None:
        try:
            return _json(self.core.read_node(name, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def get_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """The Secret's data, base64-decoded; None when it does not exist. Never logged: read
        raw, as a preloaded response is logged whole by the client at DEBUG."""
        try:
            secret = _json(
                self.core.read_namespaced_secret(name, namespace, _preload_content=False)
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        data = secret.get("data") or {}
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    # -- Events -----------------------------------------------------------------------------

    def event(self, run: dict[str, Any], type_: str, reason: str, message: str) -> None:
        meta = run["metadata"]
        now = rfc3339(datetime.now(UTC))
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": f"{api.GROUP}/{api.VERSION}",
                "kind": api.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": "trainingrun-operator"},
            "reportingComponent": "trainingrun.dev/operator",
            "reportingInstance": "trainingrun-operator",
        }
        try:
            _json(
                self.core.create_namespaced_event(meta["namespace"], body, _preload_content=False)
            )
        except ApiException as e:
            if e.status not in (403, 404):  # Events are best effort
                raise
