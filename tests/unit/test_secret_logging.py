"""Secrets stay out of the logs, also with ``--verbose``.

Covers:

- Kube.get_secret_data() against the operator's API client and a loopback HTTP server on
  127.0.0.1 that answers a Secret: with the root logger at DEBUG (urllib3 does log there),
  neither a unique key value nor its base64 form appears in any log record; the data is
  decoded; a missing Secret is None;
- the logging set-up of ``trainingrun operator --verbose``, ``trainingrun sync -v`` and
  ``trainingrun restore -v``: the root logger is at DEBUG, and the kubernetes, urllib3,
  botocore, boto3 and s3transfer loggers (and their children, such as kubernetes.client.rest
  that logs whole response bodies) stay at INFO or above.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import kopf
import pytest

from tests.unit.fakes import answer_json, loopback_api_client
from trainingrun import cli
from trainingrun.contract import CREDENTIAL_KEYS
from trainingrun.operator.kube import Kube

MARKER = "tr-secret-marker-7f3c9a1e"  # a secret key value that must never be logged
SECRET_PATH = "/api/v1/namespaces/team-a/secrets/s3-credentials"
LIBRARIES = ("kubernetes", "urllib3", "botocore", "boto3", "s3transfer")
# Loggers that log at DEBUG what they send and receive, under the libraries above.
CHATTY = ("kubernetes.client.rest", "urllib3.connectionpool", "botocore.endpoint", "s3transfer")


class _SecretApi(BaseHTTPRequestHandler):
    """The API server's answer to a GET of one Secret; 404 for anything else."""

    def do_GET(self) -> None:  # the http.server hook's name
        if self.path == SECRET_PATH:
            data = {
                CREDENTIAL_KEYS[0]: base64.b64encode(b"AKIAEXAMPLE").decode(),
                CREDENTIAL_KEYS[1]: base64.b64encode(MARKER.encode()).decode(),
            }
            status, body = 200, {"kind": "Secret", "apiVersion": "v1", "data": data}
        else:
            status, body = 404, {"kind": "Status", "code": 404, "reason": "NotFound"}
        answer_json(self, status, body)

    def log_message(self, format: str, *args: Any) -> None:
        del format, args  # the server's own access log is not under test


@pytest.fixture
def kube() -> Iterator[Kube]:
    """A Kube whose client talks to a loopback API server answering one Secret."""
    with loopback_api_client(_SecretApi) as rest:
        yield Kube(rest)


def test_secret_data_never_reaches_the_log(kube: Kube, caplog: pytest.LogCaptureFixture) -> None:
    # Everything at DEBUG, whatever set the libraries' levels before (the commands put the
    # client libraries at WARNING).
    with caplog.at_level(logging.DEBUG), caplog.at_level(logging.DEBUG, logger="urllib3"):
        assert logging.getLogger("urllib3.connectionpool").isEnabledFor(logging.DEBUG)
        data = kube.get_secret_data("team-a", "s3-credentials")
        missing = kube.get_secret_data("team-a", "no-such-secret")

    assert data == {CREDENTIAL_KEYS[0]: "AKIAEXAMPLE", CREDENTIAL_KEYS[1]: MARKER}
    assert missing is None
    assert any(SECRET_PATH in r.getMessage() for r in caplog.records)  # the GET was logged
    encoded = base64.b64encode(MARKER.encode()).decode()
    messages = [(r.name, r.getMessage()) for r in caplog.records]
    leaked = [name for name, text in messages if MARKER in text or encoded in text]
    assert leaked == [], f"the Secret's data was logged by {leaked}"


@pytest.fixture
def fresh_logging() -> Iterator[None]:
    """The levels of the loggers a command sets up, put back after the test."""
    names = ("", *LIBRARIES, "kopf", "watchdog")
    saved = {n: logging.getLogger(n).level for n in names}
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


@contextlib.contextmanager
def _bare_root() -> Iterator[None]:
    """No handler on the root logger, as in a fresh process (``logging.basicConfig`` sets the
    level only then); pytest's own handlers are put back afterwards."""
    root = logging.getLogger()
    pytest_handlers, root.handlers = root.handlers, []
    try:
        yield
    finally:
        for handler in root.handlers:  # basicConfig's
            handler.close()
        root.handlers = pytest_handlers


def _assert_verbose_but_quiet() -> None:
    assert logging.getLogger().level == logging.DEBUG  # --verbose did take effect
    assert logging.getLogger("trainingrun").isEnabledFor(logging.DEBUG)
    for name in (*LIBRARIES, *CHATTY):
        level = logging.getLogger(name).getEffectiveLevel()
        assert level >= logging.INFO, f"{name} logs at {logging.getLevelName(level)}"


@pytest.mark.usefixtures("fresh_logging")
def test_operator_verbose_keeps_the_client_libraries_quiet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[dict[str, Any]] = []
    monkeypatch.setattr(kopf, "run", lambda **kwargs: started.append(kwargs))
    # The command keeps the kubernetes client out of the process (a None in sys.modules, where
    # the tests have imported it already): whatever it leaves there goes afterwards.
    monkeypatch.setitem(sys.modules, "kubernetes", sys.modules.get("kubernetes"))
    with _bare_root():
        assert cli.main(["operator", "--verbose"]) == 0

        assert len(started) == 1  # the operator got as far as starting kopf
        _assert_verbose_but_quiet()


@pytest.mark.usefixtures("fresh_logging")
@pytest.mark.parametrize("command", ["sync", "restore"])
def test_agent_verbose_keeps_the_client_libraries_quiet(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without settings the command stops after setting up its logging, before any I/O.
    monkeypatch.delenv("TRAININGRUN_STORAGE_URI", raising=False)
    with _bare_root():
        assert cli.main([command, "-v"]) == 2

        _assert_verbose_but_quiet()
