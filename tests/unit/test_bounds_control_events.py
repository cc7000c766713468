"""The operator's Event queue (``trainingrun.operator.events.EventPoster``) is shared by every
tenant and
fair between namespaces: one namespace flooding it drops its own oldest Events, never another
namespace's, and the namespaces take turns at the API server; the memory it holds stays bounded
(at most ``capacity`` Events in all, ``namespace_share`` per namespace, each message cut to the
1024 characters an Event keeps); within one namespace Events keep the order they were handed
over in."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from trainingrun.operator.events import EventPoster
from trainingrun.operator.metrics import OperatorMetrics


class Writer:
    """The API server's Event creates, recorded in order."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, str]] = []  # (namespace, message)

    def event(self, run: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.posted.append((run["metadata"]["namespace"], message))


def run(namespace: str, name: str = "r1") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"{namespace}-{name}"}}


def test_a_flooding_namespace_does_not_drop_another_namespaces_events() -> None:
    writer = Writer()
    registry = CollectorRegistry()
    metrics = OperatorMetrics(registry)
    poster = EventPoster(writer, metrics)
    for i in range(5000):
        poster.post(run("a"), "Normal", "Started", f"a-{i}")
    for i in range(10):
        poster.post(run("b"), "Warning", "Failed", f"b-{i}")

    poster.start()
    assert poster.flush(timeout=30.0)

    from_b = [m for ns, m in writer.posted if ns == "b"]
    assert from_b == [f"b-{i}" for i in range(10)]
    # Taken in turns: B's Events are not behind A's backlog.
    assert max(writer.posted.index(("b", m)) for m in from_b) < 20
    from_a = [int(m[2:]) for ns, m in writer.posted if ns == "a"]
    assert from_a == sorted(from_a) and from_a[-1] == 4999  # A's newest kept, in order
    assert len(writer.posted) <= 2000  # bounded: A lost its oldest
    dropped = registry.get_sample_value("trainingrun_events_dropped_total")
    assert dropped == 5010 - len(writer.posted)


def test_the_queue_holds_at_most_its_capacity_and_each_namespace_its_share() -> None:
    writer = Writer()
    poster = EventPoster(writer, capacity=100, namespace_share=30)
    for ns in "abcdef":
        for i in range(50):
            poster.post(run(ns), "Normal", "Started", f"{ns}-{i}")

    poster.start()
    assert poster.flush(timeout=30.0)

    counts = {ns: sum(1 for n, _ in writer.posted if n == ns) for ns in "abcdef"}
    assert sum(counts.values()) <= 100
    assert all(count <= 30 for count in counts.values())
    assert min(counts.values()) >= 100 // 6  # an even share each when all flood alike


def test_a_quiet_namespace_keeps_its_events_while_the_queue_is_full() -> None:
    writer = Writer()
    poster = EventPoster(writer, capacity=100, namespace_share=100)
    for ns in "ab":
        for i in range(100):
            poster.post(run(ns), "Normal", "Started", f"{ns}-{i}")
    poster.post(run("c"), "Warning", "Failed", "c-0")

    poster.start()
    assert poster.flush(timeout=30.0)

    assert ("c", "c-0") in writer.posted
    assert len(writer.posted) <= 100


def test_a_queued_message_is_cut_to_what_an_event_holds() -> None:
    writer = Writer()
    poster = EventPoster(writer)
    poster.post(run("a"), "Warning", "Failed", "x" * 100_000)

    poster.start()
    assert poster.flush(timeout=30.0)

    assert writer.posted == [("a", "x" * 1024)]
