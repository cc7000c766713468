"""What an endpoint says reaches neither a run's status nor an Event, and reaches the operator's
log only escaped (trainingrun.storage.base ``escaped``, ``log_text``; the three stores).

The operator calls a custom endpoint from its own network position; an error message that
repeated the endpoint's reply (status and Events show the message) gave a tenant a read-back of
whatever answers at a URL of their choosing, and a reply with newlines or escape codes could
forge lines of the operator's log.

Covers:

- a 4xx whose body, error message or error code carries a distinctive text, from a local server,
  on S3 (an error code that is no identifier; a DeleteObjects answer's message), Cloud Storage
  (a JSON error message; a plain-text body) and Azure (an x-ms-error-code that is no
  identifier): the raised error's str() holds none of it (on the old code it did), its
  ``detail`` does, escaped;
- a reply with "\\n2026-01-01 INFO forged" and "\\x1b[2J" comes out on one line, escaped;
- ``escaped`` itself: control characters shown, printable text kept, length capped.
"""

from __future__ import annotations

import base64
import importlib
import json
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from tests.unit.test_bounds_stores_server import LocalServer, Piece, Request, reply
from trainingrun.storage.opener import OPERATOR_BUDGET, Location, StorageError, Store, open_location

MARK = "tenant-readback-7f3a"
FORGED = "\n2026-01-01 INFO forged"
CLEAR = "\x1b[2J"
XML = {"Content-Type": "application/xml"}


def _s3_error(request: Request, index: int) -> Iterable[Piece]:
    body = f"<Error><Code>Leak {MARK}</Code><Message>{MARK}{FORGED}</Message></Error>"
    yield 0, reply("400 Bad Request", XML, body.encode())


def _s3_delete(request: Request, index: int) -> Iterable[Piece]:
    body = (
        "<DeleteResult><Error><Key>k1</Key><Code>AccessDenied</Code>"
        f"<Message>{MARK}{FORGED}</Message></Error></DeleteResult>"
    )
    yield 0, reply("200 OK", XML, body.encode())


def _gcs_json(request: Request, index: int) -> Iterable[Piece]:
    body = json.dumps({"error": {"code": 403, "message": f"{MARK}{FORGED}{CLEAR}"}})
    yield 0, reply("403 Forbidden", {"Content-Type": "application/json"}, body.encode())


def _gcs_text(request: Request, index: int) -> Iterable[Piece]:
    yield 0, reply("400 Bad Request", {"Content-Type": "text/plain"}, f"{MARK}{FORGED}".encode())


def _azure(request: Request, index: int) -> Iterable[Piece]:
    body = f"<Error><Code>X</Code><Message>{MARK}{FORGED}{CLEAR}</Message></Error>"
    headers = {**XML, "x-ms-error-code": f"Leak {MARK}"}
    yield 0, reply("400 Bad Request", headers, body.encode())


def _store(kind: str, url: str) -> Store:
    if kind == "s3":
        keys = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "example"}
        return open_location(Location("bkt", "", "s3"), url, "us-east-1", keys, OPERATOR_BUDGET)
    if kind == "gs":
        return open_location(Location("bkt", "", "gs"), url, None, None, OPERATOR_BUDGET)
    key = {"AZURE_STORAGE_KEY": base64.b64encode(b"k" * 32).decode()}
    location = Location("cont", "", "az", "acct")
    return open_location(location, f"{url}/acct", None, key, OPERATOR_BUDGET)


def _get(store: Store) -> Any:
    return store.get("k1")


def _delete(store: Store) -> Any:
    return store.delete(["k0", "k1"])


CASES = [
    pytest.param("s3", _s3_error, _get, id="s3-error-code"),
    pytest.param("s3", _s3_delete, _delete, id="s3-delete-message"),
    pytest.param("gs", _gcs_json, _get, id="gcs-json-message"),
    pytest.param("gs", _gcs_text, _get, id="gcs-text-body"),
    pytest.param("az", _azure, _get, id="azure-error-code"),
]


def _raised(kind: str, answer: Callable[[Request, int], Iterable[Piece]], call: Any) -> Any:
    with LocalServer(answer, lifetime=30) as server, pytest.raises(StorageError) as caught:
        call(_store(kind, server.url))
    return caught.value


@pytest.mark.parametrize(("kind", "answer", "call"), CASES)
def test_the_endpoints_words_stay_out_of_the_message(kind: str, answer: Any, call: Any) -> None:
    error = _raised(kind, answer, call)
    assert MARK not in str(error), str(error)
    assert "forged" not in str(error)
    detail = getattr(error, "detail", None)
    assert detail and MARK in detail, repr(detail)


@pytest.mark.parametrize(("kind", "answer", "call"), CASES)
def test_the_endpoints_words_reach_the_log_on_one_line_escaped(
    kind: str, answer: Any, call: Any
) -> None:
    error = _raised(kind, answer, call)
    detail = str(getattr(error, "detail", ""))
    assert "\\n2026-01-01 INFO forged" in detail, repr(detail)
    log_text = importlib.import_module("trainingrun.storage.base").log_text
    line = log_text(error)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert line.startswith(str(error)) and detail in line
    if answer in (_gcs_json, _azure):
        assert "\\x1b[2J" in detail


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain words", "plain words"),
        ("a\nb\r\nc", "a\\nb\\r\\nc"),
        ("\x1b[2J\x00\x7f\u2028", "\\x1b[2J\\x00\\x7f\\u2028"),
        ("tab\there, back\\slash", "tab\\there, back\\\\slash"),
        ("é ü 日本", "é ü 日本"),
        ("x" * 300, "x" * 200 + "..."),
        ("\n" * 150, "\\n" * 100 + "..."),
    ],
)
def test_escaped_shows_control_characters_and_caps_the_length(text: str, shown: str) -> None:
    escaped = importlib.import_module("trainingrun.storage.base").escaped
    assert escaped(text) == shown
