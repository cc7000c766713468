"""Azurite, Microsoft's Azure Storage emulator, for the Azure store's tests: its blob service only,
on a free 127.0.0.1 port, data in memory, with the well-known development account.

- Installed from npm by hack/install-azurite.sh into the user's cache (``binary()``).
- Listens on loopback only (``--blobHost 127.0.0.1``), never reports telemetry
  (``--disableTelemetry``), and takes path-style URLs (``--disableProductStyleUrl``): the
  account is the first path segment, ``http://127.0.0.1:P/devstoreaccount1``.
- ``--skipApiVersionCheck``: the installed azure-storage-blob may speak a newer REST API version
  than the pinned Azurite knows; the calls the store makes exist in both.
- Its access log and debug log go to the folder the caller passes in, also its working folder
  (``--location`` cannot go with ``--inMemoryPersistence``; in memory it writes no workspace).
"""

from __future__ import annotations

import contextlib
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from azure.core.exceptions import ResourceExistsError
from azure.storage.blob import BlobServiceClient

from tests import serverproc
from tests.localenv import free_ports, hack_output

ACCOUNT = "devstoreaccount1"
# Azurite's development account key: public, documented by Microsoft for the emulator
# (learn.microsoft.com, "Use the Azurite emulator", HTTP connection strings). Not a secret.
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CONTAINER = "trainingrun"
READY_TIMEOUT_S = 30


def binary() -> Path:
    """The azurite-blob executable, installed on first use (hack/install-azurite.sh)."""
    return hack_output("install-azurite.sh")


class Azurite(serverproc.Server):
    """One Azurite blob service. ``start()`` returns once it answers and the container exists;
    ``stop()`` ends it (its data is in memory and goes with it)."""

    LOG_FILE = "azurite.log"
    STOP_GRACE_S = 10
    account = ACCOUNT
    key = KEY
    container = CONTAINER

    def __init__(self, folder: Path, debug: bool = True) -> None:
        super().__init__(Path(folder))
        self.debug = debug  # the debug log names every request: off for benchmarks

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    def start(self) -> Azurite:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.port,) = free_ports(1)
        args = [
            str(binary()),
            "--blobHost=127.0.0.1",
            f"--blobPort={self.port}",
            "--inMemoryPersistence",
            "--skipApiVersionCheck",
            "--disableProductStyleUrl",
            "--disableTelemetry",
        ]
        if self.debug:
            args.append(f"--debug={self.state_dir / 'debug.log'}")
        self.proc = serverproc.spawn(args, self.log_path, dict(os.environ))
        try:
            self._wait()
            self.create_container(CONTAINER)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self) -> None:
        """Until the blob service answers HTTP (any status: an unsigned request gets a 4xx)."""
        assert self.proc is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Azurite exited during start; its log:\n{self._tail()}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}?comp=list", timeout=2):
                    return
            except urllib.error.HTTPError:
                return  # it answered
            except (TimeoutError, urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        raise RuntimeError(f"Azurite not answering after {READY_TIMEOUT_S}s; see {self.log_path}")

    def _tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return "(no log)"

    def service_client(self, key: str | None = None) -> Any:
        """A BlobServiceClient of the development account (``key`` overrides its key)."""
        return BlobServiceClient(
            self.endpoint, credential={"account_name": ACCOUNT, "account_key": key or KEY}
        )

    def create_container(self, name: str) -> None:
        with contextlib.suppress(ResourceExistsError):
            self.service_client().create_container(name)
