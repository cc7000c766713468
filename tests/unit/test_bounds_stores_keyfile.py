"""A gs:// run's service-account key file is checked before anything uses it
(trainingrun.storage.gcs.key).

With a key file, the client POSTs a signed token request to the file's ``token_uri`` from where
it runs: in the operator, from the operator's network position. A tenant's key file could name
any URL there (SSRF past the endpoint allowlist; a hanging one held a worker for every call).

Covers:

- a key file whose token_uri is a local server: the operator's path (``secret_credentials``,
  then a store call) refuses it with CredentialsSecretError naming the field and Google's token
  endpoint, and the server receives no request (on the old code it received the POST); the
  agents' path (``open_gcs``) refuses it as StorageMisconfigured, with no request either;
- the other refusals: the older accounts.google.com token URL, another universe, a key file over
  16 KiB, a type other than service_account, a field that is not text or too long, a missing
  one; each message names the field and never a value;
- a good key file passes, and only the fields a key is made of are read (trust_boundary left out).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.unit.test_bounds_stores_server import LocalServer, Piece, Request, reply
from trainingrun.storage.gcs.store import open_gcs
from trainingrun.storage.opener import (
    OPERATOR_BUDGET,
    CredentialsSecretError,
    Location,
    StorageError,
    StorageMisconfigured,
    open_location,
    secret_credentials,
)

KEY = "GOOGLE_SERVICE_ACCOUNT_JSON"
GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"
PEM = (
    rsa.generate_private_key(public_exponent=65537, key_size=2048)
    .private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    .decode()
)


def _key_file(**fields: Any) -> dict[str, Any]:
    info: dict[str, Any] = {
        "type": "service_account",
        "project_id": "proj",
        "private_key_id": "abc123",
        "private_key": PEM,
        "client_email": "sa@proj.iam.gserviceaccount.com",
        "client_id": "1234567890",
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": GOOGLE_TOKEN_URI,
        "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
        "universe_domain": "googleapis.com",
    }
    info.update(fields)
    return {k: v for k, v in info.items() if v is not None}


def _refuse_all(request: Request, index: int) -> Iterable[Piece]:
    body = json.dumps({"error": "invalid_grant", "error_description": "no"}).encode()
    yield 0, reply("400 Bad Request", {"Content-Type": "application/json"}, body)


def test_a_token_uri_of_the_tenants_choosing_is_never_called() -> None:
    with LocalServer(_refuse_all, lifetime=30) as token, LocalServer(_refuse_all) as gcs:
        text = json.dumps(_key_file(token_uri=f"{token.url}/token"))
        error: BaseException | None = None
        try:
            secret = secret_credentials("ns", "creds", {KEY: text}, "gs")
            store = open_location(Location("bkt", "", "gs"), gcs.url, None, secret, OPERATOR_BUDGET)
            store.get("k")
        except (StorageError, StorageMisconfigured) as e:
            error = e
        sent = [(r.method, r.target) for r in token.requests]
        assert not sent, f"the key file's token_uri received {sent}"
        assert not gcs.requests
    assert isinstance(error, CredentialsSecretError), repr(error)
    said = str(error)
    assert "'token_uri'" in said and GOOGLE_TOKEN_URI in said and "ns/creds" in said
    assert token.url not in said


def test_the_agents_refuse_it_too_without_a_request() -> None:
    with LocalServer(_refuse_all, lifetime=30) as token:
        text = json.dumps(_key_file(token_uri=f"{token.url}/token"))
        with pytest.raises(StorageMisconfigured, match="token_uri") as caught:
            store = open_gcs(Location("bkt", "", "gs"), token.url, {KEY: text}, OPERATOR_BUDGET)
            store.get("k")
        assert not token.requests
    assert token.url not in str(caught.value) and "BEGIN PRIVATE KEY" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        pytest.param(
            json.dumps(_key_file(token_uri="https://accounts.google.com/o/oauth2/token")),
            "'token_uri'",
            id="older-token-url",
        ),
        pytest.param(
            json.dumps(_key_file(token_uri="https://oauth2.googleapis.com/token/../x")),
            "'token_uri'",
            id="token-url-with-a-path",
        ),
        pytest.param(json.dumps(_key_file(token_uri=["x"])), "'token_uri'", id="token-uri-list"),
        pytest.param(
            json.dumps(_key_file(universe_domain="example.net")),
            "'universe_domain'",
            id="other-universe",
        ),
        pytest.param(
            json.dumps(_key_file(padding="x" * (17 << 10))), "over the 16384", id="too-big"
        ),
        pytest.param(json.dumps(_key_file(type="external_account")), "'type'", id="other-type"),
        pytest.param(json.dumps(_key_file(client_email=None)), "'client_email'", id="no-email"),
        pytest.param(
            json.dumps(_key_file(private_key_id="k" * 9000)), "'private_key_id'", id="field-long"
        ),
        pytest.param(json.dumps([_key_file()]), "not an object", id="a-list"),
    ],
)
def test_a_key_file_the_store_does_not_take_is_refused_naming_the_field(
    text: str, field: str
) -> None:
    with pytest.raises(CredentialsSecretError, match=KEY) as caught:
        secret_credentials("ns", "creds", {KEY: text}, "gs")
    said = str(caught.value)
    assert field in said
    assert "BEGIN PRIVATE KEY" not in said and "example.net" not in said


def test_a_good_key_file_passes_and_only_its_key_fields_are_read() -> None:
    from trainingrun.storage.gcs.key import key_info  # noqa: PLC0415 - the new module, after the old code

    text = json.dumps(_key_file(trust_boundary={"locations": ["x"]}))
    assert secret_credentials("ns", "creds", {KEY: text}, "gs") == {KEY: text}
    info = key_info(text)
    assert info["token_uri"] == GOOGLE_TOKEN_URI
    assert "trust_boundary" not in info and "auth_uri" not in info
