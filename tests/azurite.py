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

Command line: ``python -m tests.azurite build`` (install only, prints the executable),
``python -m tests.azurite run FOLDER`` (start, print the endpoint, stay up until Ctrl-C).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from azure.core.exceptions import ResourceExistsError
from azure.storage.blob import BlobServiceClient

from tests.localenv import REPO, free_ports

ACCOUNT = "devstoreaccount1"
# Azurite's development account key: public, documented by Microsoft for the emulator
# (learn.microsoft.com, "Use the Azurite emulator", HTTP connection strings). Not a secret.
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CONTAINER = "trainingrun"
READY_TIMEOUT_S = 30


def binary() -> Path:
    """The azurite-blob executable, installed on first use (hack/install-azurite.sh)."""
    proc = subprocess.run(
        ["bash", str(REPO / "hack" / "install-azurite.sh")],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError("hack/install-azurite.sh failed; its output above names the step")
    return Path(proc.stdout.strip().splitlines()[-1])


class Azurite:
    """One Azurite blob service. ``start()`` returns once it answers and the container exists;
    ``stop()`` ends it (its data is in memory and goes with it)."""

    account = ACCOUNT
    key = KEY
    container = CONTAINER

    def __init__(self, folder: Path, debug: bool = True) -> None:
        self.folder = Path(folder)
        self.debug = debug  # the debug log names every request: off for benchmarks
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    @property
    def log_path(self) -> Path:
        return self.folder / "azurite.log"

    def start(self) -> Azurite:
        self.folder.mkdir(parents=True, exist_ok=True)
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
            args.append(f"--debug={self.folder / 'debug.log'}")
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.folder
        )
        log.close()  # the child holds its own descriptor
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

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def __enter__(self) -> Azurite:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.azurite")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="install Azurite (npm) into the cache; print its executable")
    run = sub.add_parser("run", help="start Azurite, print its endpoint, stay up until Ctrl-C")
    run.add_argument("folder", type=Path, help="its workspace and logs")
    args = parser.parse_args(argv)
    if args.command == "build":
        print(binary())
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so the with block stops Azurite
    with Azurite(args.folder) as az:
        print(f"endpoint {az.endpoint} account {az.account} container {az.container}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while az.proc is not None and az.proc.poll() is None:
                time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
