"""Whether a run may use the storage its spec names: checked before the operator makes any call
to it, so that one tenant's spec cannot turn the operator into a proxy or reach another run's
checkpoints.

- The admin's allowlists (``TRAININGRUN_ALLOWED_ENDPOINTS``, ``TRAININGRUN_ALLOWED_URIS``):
  when set, an endpoint or uri outside them fails the run with ``StorageNotAllowed``. A uri
  prefix may hold ``{namespace}``: each namespace then gets a base path of its own.
- A custom endpoint without ``credentialsSecret``, on every scheme: the operator would call a
  host the tenant chose from its own network position, signing with its own identity (s3://,
  az://) or unsigned (gs://, as to an emulator), and make it a probe of its network. Refused,
  unless the admin lists that endpoint (an AWS PrivateLink endpoint used with the pods' own
  identity, an emulator).
- The run's folder ``<uri>/<namespace>/<run>`` must not lie inside another run's checkpoint
  folder: a path part ``checkpoints`` (where every run keeps its checkpoints), ``manifest.json``,
  or an empty, ``.`` or ``..`` part is refused. Otherwise one run's retention could delete
  another's objects, and its start abort another's uploads.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from trainingrun.api import StorageSpec
from trainingrun.checkpoint.manifest import CHECKPOINTS_DIR, RUN_MANIFEST
from trainingrun.decide import reasons as R

AWS = "aws"  # in the endpoint allowlist: AWS S3 itself (no endpoint)
# Each scheme's own service (no endpoint), as the endpoint allowlist names it.
CLOUD = {"s3": AWS, "gs": "gcs", "az": "azure"}
CLOUD_NAMES = {AWS: "AWS S3", "gcs": "Google Cloud Storage", "azure": "Azure Blob Storage"}
SCHEMES = ("s3://", "gs://", "az://")
NAMESPACE = "{namespace}"
RESERVED_PARTS = frozenset({CHECKPOINTS_DIR, RUN_MANIFEST, "", ".", ".."})


@dataclass(frozen=True)
class Refusal:
    reason: str
    message: str


def normal_endpoint(url: str) -> str | None:
    """``scheme://host[:port]`` of ``url`` in lowercase, without the default port of the scheme
    or a path; None when it is not an http(s) URL with a host and a valid port."""
    parts = urlsplit(url.strip().lower())
    try:
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    default = {"http": 80, "https": 443}[parts.scheme]
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port and port != default else "")


def bad_allowlist_entries(endpoints: tuple[str, ...], uris: tuple[str, ...]) -> list[str]:
    """The entries of the allowlists that can never match: the operator refuses to start."""
    bad = [e for e in endpoints if e not in CLOUD_NAMES and normal_endpoint(e) is None]
    return bad + [u for u in uris if not u.startswith(SCHEMES) or len(u) <= len("s3://")]


def _under(path: str, prefix: str) -> bool:
    """``path`` is ``prefix`` or inside it, part by part (``s3://b/ab`` is not in ``s3://b/a``)."""
    prefix = prefix.rstrip("/")
    return path == prefix or path.startswith(prefix + "/")


def refusal(
    storage: StorageSpec,
    namespace: str,
    name: str,
    allowed_endpoints: tuple[str, ...] = (),
    allowed_uris: tuple[str, ...] = (),
) -> Refusal | None:
    """Why the run may not use ``storage``, None when it may."""
    scheme = storage.scheme
    listed = {e if e in CLOUD_NAMES else normal_endpoint(e) for e in allowed_endpoints}
    endpoint = normal_endpoint(storage.endpoint) if storage.endpoint else CLOUD[scheme]
    if endpoint is None:
        return Refusal(
            R.INVALID_SPEC,
            f"spec.checkpoint.storage.endpoint {storage.endpoint!r} is not an http(s) URL with a "
            "host and a port from 1 to 65535",
        )
    if allowed_endpoints and endpoint not in listed:
        shown = f"{CLOUD_NAMES[endpoint]} (no endpoint)" if endpoint in CLOUD_NAMES else endpoint
        return Refusal(
            R.STORAGE_NOT_ALLOWED,
            f"spec.checkpoint.storage.endpoint: {shown} is not one of the endpoints the "
            f"operator's administrator allows ({', '.join(allowed_endpoints)}); use one of them "
            "or ask the administrator to add it (TRAININGRUN_ALLOWED_ENDPOINTS)",
        )
    if storage.endpoint and not storage.credentials_secret and endpoint not in listed:
        return Refusal(
            R.STORAGE_NOT_ALLOWED,
            f"spec.checkpoint.storage.endpoint {endpoint} is set without credentialsSecret: the "
            "operator calls a custom endpoint only with the run's own keys (or when its "
            "administrator lists the endpoint in TRAININGRUN_ALLOWED_ENDPOINTS); name a Secret "
            "with the endpoint's keys in spec.checkpoint.storage.credentialsSecret",
        )
    uri = storage.uri.rstrip("/")
    bases = [u.replace(NAMESPACE, namespace) for u in allowed_uris]
    if bases and not any(_under(uri, b) for b in bases):
        return Refusal(
            R.STORAGE_NOT_ALLOWED,
            f"spec.checkpoint.storage.uri {uri} is not under a base path the operator's "
            f"administrator allows ({', '.join(bases)}); choose a uri under one of them",
        )
    # The parts after the bucket (Azure: after the account and the container).
    after = 2 if scheme == "az" else 1
    folder = [*uri.split("://", 1)[1].split("/", after)[after:], namespace, name]
    parts = "/".join(folder).split("/")
    taken = sorted({p for p in parts if p in RESERVED_PARTS}, key=str)
    if taken:
        shown = ", ".join(repr(p) for p in taken)
        return Refusal(
            R.INVALID_SPEC,
            f"the run's folder {uri}/{namespace}/{name} has a path part that runs' own folders "
            f"use ({shown}): it could lie inside another run's checkpoints; choose "
            "spec.checkpoint.storage.uri without it (or a run name other than it)",
        )
    return None
