"""The pure parts of the Azure store (trainingrun.storage.azure.store); the calls themselves run
against
Azurite (tests/azurite.py).

Covers:

- error translation: azure.core exceptions as the SDK raises them (status, x-ms-error-code
  header or the SDK's StorageErrorCode) become the store's errors: 404 ContainerNotFound is
  BucketNotFound ("create it first"), other 404s KeyNotFound; 412 and 409 BlobAlreadyExists
  PreconditionFailed; 401/403 and a missing credential (azure.identity's
  CredentialUnavailableError) StorageAccessDenied naming the role, its data actions and the
  docs; Md5Mismatch (and Azurite's spelling of it) ChecksumMismatch; other 4xx StorageRejected;
  429, 5xx, transport errors and a body cut short StorageUnavailable, without the SDK's text (it
  can hold a SAS); anything else is raised as it is;
- block ids: a round trip through ``parse_block_id``, one length (raw and base64) for every
  part number, refused upload ids and part numbers, foreign ids parsed as None;
- credentials from the Secret's data: the account key wins over a SAS, empty values count as
  absent, a SAS loses its leading '?', a key that is not base64 is StorageMisconfigured without
  its value in the message, no secret is the Azure identity chain;
- ``SentCrc``: the CRC of the last whole pass over a stream, reset by a seek to its start;
- ``open_azure`` refuses a location without an account.
"""

from __future__ import annotations

import base64
import io
from types import SimpleNamespace
from typing import Any

import pytest
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    IncompleteReadError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseTimeoutError,
)
from azure.identity import CredentialUnavailableError, DefaultAzureCredential
from azure.storage.blob import StorageErrorCode

from trainingrun.storage import checksum
from trainingrun.storage.azure import store as azurestore
from trainingrun.storage.azure.errors import translate
from trainingrun.storage.azure.store import (
    SentCrc,
    block_id,
    credential,
    parse_block_id,
)
from trainingrun.storage.base import (
    BucketNotFound,
    CallBudget,
    ChecksumMismatch,
    KeyNotFound,
    Location,
    PreconditionFailed,
    StorageAccessDenied,
    StorageMisconfigured,
    StorageRejected,
    StorageUnavailable,
)

WHERE = "az://acct/cont/run/k"
KEY = base64.b64encode(b"k" * 64).decode()


def _http_error(
    status: int,
    code: str | None,
    message: str = "",
    cls: type[HttpResponseError] = HttpResponseError,
) -> HttpResponseError:
    """An error as the SDK raises it: the service's code in the x-ms-error-code header."""
    headers = {"x-ms-error-code": code} if code else {}
    response = SimpleNamespace(
        status_code=status, reason="r", headers=headers, text=lambda: "", content_type="text/xml"
    )
    return cls(message=message or f"{status} {code}", response=response)


@pytest.mark.parametrize(
    ("err", "expected", "says"),
    [
        (
            _http_error(404, "ContainerNotFound", cls=ResourceNotFoundError),
            BucketNotFound,
            "container az://acct/cont does not exist: create it first",
        ),
        (_http_error(404, "BlobNotFound", cls=ResourceNotFoundError), KeyNotFound, WHERE),
        (_http_error(404, None), KeyNotFound, "does not exist"),  # a HEAD: no body, maybe no code
        (_http_error(412, "ConditionNotMet", cls=ResourceModifiedError), PreconditionFailed, WHERE),
        (
            _http_error(409, "BlobAlreadyExists", cls=ResourceExistsError),
            PreconditionFailed,
            "BlobAlreadyExists",
        ),
        (
            _http_error(403, "AuthorizationPermissionMismatch"),
            StorageAccessDenied,
            "Storage Blob Data Contributor",
        ),
        (
            _http_error(401, "InvalidAuthenticationInfo", cls=ClientAuthenticationError),
            StorageAccessDenied,
            "containers/blobs/read, write and delete",
        ),
        (_http_error(400, "Md5Mismatch"), ChecksumMismatch, "Md5Mismatch"),
        (_http_error(400, "Crc64Mismatch"), ChecksumMismatch, "Crc64Mismatch"),
        (
            _http_error(400, "InvalidOperation", "Provided contentMD5 doesn't match."),
            ChecksumMismatch,
            "Md5Mismatch",
        ),  # Azurite's answer to a wrong Content-MD5
        (_http_error(400, "InvalidBlockList"), StorageRejected, "InvalidBlockList"),
        (
            _http_error(409, "ContainerBeingDeleted", cls=ResourceExistsError),
            StorageRejected,
            WHERE,
        ),
        (_http_error(429, None), StorageUnavailable, "429"),
        (_http_error(503, "ServerBusy"), StorageUnavailable, "ServerBusy"),
        (_http_error(500, "InternalError"), StorageUnavailable, WHERE),
        (
            ServiceRequestError("GET http://h/c/k?sv=1&sig=SECRET failed"),
            StorageUnavailable,
            "ServiceRequestError",
        ),
        (ServiceResponseTimeoutError("read timed out"), StorageUnavailable, WHERE),
        (  # a body cut short: the error carries the answer's 206
            _http_error(206, None, cls=IncompleteReadError),
            StorageUnavailable,
            "IncompleteReadError",
        ),
        (ClientAuthenticationError("no token"), StorageAccessDenied, "no usable Azure credential"),
        (
            CredentialUnavailableError("chain exhausted"),
            StorageAccessDenied,
            "Azure Workload Identity",
        ),
    ],
)
def test_translate(err: Exception, expected: type[Exception], says: str) -> None:
    got = translate(err, WHERE, "az://acct/cont")
    assert type(got) is expected
    assert says in str(got)
    assert "SECRET" not in str(got)
    if expected is StorageAccessDenied:
        assert "docs/storage-azure.md#azure-roles" in str(got)


def test_translate_reads_the_sdks_error_code_without_a_header() -> None:
    err = _http_error(404, None, cls=ResourceNotFoundError)
    err.error_code = StorageErrorCode.CONTAINER_NOT_FOUND  # type: ignore[attr-defined]
    assert isinstance(translate(err, WHERE, "az://acct/cont"), BucketNotFound)


def test_translate_raises_what_is_not_the_sdks() -> None:
    with pytest.raises(ValueError, match="mine"):
        translate(ValueError("mine"), WHERE, "az://acct/cont")


@pytest.mark.parametrize("number", [1, 2, 10, 9999, 99999])
def test_block_id_round_trip(number: int) -> None:
    upload = "0123456789abcdef" * 2
    block = block_id(upload, number)
    assert parse_block_id(block) == (upload, number)
    assert len(block) == len(block_id(upload, 1)) == 37
    assert len(base64.b64encode(block.encode())) == 52  # all of a blob's ids: one length


@pytest.mark.parametrize(
    ("upload", "number"),
    [
        ("0123456789abcdef" * 2, 0),
        ("0123456789abcdef" * 2, 100000),
        ("short", 1),
        ("0123456789ABCDEF" * 2, 1),
    ],
)
def test_block_id_refuses(upload: str, number: int) -> None:
    with pytest.raises(ValueError):
        block_id(upload, number)


@pytest.mark.parametrize("foreign", ["blockid1", "", "0123456789abcdef" * 2 + "0001x"])
def test_parse_foreign_block_id(foreign: str) -> None:
    assert parse_block_id(foreign) is None


@pytest.mark.parametrize(
    ("secret", "kind"),
    [
        ({"AZURE_STORAGE_KEY": KEY}, AzureNamedKeyCredential),
        (
            {"AZURE_STORAGE_KEY": KEY, "AZURE_STORAGE_SAS_TOKEN": "sv=1&sig=s"},
            AzureNamedKeyCredential,
        ),
        ({"AZURE_STORAGE_KEY": "", "AZURE_STORAGE_SAS_TOKEN": "?sv=1&sig=s"}, AzureSasCredential),
        ({"AZURE_STORAGE_SAS_TOKEN": "sv=1&sig=s"}, AzureSasCredential),
        ({"AZURE_STORAGE_KEY": " ", "AZURE_STORAGE_SAS_TOKEN": ""}, DefaultAzureCredential),
        ({}, DefaultAzureCredential),
        (None, DefaultAzureCredential),
    ],
)
def test_credential_choice(secret: dict[str, str] | None, kind: type[Any]) -> None:
    got = credential("acct", secret)
    assert isinstance(got, kind)
    if isinstance(got, AzureNamedKeyCredential):
        assert got.named_key == ("acct", KEY)
    if isinstance(got, AzureSasCredential):
        assert got.signature == "sv=1&sig=s"


def test_a_key_that_is_no_key() -> None:
    with pytest.raises(StorageMisconfigured, match="AZURE_STORAGE_KEY") as caught:
        credential("acct", {"AZURE_STORAGE_KEY": "not-a-key!"})
    assert "not-a-key" not in str(caught.value)


def test_sent_crc_is_of_the_last_whole_pass() -> None:
    data = bytes(range(256)) * 40
    body = io.BytesIO(b"head" + data)
    body.seek(4)  # a part starts where the stream stands
    sent = SentCrc(body, checksum.CRC32C)
    assert sent.length == len(data)
    assert sent.read(1000) == data[:1000]
    assert sent.sent() is None  # no whole pass yet
    sent.read()
    assert sent.sent() == checksum.digest(checksum.CRC32C, data)
    sent.seek(4)
    sent.read(10)
    assert sent.sent() is None  # a new pass started over


def test_open_azure_needs_an_account() -> None:
    with pytest.raises(StorageMisconfigured, match="no account"):
        azurestore.open_azure(Location("cont", "run", "az", ""), None, {}, CallBudget(2, 1, 1))
