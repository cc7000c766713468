"""SIGTERM for the sync sidecar, kept from the first moment of the process.

The sidecar's start-up is slow (boto3's import, the S3 client, the endpoint's capabilities, the
first scan). A sidecar restarted after a crash may be stopped during it: with Python's default
handler that kills it (exit 143) and the complete checkpoint waiting on disk is never uploaded.
``install()`` records the request instead, first thing; the sync loop attaches once it exists
and drains as soon as its start-up is done.

Stdlib only: ``trainingrun sync`` imports this before anything slow.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

Listener = Callable[[int, FrameType | None], None]


class StopRequest:
    """SIGTERM received or not; forwarded to the one listener once attached."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        # No lock: the handler runs in the main thread between two bytecodes, possibly inside
        # attach(); one attribute read or write is atomic.
        self._listener: Listener | None = None

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.requested.set()
        listener = self._listener
        if listener is not None:
            listener(signum, frame)

    def attach(self, listener: Listener) -> None:
        """From now on SIGTERM goes to ``listener``; one that came before is given to it now
        (a signal between the two lines reaches it twice, which it takes as once)."""
        self._listener = listener
        if self.requested.is_set():
            listener(signal.SIGTERM, None)


_installed: StopRequest | None = None


def install() -> StopRequest:
    """The process's StopRequest, installed as the SIGTERM handler on the first call (from the
    main thread, as Python requires)."""
    global _installed  # noqa: PLW0603 - a signal handler is process-wide by nature
    if _installed is None:
        request = StopRequest()
        signal.signal(signal.SIGTERM, request.on_signal)
        _installed = request
    return _installed
