"""What the S3 client's SigV4 signatures cover: the headers always, and a body's SHA-256 unless
the body carries a checksum of its own that the endpoint checks.

| request                                                     | body signed               |
| ----------------------------------------------------------- | ------------------------- |
| data and parts, with their ``x-amz-checksum-*``             | no (``UNSIGNED-PAYLOAD``) |
| the same, once ``sign_bodies`` ran (the probe: NOT checked) | yes                       |
| every other body: manifests, fences, part and delete lists  | yes                       |
| reads (no body)                                             | no (``UNSIGNED-PAYLOAD``) |

Hashing each data byte again cost the sync about 0.5 CPU s per GiB over HTTP
(docs/benchmarks.md), so data goes unsigned where the endpoint checks its checksum, as botocore
itself does over HTTPS and the AWS CRT client over HTTP too. The small writes carry Content-MD5,
but no probe tells whether the endpoint checks it; signing a few KiB costs nothing measurable,
so they are signed as well, and an endpoint that checks signed bodies refuses one changed on
the way either way.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from botocore.config import Config

from trainingrun.storage.checksum import ALGORITHMS

if TYPE_CHECKING:
    from botocore.config import _S3Dict

# The request headers that carry a checksum, as botocore sends them.
CHECKSUM_HEADERS = frozenset(f"x-amz-checksum-{name.lower()}" for name in ALGORITHMS)
# The operations where that checksum is the body's own (on CompleteMultipartUpload it is the
# whole object's, and the body is the part list).
DATA_OPERATIONS = frozenset({"PutObject", "UploadPart"})


def s3_config(endpoint: str | None) -> _S3Dict:
    """botocore's S3 settings: path-style addressing for a custom endpoint, and no SHA-256 of
    request bodies in the signature unless a handler asks for it (module docstring)."""
    config: _S3Dict = {"payload_signing_enabled": False}
    if endpoint:
        config["addressing_style"] = "path"
    return config


def checksummed(operation: str, headers: Any) -> bool:
    """The request's body carries its checksum (``x-amz-checksum-<algorithm>``)."""
    if operation not in DATA_OPERATIONS:
        return False
    return any(str(name).lower() in CHECKSUM_HEADERS for name in headers)


def unchecked_body(operation: str, request: Any) -> bool:
    """The request has a body (reads have none) and it carries no checksum of its own."""
    return request.body not in (None, b"") and not checksummed(operation, request.headers)


def _sign_when(client: Any, wanted: Callable[[str, Any], bool]) -> None:
    """Each request of ``client`` (made by ``s3.store.make_client``) for which
    ``wanted(operation, request)`` holds signs its body's SHA-256 too (AWS S3 checks it against
    the body; SeaweedFS does not, docs/storage-s3.md)."""
    config = client.meta.config
    s3 = cast("_S3Dict", dict(config.s3 or {}))
    s3["payload_signing_enabled"] = True
    signed = config.merge(Config(s3=s3))

    def sign(request: Any, operation_name: str = "", **_: Any) -> None:
        if wanted(operation_name, request):
            request.context["client_config"] = signed

    client.meta.events.register("before-sign.s3", sign)


def sign_unchecked_bodies(client: Any) -> None:
    """Every body without a checksum of its own is signed (``s3.store.make_client`` does this)."""
    _sign_when(client, unchecked_body)


def sign_bodies(client: Any) -> None:
    """From now on, every body is signed: the endpoint does not check checksums."""
    _sign_when(client, lambda _operation, _request: True)


def content_md5(data: bytes) -> str:
    """The Content-MD5 of ``data``, the endpoint's own check of a small write."""
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
