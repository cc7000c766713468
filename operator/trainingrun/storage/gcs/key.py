"""A Cloud Storage service-account key file, as a run's credentials Secret holds it
(``GOOGLE_SERVICE_ACCOUNT_JSON``), checked before anything uses it.

With a key file, google-auth signs a token request and POSTs it to the file's ``token_uri``,
from wherever the client runs: in the operator, from its own network position. A tenant's file
naming any other URL would make the operator call a host of the tenant's choosing (past the
endpoint allowlist) and hold a worker for as long as that host takes. So only Google's token
endpoint is taken (the one google-auth itself names; the older
https://accounts.google.com/o/oauth2/token of old key files is not, and the same key works with
the new one), in Google's own universe. The file's size and the fields read from it are bounded,
and a field google-auth would act on but no key file needs (``trust_boundary``) is left out.

Pure: json only, so that ``storage.secret_credentials`` checks a Secret without loading the
Cloud Storage library. Messages name the field and what is allowed, never a value.
"""

from __future__ import annotations

import json

from trainingrun.contract import GCS_CREDENTIAL_KEYS
from trainingrun.storage.base import CredentialsSecretError

(KEY,) = GCS_CREDENTIAL_KEYS
TOKEN_URI = "https://oauth2.googleapis.com/token"  # noqa: S105 - a URL, not a password
UNIVERSE = "googleapis.com"
KEY_TYPE = "service_account"
MAX_KEY_FILE_BYTES = 16 << 10  # a key file of an RSA-2048 key is ~2.4 KB, of RSA-4096 ~3.3 KB
MAX_FIELD_CHARS = 8 << 10  # the PEM of an RSA-4096 key is ~3.2 KB; every other field is short
# The fields the key is made of; the file's others (auth_uri, the certificate URLs) are unused.
FIELDS = (
    "type",
    "project_id",
    "private_key_id",
    "private_key",
    "client_email",
    "client_id",
    "token_uri",
    "universe_domain",
)
REQUIRED = ("type", "private_key", "client_email", "token_uri")
_FIX = "create the key with `gcloud iam service-accounts keys create` and store its file as is"


def _refused(why: str) -> CredentialsSecretError:
    return CredentialsSecretError(f"credentialsSecret key {KEY} {why}; {_FIX}")


def key_info(text: str) -> dict[str, str]:
    """The fields of the key file ``text`` that the key is made of, checked: at most
    MAX_KEY_FILE_BYTES of JSON, an object whose fields read are text of at most
    MAX_FIELD_CHARS, of type service_account, with Google's token_uri and universe. Raises
    CredentialsSecretError naming the field at fault."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_KEY_FILE_BYTES:
        raise _refused(f"is {size} bytes, over the {MAX_KEY_FILE_BYTES} a key file takes")
    try:
        parsed = json.loads(text)
    except ValueError as e:
        raise _refused(f"is not a service-account key file's JSON ({type(e).__name__})") from None
    if not isinstance(parsed, dict):
        raise _refused("is not a service-account key file's JSON (not an object)")
    info: dict[str, str] = {}
    for name in FIELDS:
        value = parsed.get(name)
        if value is None and name not in REQUIRED:
            continue
        if not isinstance(value, str) or not value or len(value) > MAX_FIELD_CHARS:
            state = "is missing" if value is None else "is not text of 1 to 8192 characters"
            raise _refused(f"is not a service-account key file: its field {name!r} {state}")
        info[name] = value
    if info["type"] != KEY_TYPE:
        raise _refused(f"is not a service-account key file: its field 'type' is not {KEY_TYPE!r}")
    if info["token_uri"] != TOKEN_URI:
        raise _refused(
            f"has a field 'token_uri' other than {TOKEN_URI}, Google's token endpoint, the only "
            "one the operator sends a token request to; set it to that"
        )
    if info.get("universe_domain", UNIVERSE) != UNIVERSE:
        raise _refused(f"has a field 'universe_domain' other than {UNIVERSE!r}; set it to that")
    return info
