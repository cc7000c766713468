"""The unprotected-run warning end to end: the operator, the real control plane, SeaweedFS, and
each attempt's pod run as real processes by the local pod runner (sync sidecar and a trainer
that is a few lines of Python).

Covers, with ``spec.checkpoint.unprotectedAfterSeconds: 8``, two trainers that never get a
checkpoint committed:

- one that writes files of a layout no format knows into ``$TRAININGRUN_CHECKPOINT_DIR``
  (``weights/model-000.bin``, ``model-001.bin``... growing, no marker): the sidecar logs that
  they match no format;
- one that writes nothing at all.

For each: the Warning Event ``Unprotected`` is posted once, the condition ``Protected`` is False
with reason ``Unprotected`` and a message naming the folder and the fix, and the run keeps
running. The seconds from the trainer's start (and from the pod's ``status.startTime``) to the
Event are printed and must lie between the limit (less 1 s: the times have whole seconds) and
the limit plus ``SLACK``. The test operator resyncs only every 600 s, so the Event on time also
shows the pass planned for the deadline.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.example import on_nodes
from tests.e2e.test_full_chain import node_of, runner_for
from tests.integration.support import Runs, trainingrun, wait_for
from tests.localenv import LocalEnv
from tests.podrunner import RunnerHandle
from trainingrun.contract import SYNC_CONTAINER, TRAINER_CONTAINER

pytestmark = pytest.mark.usefixtures("operator")

LIMIT = 8  # spec.checkpoint.unprotectedAfterSeconds
SLACK = 10  # seconds allowed past it: a pass, a status write and the Event, on a busy machine

# Grows weights/model-NNN.bin by 4 KiB every 0.5 s, a new file every 2 s: no format's layout.
UNKNOWN_LAYOUT = """
import os, pathlib, time
folder = pathlib.Path(os.environ["TRAININGRUN_CHECKPOINT_DIR"]) / "weights"
folder.mkdir(parents=True, exist_ok=True)
for i in range(1200):
    with open(folder / f"model-{i // 4:03d}.bin", "ab") as f:
        f.write(os.urandom(4096))
    time.sleep(0.5)
"""
NOTHING = "import time; time.sleep(600)"
NO_FORMAT = "match no checkpoint format"


def unprotected_run(name: str, env: LocalEnv, prefix: str, nodes: list[str], script: str) -> Any:
    body = trainingrun(name, env, prefix)
    body["spec"]["checkpoint"]["unprotectedAfterSeconds"] = LIMIT
    body["spec"]["template"]["spec"] = {
        **on_nodes(nodes),
        "containers": [
            {
                "name": TRAINER_CONTAINER,
                "image": "example.invalid/trainer:1",  # the pod runner runs the command locally
                "command": ["python", "-c", script],
            }
        ],
    }
    return body


def trainer_started(pod: Any) -> Any:
    """The trainer container's ``state.running.startedAt``."""
    trainer = next(c for c in pod.status.container_statuses if c.name == TRAINER_CONTAINER)
    return trainer.state.running.started_at


def delete_run(runs: Runs, name: str) -> None:
    """Deletes the run and waits until its pods are gone (owner references)."""
    runs.delete(name)
    wait_for(lambda: not runs.pods_of(name), 60, f"the pods of {name} to go")


@pytest.mark.parametrize(
    ("script", "writes"),
    [(UNKNOWN_LAYOUT, True), (NOTHING, False)],
    ids=["unknown-layout", "writes-nothing"],
)
def test_a_run_that_commits_nothing_is_warned_within_the_limit(
    runs: Runs,
    localenv: LocalEnv,
    prefix: str,
    runner_nodes: list[RunnerHandle],
    script: str,
    writes: bool,
) -> None:
    name = "unknown" if writes else "silent"
    runs.create(unprotected_run(name, localenv, prefix, [h.node for h in runner_nodes], script))
    pod_name = f"{name}-1"
    pod = wait_for(
        lambda: (p := runs.pod(pod_name)) and p.status.container_statuses and trainer_started(p),
        60,
        f"the trainer of {pod_name} running",
    )

    event = runs.wait_events(name, "Unprotected", timeout_s=LIMIT + SLACK + 30)[0]

    pod = runs.pod(pod_name)
    from_trainer = (event.first_timestamp - trainer_started(pod)).total_seconds()
    from_pod = (event.first_timestamp - pod.status.start_time).total_seconds()
    print(
        f"{name}: Unprotected Event {from_trainer:.0f} s after the trainer started, "
        f"{from_pod:.0f} s after the pod's startTime (limit {LIMIT} s, slack {SLACK} s)"
    )
    assert event.type == "Warning"
    assert LIMIT - 1 <= from_trainer <= LIMIT + SLACK, from_trainer
    status = runs.status(name)
    protected = next(c for c in status["conditions"] if c["type"] == "Protected")
    assert (protected["status"], protected["reason"]) == ("False", "Unprotected")
    assert protected["message"] == event.message
    assert f"no checkpoint committed in the {LIMIT} s since its trainer started" in event.message
    assert "/checkpoints" in event.message and "spec.checkpoint.format" in event.message
    assert status["phase"] == "Running" and status.get("latestCheckpoint") is None
    runner = runner_for(runner_nodes, node_of(runs, pod_name))

    def sync_log() -> str:
        return runner.log_of(runs.namespace, pod_name, SYNC_CONTAINER)

    if writes:  # the sidecar saw the files and said why it uploads none
        wait_for(lambda: NO_FORMAT in sync_log(), 15, "the sidecar's warning on the files")
        assert "weights/model-000.bin" in sync_log(), sync_log()[-2000:]
    else:
        assert NO_FORMAT not in sync_log(), sync_log()[-2000:]
    time.sleep(2)  # a pass or two more (the trainer's files, the status echo): no second Event
    assert [e.reason for e in runs.events(name)].count("Unprotected") == 1

    delete_run(runs, name)
    with pytest.raises(client.ApiException) as gone:
        runs.get(name)
    assert gone.value.status == 404
