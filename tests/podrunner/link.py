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
import time
from collections.abc import Callable
from typing import Any

from kubernetes import watch
from kubernetes.client.rest import ApiException

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


def list_and_watch(
    link: Link,
    stopped: threading.Event,
    relist: Callable[[], str],
    list_call: Callable[..., Any],
    apply: Callable[[str, dict[str, Any]], None],
    what: str,
    timeout_s: float,
    retry_s: float = 1.0,
    **selector: Any,
) -> None:
    """An informer's loop over ``list_call(**selector)`` until ``stopped``: ``relist()`` (which
    returns the list's resourceVersion) at start, after a cut link and after 410 Gone, then every
    watch event to ``apply(type, object)``. While the link is cut nothing is read: events still
    arriving on an open watch are dropped, and a fresh list follows the heal."""
    version: str | None = None
    while not stopped.is_set():
        if not link.wait_up(1.0):
            version = None  # what happened meanwhile is learnt from a fresh list
            continue
        try:
            if version is None:
                version = relist()
            stream = watch.Watch().stream(
                list_call, resource_version=version, timeout_seconds=timeout_s, **selector
            )
            for event in stream:
                if stopped.is_set() or not link.up:
                    break
                if event["type"] == "ERROR":
                    version = None  # 410 Gone and friends: list again
                    break
                raw = event["raw_object"]
                version = raw["metadata"]["resourceVersion"]
                apply(event["type"], raw)
        except ApiException as e:
            if e.status == 410:
                version = None
            else:
                log.warning("%s watch failed: %s", what, e.reason)
                time.sleep(retry_s)
        except Exception as e:  # connection reset, API restarting
            log.warning("%s watch failed: %s", what, e)
            time.sleep(retry_s)
