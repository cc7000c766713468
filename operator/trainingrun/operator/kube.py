"""The one wrapper around the Kubernetes API: every call the operator makes goes through here,
and this module alone decides what 404, 409 and 422 mean.

- 404 on read: ``None``; on delete: already done.
- 409 on create: the object exists (deterministic names make retries safe): return it.
- 422 on create: the object is invalid: ``Invalid`` with the API server's message.
- 403 on create: ``Forbidden`` (quota, terminating namespace, admission), retried later.
- 403 on a pod's annotation: ``Forbidden`` (no Role in that namespace, an admission policy);
  the caller goes on with the pods of other namespaces.
- 409 on a DELETE with a UID precondition: the name is another pod's (or Workload's) now:
  nothing deleted.
- Any other answer, or none, to a DELETE of an old attempt's pod: ``ApiError``, retried later.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import urllib3

from trainingrun import api
from trainingrun.contract import LABEL_ATTEMPT, LABEL_RANK, LABEL_RUN, rfc3339
from trainingrun.operator.kubeconn import MERGE_PATCH, HttpError, RestClient, load


class Invalid(Exception):
    """The API server refused an object as invalid (422); retrying cannot help."""


class Forbidden(Exception):
    """403: RBAC, quota, a terminating namespace or admission; may pass later."""


class NotServed(Exception):
    """The API server does not serve the type (its CRD is not installed)."""


class ApiError(Exception):
    """The API server refused a call (an answer the method does not expect) or did not answer
    (a timeout, a lost connection); a later pass tries again."""


def load_config(kubeconfig: str | None = None, pool_size: int = 32) -> RestClient:
    """A client of the API server this process signs in to
    (``trainingrun.operator.kubeconn.load``)."""
    return RestClient(load(kubeconfig), pool_size=pool_size)


CUSTOM = "/apis/{group}/{version}/namespaces/{namespace}/{plural}"
CUSTOM_ONE = CUSTOM + "/{name}"
CLUSTER_CUSTOM_ONE = "/apis/{group}/{version}/{plural}/{name}"
PODS = "/api/v1/namespaces/{namespace}/pods"
POD = PODS + "/{name}"
SERVICES = "/api/v1/namespaces/{namespace}/services"
SECRET_PATH = "/api/v1/namespaces/{namespace}/secrets/{name}"  # noqa: S105  # a path, no secret
EVENTS = "/api/v1/namespaces/{namespace}/events"
NODE = "/api/v1/nodes/{name}"


def _create(
    create: Callable[[], dict[str, Any]], existing: Callable[[], dict[str, Any] | None]
) -> tuple[dict[str, Any], bool]:
    """(the object created, True), or (the one that holds its name, False) on 409; Invalid on
    400 and 422, Forbidden on 403."""
    try:
        return create(), True
    except HttpError as e:
        if e.status == 409:
            found = existing()
            if found is not None:
                return found, False
        if e.status in (400, 422):
            raise Invalid(e.message) from e
        if e.status == 403:
            raise Forbidden(e.message) from e
        raise


def _or_none(read: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    """The object read, or None when there is none (404)."""
    try:
        return read()
    except HttpError as e:
        if e.status == 404:
            return None
        raise


class Kube:
    def __init__(self, rest: RestClient) -> None:
        self.rest = rest

    # -- TrainingRuns ----------------------------------------------------------------------

    def _run_path(self, namespace: str, name: str) -> dict[str, str]:
        where = {"group": api.GROUP, "version": api.VERSION, "plural": api.PLURAL}
        return {**where, "namespace": namespace, "name": name}

    def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        return _or_none(
            lambda: self.rest.call("GET", CUSTOM_ONE, **self._run_path(namespace, name))
        )

    def patch_run_status(
        self, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any] | None:
        """JSON merge patch of the status subresource (None values remove fields); returns the
        updated run, or None when the run is gone (deleted meanwhile: nothing to record)."""
        return _or_none(
            lambda: self.rest.call(
                "PATCH",
                CUSTOM_ONE + "/status",
                {"status": status},
                content_type=MERGE_PATCH,
                **self._run_path(namespace, name),
            )
        )

    # -- Kueue Workloads (trainingrun.operator.queues)
    # ------------------------------------------------

    def has_api(self, group: str, version: str, plural: str) -> bool:
        """Whether the API server serves ``plural`` in ``group/version`` (Kueue installed)."""
        found = _or_none(
            lambda: self.rest.call("GET", "/apis/{group}/{version}", group=group, version=version)
        )
        return any(r.get("name") == plural for r in (found or {}).get("resources") or [])

    def get_object(
        self, group: str, version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """A custom object (namespaced, or cluster-scoped without ``namespace``), or None."""
        where = {"group": group, "version": version, "plural": plural, "name": name}
        if namespace is None:
            return _or_none(lambda: self.rest.call("GET", CLUSTER_CUSTOM_ONE, **where))
        return _or_none(lambda: self.rest.call("GET", CUSTOM_ONE, namespace=namespace, **where))

    def create_object(
        self, group: str, version: str, plural: str, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Creates a namespaced custom object and returns it; None when one holds its name
        already (409), which is left as it is. NotServed when the API server does not serve
        the type (404)."""
        where = {"group": group, "version": version, "plural": plural}
        try:
            created, fresh = _create(
                lambda: self.rest.call(
                    "POST", CUSTOM, body, namespace=body["metadata"]["namespace"], **where
                ),
                lambda: {},
            )
        except HttpError as e:
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
        self.rest.call(
            "PUT",
            CUSTOM_ONE + "/status",
            body,
            group=group,
            version=version,
            namespace=meta["namespace"],
            plural=plural,
            name=meta["name"],
        )

    def delete_object(
        self,
        group: str,
        version: str,
        plural: str,
        name: str,
        namespace: str,
        uid: str | None = None,
    ) -> bool:
        """Deletes a namespaced custom object if it is still the one with ``uid`` (a
        precondition: an object that took the name since is never deleted). True when the API
        server accepted the DELETE; False when it is gone (404) or the name is another
        object's (409); Forbidden on 403."""
        options: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            options["preconditions"] = {"uid": uid}
        where = {"group": group, "version": version, "plural": plural, "name": name}
        try:
            self.rest.call("DELETE", CUSTOM_ONE, options, namespace=namespace, **where)
        except HttpError as e:
            if e.status in (404, 409):
                return False
            if e.status == 403:
                raise Forbidden(e.message) from e
            raise
        return True

    # -- Pods -------------------------------------------------------------------------------

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return _or_none(lambda: self.rest.call("GET", POD, namespace=namespace, name=name))

    def create_pod(self, pod: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Creates the pod, or returns the one that exists under its name. (pod, created)."""
        meta = pod["metadata"]
        return _create(
            lambda: self.rest.call("POST", PODS, pod, namespace=meta["namespace"]),
            lambda: self.get_pod(meta["namespace"], meta["name"]),
        )

    def create_service(self, service: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Creates the Service, or returns the one that exists under its name. (service,
        created)."""
        meta = service["metadata"]
        return _create(
            lambda: self.rest.call("POST", SERVICES, service, namespace=meta["namespace"]),
            lambda: self.rest.call(
                "GET", SERVICES + "/{name}", namespace=meta["namespace"], name=meta["name"]
            ),
        )

    def delete_pod_by_uid(
        self, namespace: str, name: str, uid: str | None, grace_seconds: int | None = None
    ) -> bool:
        """Deletes the pod if it is still the one with ``uid`` (a precondition: a pod that took
        the name since is never deleted). True when the API server accepted the DELETE (the pod
        may take its grace period to go); False when it is gone (404) or the name is another
        pod's (409); ``ApiError`` for any other answer, or none."""
        options: dict[str, Any] = {"propagationPolicy": "Background"}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        if uid:
            options["preconditions"] = {"uid": uid}
        try:
            self.rest.call("DELETE", POD, options, namespace=namespace, name=name)
        except HttpError as e:
            if e.status in (404, 409):
                return False
            raise ApiError(f"{e.status} {e.message}") from e
        except urllib3.exceptions.HTTPError as e:
            raise ApiError(f"no answer: {e}") from e
        return True

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Adds annotations (trainingrun.dev/ keys: the chart's admission policy refuses any
        other change of a pod by the operator); a pod gone is nothing to do."""
        patch = {"metadata": {"annotations": annotations}}
        try:
            self.rest.call(
                "PATCH", POD, patch, content_type=MERGE_PATCH, namespace=namespace, name=name
            )
        except HttpError as e:
            if e.status == 403:
                raise Forbidden(e.message) from e
            if e.status != 404:
                raise

    # -- Nodes and Secrets ------------------------------------------------------------------

    def attempt_pods(self, namespace: str, run: str, attempt: int) -> list[dict[str, Any]]:
        """The pods of one attempt of a run, by their labels (the user CLI's status)."""
        selector = f"{LABEL_RUN}={run},{LABEL_ATTEMPT}={attempt}"
        pods = self.rest.call(
            "GET", PODS + "?labelSelector={selector}", namespace=namespace, selector=selector
        )
        items = list(pods.get("items") or [])
        return sorted(items, key=lambda pod: int(pod["metadata"]["labels"].get(LABEL_RANK, 0)))

    def get_node(self, name: str) -> dict[str, Any] | None:
        return _or_none(lambda: self.rest.call("GET", NODE, name=name))

    def get_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """The Secret's data, base64-decoded; None when it does not exist. Never logged (the
        client logs no bodies)."""
        secret = _or_none(
            lambda: self.rest.call("GET", SECRET_PATH, namespace=namespace, name=name)
        )
        if secret is None:
            return None
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
            self.rest.call("POST", EVENTS, body, namespace=meta["namespace"])
        except HttpError as e:
            if e.status not in (403, 404):  # Events are best effort
                raise
