"""A wall-clock deadline for each call of a store whose ``CallBudget`` has a ``call_deadline``
(the operator's): however slowly an endpoint sends its status line, headers, body or the pages
of a listing, the call ends by then with ``storage.base.CallTimedOut``.

The clients' own timeouts bound each wait for bytes, not a call, so the deadline is kept at the
socket: a store method runs ``within`` its call's ``Deadline`` (a thread-local, as each SDK
makes a call's requests on the calling thread), and every connection of a bounded client
(``BoundedAdapter`` for requests, ``bound_botocore`` for boto3) checks it before each send and
receive, and waits no longer than the time left. Past it, the I/O raises ``DeadlinePassed``,
which no SDK retries; the store turns that, or a timeout of the SDK's after it, into
``CallTimedOut`` naming the endpoint and the deadline (``settle``). A listing keeps one deadline
across its pages and still fetches them one at a time.
"""

from __future__ import annotations

import contextlib
import functools
import io
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from botocore import awsrequest
from requests.adapters import HTTPAdapter
from urllib3 import PoolManager, connection, connectionpool, poolmanager

from trainingrun.storage.base import CallTimedOut, StorageError, StorageUnavailable

P = ParamSpec("P")
R = TypeVar("R")


class Deadline:
    """When one call must have ended, by ``time.monotonic``."""

    def __init__(self, seconds: float, endpoint: str) -> None:
        self.seconds, self.endpoint = seconds, endpoint
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return self.at - time.monotonic()


class DeadlinePassed(Exception):  # not an OSError: no SDK takes it for a retry
    """The socket of a bounded connection was used past its call's deadline."""

    def __init__(self, deadline: Deadline) -> None:
        super().__init__(f"past the {deadline.seconds:g} s deadline of the call")
        self.deadline = deadline


_local = threading.local()


def current() -> Deadline | None:
    """The deadline of the call this thread is in, if any."""
    return cast("Deadline | None", getattr(_local, "deadline", None))


@contextlib.contextmanager
def within(deadline: Deadline | None) -> Iterator[None]:
    """Runs the block under ``deadline`` (None: as it is); inside a call already bounded, the
    earlier deadline stays."""
    outer = current()
    if deadline is None or (outer is not None and outer.at <= deadline.at):
        yield
        return
    _local.deadline = deadline
    try:
        yield
    finally:
        _local.deadline = outer


class Bounded:
    """A store whose calls may have a deadline: ``call_deadline`` seconds (None: none), told
    against ``endpoint`` in the error."""

    call_deadline: float | None = None
    endpoint: str = "the endpoint"

    def new_deadline(self) -> Deadline | None:
        return None if self.call_deadline is None else Deadline(self.call_deadline, self.endpoint)


def one_call(method: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """Makes a ``Bounded`` store's method one call: within a deadline of its own."""

    def bounded(store: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with within(store.new_deadline()):
            return method(store, *args, **kwargs)

    functools.update_wrapper(bounded, method)
    return bounded


def settle(err: BaseException, where: str, translate: Callable[[], StorageError]) -> StorageError:
    """What a store raises for ``err``, of a call about ``where``: CallTimedOut when the call's
    deadline passed (the SDK may have wrapped the DeadlinePassed, or timed out just after it),
    else ``translate()``'s error."""
    deadline = current()
    if isinstance(err, DeadlinePassed):
        deadline = err.deadline
    elif deadline is None or deadline.left() > 0:
        return translate()
    elif not isinstance(got := translate(), StorageUnavailable):
        return got  # an answer (404, 412...) that came in time
    return CallTimedOut(where, deadline.endpoint, deadline.seconds)


def _timeout_for(base: float | None) -> float | None:
    """The socket timeout for the next send or receive: ``base``, shortened to the time left
    to the call's deadline. Raises DeadlinePassed when none is left."""
    deadline = current()
    if deadline is None:
        return base
    left = deadline.left()
    if left <= 0:
        raise DeadlinePassed(deadline)
    return left if base is None else min(base, left)


def _timed_out(err: TimeoutError) -> BaseException:
    deadline = current()
    return DeadlinePassed(deadline) if deadline is not None and deadline.left() <= 0 else err


class _Reader(io.RawIOBase):
    """A connection's reads (status line, headers, body), each within the deadline."""

    def __init__(self, sock: _BoundedSocket) -> None:
        super().__init__()
        self._sock = sock
        self._raw = sock.raw.makefile("rb", buffering=0)  # counts as a user of the socket

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return int(self._raw.fileno())

    def readinto(self, buffer: Any) -> int | None:
        self._sock.raw.settimeout(_timeout_for(self._sock.base))
        try:
            return cast("int | None", self._raw.readinto(buffer))
        except TimeoutError as e:
            raise _timed_out(e) from None

    def close(self) -> None:
        self._raw.close()
        super().close()


class _BoundedSocket:
    """A connection's socket whose sends and receives keep to the call's deadline; the rest
    goes to the socket itself. ``base`` is the timeout the HTTP library set."""

    def __init__(self, sock: Any) -> None:
        self.raw, self.base = sock, sock.gettimeout()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

    def settimeout(self, timeout: float | None) -> None:
        self.base = timeout
        self.raw.settimeout(timeout)

    def gettimeout(self) -> float | None:
        return cast("float | None", self.base)

    def sendall(self, data: Any, *flags: int) -> None:
        self.raw.settimeout(_timeout_for(self.base))
        try:
            self.raw.sendall(data, *flags)
        except TimeoutError as e:
            raise _timed_out(e) from None

    def makefile(self, mode: str = "r", buffering: int | None = None, **_: Any) -> Any:
        if "r" not in mode or "w" in mode:
            return self.raw.makefile(mode, buffering)
        reader = _Reader(self)
        return reader if buffering == 0 else io.BufferedReader(reader, io.DEFAULT_BUFFER_SIZE)


def _connect(conn: Any, make: Callable[[], None]) -> None:
    """Connects ``conn`` (TCP and TLS) in no more than the time left, then bounds its socket."""
    left = _timeout_for(conn.timeout if isinstance(conn.timeout, int | float) else None)
    if left is not None:
        conn.timeout = left
    try:
        make()
    except TimeoutError as e:
        raise _timed_out(e) from None
    conn.sock = _BoundedSocket(conn.sock)


class _HTTPConnection(connection.HTTPConnection):
    def connect(self) -> None:
        _connect(self, super().connect)


class _HTTPSConnection(connection.HTTPSConnection):
    def connect(self) -> None:
        _connect(self, super().connect)


class _AWSHTTPConnection(awsrequest.AWSHTTPConnection):
    def connect(self) -> None:
        _connect(self, super().connect)


class _AWSHTTPSConnection(awsrequest.AWSHTTPSConnection):
    def connect(self) -> None:
        _connect(self, super().connect)


class _HTTPPool(connectionpool.HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(connectionpool.HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


class _AWSHTTPPool(awsrequest.AWSHTTPConnectionPool):
    ConnectionCls = _AWSHTTPConnection


class _AWSHTTPSPool(awsrequest.AWSHTTPSConnectionPool):
    ConnectionCls = _AWSHTTPSConnection


def _bound_pools(manager: PoolManager) -> PoolManager:
    """``manager`` (or a proxy's) making bounded connections; a SOCKS manager, whose pools are
    its own, stays as it is."""
    if manager.pool_classes_by_scheme is poolmanager.pool_classes_by_scheme:
        manager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}
    return manager


class BoundedAdapter(HTTPAdapter):
    """A requests adapter whose connections keep to the calls' deadlines."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        _bound_pools(self.poolmanager)

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> PoolManager:
        return _bound_pools(super().proxy_manager_for(proxy, **kwargs))


def bound_botocore(client: Any) -> None:
    """Makes the connections of a boto3 client keep to the calls' deadlines. botocore takes no
    connection classes in its settings, so its session's table of them (shared with its pool
    and proxy managers) is changed before its first call; a botocore that keeps them elsewhere
    is an error here, not a client without a deadline."""
    session = client._endpoint.http_session
    table = getattr(session, "_pool_classes_by_scheme", None)
    if not isinstance(table, dict) or session._manager.pool_classes_by_scheme is not table:
        raise RuntimeError("this botocore keeps its connection classes elsewhere")
    table.update(http=_AWSHTTPPool, https=_AWSHTTPSPool)
