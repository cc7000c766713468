"""A small HTTP server for the store bounds tests (tests/unit/test_bounds_stores_*.py), and a
way to run store calls in threads with a bound on how long the test waits for them.

``LocalServer`` listens on 127.0.0.1 only, answers every request with what its ``answer``
function yields (pauses and bytes: a reply trickled one byte a second, a page of a listing that
never ends, a 4xx with a body of the test's choosing), records the requests it got, and stops
on leaving its ``with`` block or after ``lifetime`` seconds, whichever comes first: a client
still waiting then sees its connection closed. Every loop here is bounded in count and time.

The module itself holds one test: the server answers and stops as it says.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

# (seconds to wait first, bytes to send then)
Piece = tuple[float, bytes]
MAX_HEAD = 64 << 10  # a request head the server reads at most
MAX_BODY = 1 << 20  # a request body the server reads at most
MAX_CONNECTIONS = 64  # connections one server accepts in its life


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


Answer = Callable[[Request, int], Iterable[Piece]]


@dataclass
class LocalServer:
    """Answers each request with ``answer(request, index)``'s pieces, in order."""

    answer: Answer
    lifetime: float = 60.0
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = int(self._sock.getsockname()[1])
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._born = time.monotonic()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LocalServer:
        self._start(self._accept)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in list(self._threads):
            t.join(timeout=5)
        self._sock.close()

    def _start(self, target: Callable[..., None], *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(t)
        t.start()

    def _stopping(self) -> bool:
        return self._stop.is_set() or time.monotonic() - self._born > self.lifetime

    def _accept(self) -> None:
        accepted = 0
        while not self._stopping() and accepted < MAX_CONNECTIONS:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            accepted += 1
            self._start(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        with conn, contextlib.suppress(OSError):
            buf = b""
            for _ in range(1000):  # requests on one connection
                request, buf = self._read(conn, buf)
                if request is None:
                    return
                with self._lock:
                    self.requests.append(request)
                    index = len(self.requests) - 1
                for pause, data in self.answer(request, index):
                    if not self._wait(pause):
                        return
                    conn.sendall(data)

    def _wait(self, seconds: float) -> bool:
        """Waits ``seconds`` unless the server stops first (then False)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self._stopping():
                return False
            time.sleep(min(0.05, max(end - time.monotonic(), 0)))
        return not self._stopping()

    def _read(self, conn: socket.socket, buf: bytes) -> tuple[Request | None, bytes]:
        """The next request on ``conn`` (None when it closed or the server stops)."""
        while b"\r\n\r\n" not in buf:
            got = self._recv(conn)
            if not got or len(buf) > MAX_HEAD:
                return None, b""
            buf += got
        head, _, buf = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = [*lines[0].split(" ", 2), "", ""][:3]
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("expect", "").lower() == "100-continue":
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        length = min(int(headers.get("content-length", "0") or 0), MAX_BODY)
        while len(buf) < length:
            got = self._recv(conn)
            if not got:
                return None, b""
            buf += got
        return Request(method, target, headers, buf[:length]), buf[length:]

    def _recv(self, conn: socket.socket) -> bytes:
        while not self._stopping():
            try:
                return conn.recv(65536)
            except TimeoutError:
                continue
        return b""


def reply(status: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    """A whole HTTP/1.1 answer, its Content-Length set from ``body``."""
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def trickled(data: bytes, every: float, then_forever: bytes = b"") -> Iterator[Piece]:
    """``data`` one byte every ``every`` seconds, then ``then_forever`` the same way, again and
    again until the server stops (its lifetime bounds it)."""
    for i in range(len(data)):
        yield every, data[i : i + 1]
    while then_forever:
        for i in range(len(then_forever)):
            yield every, then_forever[i : i + 1]


@dataclass
class Outcome:
    """How one call in ``run_all`` ended: ``done`` False when it was still running."""

    name: str
    seconds: float = 0.0
    error: BaseException | None = None
    result: Any = None
    done: bool = False


def run_all(calls: dict[str, Callable[[], Any]], bound: float) -> dict[str, Outcome]:
    """Runs each call in a thread of its own, all at once, and waits at most ``bound`` seconds
    for them all: a call still running then is reported (``done`` False), not waited for."""
    outcomes = {name: Outcome(name) for name in calls}

    def run(name: str, call: Callable[[], Any]) -> None:
        began = time.monotonic()
        try:
            outcomes[name].result = call()
        except BaseException as e:  # the test looks at it
            outcomes[name].error = e
        outcomes[name].seconds = time.monotonic() - began
        outcomes[name].done = True

    threads = [threading.Thread(target=run, args=item, daemon=True) for item in calls.items()]
    end = time.monotonic() + bound
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(end - time.monotonic(), 0))
    # As they stand now: a call still running may end later, when its server stops.
    return {name: dataclasses.replace(o) for name, o in outcomes.items()}


def test_the_server_answers_records_and_stops_within_its_lifetime() -> None:
    def answer(request: Request, index: int) -> Iterable[Piece]:
        yield 0, reply("200 OK", {}, f"{index}:{request.target}".encode())

    with LocalServer(answer, lifetime=5) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as c:
            c.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while not got.endswith(b"0:/a"):
                got += c.recv(1024)
        assert [r.target for r in server.requests] == ["/a"]
    began = time.monotonic()
    with LocalServer(lambda r, i: trickled(b"HTTP", 0.1, b"x"), lifetime=1) as server:
        c = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        with c:
            c.sendall(b"GET / HTTP/1.1\r\n\r\n")
            while c.recv(1024):  # ends when the server's lifetime is over
                pass
    assert time.monotonic() - began < 4
