"""Leader election on a ``coordination.k8s.io`` Lease: two or more operator replicas, one acting.

The election is the kubernetes client's ``leaderelection`` (a candidate takes the lock when its
holder has not renewed it for ``lease_duration``; the holder renews every ``retry_period``);
this module gives it a lock on a Lease, where the client ships only a ConfigMap lock. Every write
is a replace with the resourceVersion read, so two candidates never both win one round.

A replica runs the operator only once it holds the Lease; until then it waits (its liveness
endpoint answers meanwhile). A leader that cannot renew for ``renew_deadline`` exits at once
(the kubelet restarts it as a candidate). Because ``renew_deadline`` plus one ``retry_period``
is shorter than ``lease_duration``, it has stopped before any other replica can take the Lease:
never do two replicas act at once, as long as their clocks run at the same rate.
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.leaderelectionrecord import LeaderElectionRecord

log = logging.getLogger("trainingrun.leader")

EXIT_LOST_LEADERSHIP = 75  # EX_TEMPFAIL: restarted by the kubelet as a candidate


@dataclass(frozen=True)
class Timing:
    """Seconds. A standby leads within about ``lease_duration + retry_period`` of the leader's
    last renewal; the leader gives up ``renew_deadline + retry_period`` after it, sooner."""

    lease_duration: int = 10
    renew_deadline: int = 6
    retry_period: int = 2

    def __post_init__(self) -> None:
        if self.renew_deadline + self.retry_period >= self.lease_duration:
            raise ValueError(
                "leader election: renew_deadline + retry_period must be shorter than "
                "lease_duration, or a leader could still act after another took the Lease"
            )


class _Failed:
    """What the election reads from a failed get: a JSON body with the HTTP code."""

    def __init__(self, code: int, reason: str) -> None:
        self.body = json.dumps({"code": code})
        self.reason = reason


class LeaseLock:
    """The election's lock (``get``, ``create``, ``update``) on one Lease."""

    def __init__(
        self, api: client.CoordinationV1Api, name: str, namespace: str, identity: str
    ) -> None:
        self.api, self.name, self.namespace, self.identity = api, name, namespace, identity
        self._lease: Any = None  # the Lease as last read: its resourceVersion guards the update

    def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        try:
            self._lease = self.api.read_namespaced_lease(name, namespace)
        except ApiException as e:
            return False, _Failed(int(e.status or 0), str(e.reason))
        except Exception as e:  # the API server unreachable: not an error of the election's
            return False, _Failed(0, type(e).__name__)
        spec = self._lease.spec
        if spec is None or not spec.holder_identity:
            return True, None
        return True, LeaderElectionRecord(
            spec.holder_identity,
            str(spec.lease_duration_seconds),
            str(spec.acquire_time),
            str(spec.renew_time),
        )

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        now = datetime.now(UTC)
        lease = client.V1Lease(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
            spec=client.V1LeaseSpec(
                holder_identity=election_record.holder_identity,
                lease_duration_seconds=int(election_record.lease_duration),
                acquire_time=now,
                renew_time=now,
                lease_transitions=0,
            ),
        )
        try:
            self.api.create_namespaced_lease(namespace, lease)
        except Exception as e:  # 409: another candidate created it first
            log.debug("lease %s/%s not created: %s", namespace, name, e)
            return False
        return True

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        lease = self._lease
        if lease is None:
            return False
        spec = lease.spec or client.V1LeaseSpec()
        now = datetime.now(UTC)
        taken = spec.holder_identity != updated_record.holder_identity
        spec.holder_identity = updated_record.holder_identity
        spec.lease_duration_seconds = int(updated_record.lease_duration)
        spec.renew_time = now
        if taken or spec.acquire_time is None:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + (1 if taken else 0)
        lease.spec = spec
        try:
            self._lease = self.api.replace_namespaced_lease(name, namespace, lease)
        except Exception as e:  # 409: someone else wrote it since our read
            log.debug("lease %s/%s not updated: %s", namespace, name, e)
            return False
        return True


def identity() -> str:
    """This replica's name in the Lease: its pod name and process."""
    return f"{os.environ.get('HOSTNAME') or 'operator'}-{os.getpid()}"


class _Alive(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a probe every few seconds is not news


@contextmanager
def answering(liveness: str | None) -> Iterator[None]:
    """Answers the liveness probe while this replica waits to lead; the port is free again
    when the operator (which serves the probe from then on) starts."""
    if not liveness:
        yield
        return
    url = urllib.parse.urlsplit(liveness)
    server = http.server.ThreadingHTTPServer((url.hostname or "", url.port or 80), _Alive)
    thread = threading.Thread(target=server.serve_forever, name="standby-liveness", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def lead(
    api_client: Any,
    name: str,
    namespace: str,
    timing: Timing = Timing(),
    me: str | None = None,
    liveness: str | None = None,
) -> None:
    """Returns once this replica holds the Lease; from then on a background thread renews it,
    and ends the process the moment a renewal fails for ``renew_deadline``. ``liveness``: the
    operator's liveness endpoint, answered while waiting."""
    me = me or identity()
    lock = LeaseLock(client.CoordinationV1Api(api_client), name, namespace, me)
    leading = threading.Event()

    def stopped() -> None:
        log.error("lost the lease %s/%s: exiting so that no two replicas act", namespace, name)
        logging.shutdown()
        os._exit(EXIT_LOST_LEADERSHIP)

    config = electionconfig.Config(
        lock,
        lease_duration=timing.lease_duration,
        renew_deadline=timing.renew_deadline,
        retry_period=timing.retry_period,
        onstarted_leading=leading.set,
        onstopped_leading=stopped,
    )
    # The election logs every round at INFO ("yet to finish lease_duration ..."): its own
    # transitions are said here instead.
    logging.getLogger("leaderelection").setLevel(logging.WARNING)
    log.info("%s: waiting to lead (lease %s/%s)", me, namespace, name)
    election = leaderelection.LeaderElection(config)
    with answering(liveness):
        threading.Thread(target=election.run, name="leader-election", daemon=True).start()
        leading.wait()
    log.info("%s: leading (lease %s/%s)", me, namespace, name)
