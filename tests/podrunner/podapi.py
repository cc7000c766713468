"""The calls one pod worker makes to the API server, in one place: Secret and ConfigMap
lookups, service account tokens, status writes and the final delete. Each one asks the
runner's link first: while it is cut (a simulated partition) nothing is sent, and lookups are
served from what the worker looked up before, as a kubelet serves its cache.
"""

from __future__ import annotations

import base64
import logging
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.podrunner.link import Link
from tests.podrunner.spec import ConfigError

log = logging.getLogger("podrunner.pod")

STRATEGIC = "application/strategic-merge-patch+json"  # conditions merge by type
UNREACHABLE = "the API server is unreachable"


class PodGone(Exception):
    """The pod object is no longer there (404)."""


class PodApi:
    def __init__(self, core: client.CoreV1Api, link: Link, namespace: str, name: str, uid: str):
        self.core = core
        self.link = link
        self.namespace, self.name, self.uid = namespace, name, uid
        self._looked_up: dict[tuple[str, str, str], dict[str, str] | None] = {}

    def lookup(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        """The data of Secret or ConfigMap ``name``; None when it does not exist."""
        key = (kind, namespace, name)
        if not self.link.up:
            return self._cached(key, UNREACHABLE)
        found: dict[str, str] | None
        try:
            if kind == "Secret":
                secret = self.core.read_namespaced_secret(name, namespace)
                found = {
                    k: base64.b64decode(v).decode(errors="replace")
                    for k, v in (secret.data or {}).items()
                }
            else:
                found = dict(self.core.read_namespaced_config_map(name, namespace).data or {})
        except ApiException as e:
            if e.status == 404:
                found = None
            elif e.status == 429 or e.status >= 500:
                return self._cached(key, f"{e.status} {e.reason}")
            else:
                raise ConfigError(f"{kind} {namespace}/{name}: {e.status} {e.reason}") from e
        except Exception as e:  # the API server briefly away (restarted)
            return self._cached(key, f"{UNREACHABLE} ({e})")
        self._looked_up[key] = found
        return found

    def _cached(self, key: tuple[str, str, str], problem: str) -> dict[str, str] | None:
        """What was looked up before under ``key``, as a kubelet serves its cache; else a
        ConfigError in the kubelet's words for a cache it could not fill (the container waits
        with CreateContainerConfigError, and its start is tried again)."""
        if key in self._looked_up:
            return self._looked_up[key]
        kind, namespace, name = key
        raise ConfigError(
            f"failed to sync {kind.lower()} cache: {kind} {namespace}/{name}: {problem}"
        )

    def token(self, source: dict[str, Any], pod: dict[str, Any]) -> str:
        """A token of the pod's service account from the TokenRequest API, bound to the pod."""
        account = pod["spec"].get("serviceAccountName") or "default"
        if not self.link.up:
            raise ConfigError(f"token of service account {account}: {UNREACHABLE}")
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[source["audience"]] if source.get("audience") else [],
                expiration_seconds=source.get("expirationSeconds", 3600),
                bound_object_ref=client.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name=self.name, uid=self.uid
                ),
            )
        )
        try:
            answer = self.core.create_namespaced_service_account_token(
                account, self.namespace, request
            )
        except ApiException as e:
            raise ConfigError(f"token of service account {account}: {e.reason}") from e
        except Exception as e:  # the API server briefly away: the start is tried again
            raise ConfigError(f"token of service account {account}: {UNREACHABLE} ({e})") from e
        return str(answer.status.token)

    def write_status(self, status: dict[str, Any]) -> bool:
        """True when written; False when it was not (the next tick retries). Raises PodGone."""
        if not self.link.up:
            return False
        try:
            self.core.patch_namespaced_pod_status(
                self.name, self.namespace, {"status": status}, _content_type=STRATEGIC
            )
        except ApiException as e:
            if e.status == 404:
                raise PodGone from e
            log.warning("pod %s/%s: status not written: %s", self.namespace, self.name, e.body)
            return False
        except Exception as e:  # the API may be briefly away; the next tick retries
            log.warning("pod %s/%s: status not written: %s", self.namespace, self.name, e)
            return False
        return True

    def delete(self) -> bool:
        """The final delete with grace 0, of this pod only (its uid); gone already is fine.
        False when the API server did not take it (the caller tries again)."""
        try:
            self.core.delete_namespaced_pod(
                self.name,
                self.namespace,
                grace_period_seconds=0,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=self.uid)
                ),
            )
        except ApiException as e:
            if e.status not in (404, 409):
                log.warning("pod %s/%s: not deleted: %s", self.namespace, self.name, e.reason)
                return False
        except Exception as e:  # the API server briefly away (restarted)
            log.warning("pod %s/%s: not deleted: %s", self.namespace, self.name, e)
            return False
        return True
