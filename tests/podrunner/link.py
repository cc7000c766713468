"""The runner's link to the API server, which a test can cut to simulate a network partition.

While the link is cut the runner makes no API call at all: no heartbeat, no lease renewal, no
pod status write, no final pod delete, no Secret, ConfigMap or token lookup; pod events that
still arrive on an open watch are dropped unread, as if they never got through. The pods'
processes keep running and reach everything else (the S3 endpoint is not the API server). Once
healed, the runner lists its pods again and acts on what it missed, as a kubelet does when it
reconnects.
"""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger("podrunner.link")

# How a test tells the runner process: real-time signals, as the classic ones already carry the
# other node troubles (see the package docstring).
PARTITION_SIGNAL = signal.SIGRTMIN
HEAL_SIGNAL = signal.SIGRTMIN + 1


class Link:
    """Up (the default) or cut; every part of the runner asks before it calls the API."""

    def __init__(self) -> None:
        self._up = threading.Event()
        self._up.set()

    @property
    def up(self) -> bool:
        return self._up.is_set()

    def cut(self) -> None:
        log.warning("link to the API server cut (simulated network partition)")
        self._up.clear()

    def heal(self) -> None:
        log.warning("link to the API server healed")
        self._up.set()

    def wait_up(self, timeout_s: float) -> bool:
        """True once the link is up; False when it is still cut after ``timeout_s``."""
        return self._up.wait(timeout_s)
