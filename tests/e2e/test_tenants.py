"""One operator shared by tenants who make mistakes or mean harm, end to end: an operator of the
module's own at ``--verbose`` with the admin's allowlists (tests/e2e/tenancy.py), the real
control plane and SeaweedFS, kwok nodes, and a local pod runner node on which pods run as real
processes (restore, sync sidecar, a trainer of a few lines of Python).

Covers:
- a planted secret: a run whose credentials Secret holds keys that are markers (SeaweedFS's
  ``planted`` identity, so the checkpoints it commits prove the keys were used) goes through
  start, preemption, failure and success; neither key shows in the operator's log, the logs of
  every container of every attempt (the trainer prints its whole environment), the pod runner's
  log, the namespace's Events, the run's status or any attempt's pod;
- revoked credentials: the Secret rotated to a key that may not write, the sidecar restarted
  (as after a crash) gives up after ``ACCESS_DENIED_SECONDS``, the run says Protected False
  (AccessDenied) while it keeps training, and commits again once the Secret is fixed;
- hostile inputs (``test_hostile_inputs_get_clear_outcomes_and_supervision_goes_on``): bad
  spec fields and template tricks refused at apply, storage a tenant may not use, Secrets that
  are missing or malformed, endpoints that never answer, manifests that are garbage, too big or
  too long, checkpoints with names no disk can hold or larger than the run's disk, template
  annotations that fake the operator's signals, init containers that fake the restore's exit:
  each gets its own clear outcome while a witness run in another namespace is preempted again
  and again, each preemption handled within ``WITNESS_LIMIT`` seconds.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.conftest import create_kwok_node, paused_session_operators
from tests.e2e.hostile import HOSTILE, REFUSED, SLOW_ENDPOINTS, Tenant
from tests.e2e.tenancy import (
    ACCESS_DENIED_SECONDS,
    MISSING_BUCKET,
    Blackhole,
    Trickle,
    Witness,
    on_runner,
    operator_env,
    tenant_run,
)
from tests.integration.support import (
    OperatorProcess,
    Runs,
    credentials_secret,
    wait_for,
)
from tests.localenv import LocalEnv, s3_client
from tests.podrunner import RunnerHandle
from trainingrun import api

# Seconds from the witness's eviction to its next attempt's pod, at most, while the tenants
# misbehave; unhindered it takes one pass (0.1 s here).
WITNESS_LIMIT = 5.0

# A trainer in HuggingFace Trainer's layout: it prints its whole environment (so its log would
# show any credential it was given), saves checkpoint-<step>/ one step past where it resumed,
# then waits to be preempted (attempt 1), fails (attempt 2) or succeeds (attempt 3 on).
TRAINER = r"""
import json, os, pathlib, sys, time
for key in sorted(os.environ):
    print(f"{key}={os.environ[key]}", flush=True)
attempt = int(os.environ["TRAININGRUN_ATTEMPT"])
step = int(os.environ.get("TRAININGRUN_RESUME_STEP") or 0) + 1
folder = pathlib.Path(os.environ["TRAININGRUN_CHECKPOINT_DIR"]) / f"checkpoint-{step}"
folder.mkdir(parents=True)
(folder / "model.bin").write_bytes(os.urandom(4096))
(folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
print(f"attempt {attempt}: saved step {step}", flush=True)
if attempt == 1:
    time.sleep(600)
time.sleep(2)
sys.exit(1 if attempt == 2 else 0)
"""

# Saves checkpoint-1, -2, ... every 2 s until stopped (the revoked-credentials trainer).
SAVER = r"""
import json, os, pathlib, time
root = pathlib.Path(os.environ["TRAININGRUN_CHECKPOINT_DIR"])
for step in range(1, 300):
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.bin").write_bytes(os.urandom(4096))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    time.sleep(2)
"""


@pytest.fixture(scope="module")
def blackhole() -> Iterator[Blackhole]:
    hole = Blackhole()
    yield hole
    hole.close()


@pytest.fixture(scope="module")
def trickle() -> Iterator[Trickle]:
    """An allowed endpoint that answers a byte every 2 s."""
    slow = Trickle()
    yield slow
    slow.close()


@pytest.fixture(scope="module")
def token_trap() -> Iterator[Trickle]:
    """Where a hostile Google key file sends its token requests: nothing may connect."""
    trap = Trickle()
    yield trap
    trap.close()


@pytest.fixture(scope="module")
def tenant_operator(
    localenv: LocalEnv,
    operator: OperatorProcess,
    blackhole: Blackhole,
    trickle: Trickle,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    """The module's operator, at --verbose, with the admin's allowlists; the session one
    (``operator``, asked for so that `make demo`'s is stopped too) pauses meanwhile."""
    del operator
    with paused_session_operators():
        proc = OperatorProcess(
            localenv,
            tmp_path_factory.mktemp("tenant-operator") / "operator.log",
            extra_env=operator_env(localenv, blackhole, trickle, MISSING_BUCKET),
            args=["--verbose"],
        )
        proc.start()
        yield proc
        proc.stop()


@pytest.fixture(scope="module")
def module_namespaces(core_v1: Any) -> Iterator[Callable[[str], str]]:
    """Namespaces that live as long as the module."""
    made: list[str] = []

    def make(prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        made.append(name)
        return name

    yield make
    for name in made:
        core_v1.delete_namespace(name)


@pytest.fixture(scope="module")
def witness(
    tenant_operator: OperatorProcess,
    api_client: Any,
    localenv: LocalEnv,
    core_v1: Any,
    module_namespaces: Callable[[str], str],
) -> Iterator[Witness]:
    node = create_kwok_node(core_v1)
    runs = Runs.with_credentials(api_client, module_namespaces("witness"), localenv)
    w = Witness(runs, localenv, s3_client(localenv))  # module-scoped: its own client
    w.start(node)
    yield w
    core_v1.delete_node(node)


# -- the planted secret --------------------------------------------------------------------------


def test_a_planted_secret_shows_in_no_log_event_status_or_pod(
    tenant_operator: OperatorProcess,
    runner: RunnerHandle,
    localenv: LocalEnv,
    api_client: Any,
    module_namespaces: Callable[[str], str],
) -> None:
    access_key, secret_key = localenv.identity("planted")
    runs = Runs(api_client, module_namespaces("planted"))
    planted = credentials_secret(localenv, "planted", identity="planted")
    runs.core.create_namespaced_secret(runs.namespace, planted)
    body = tenant_run("planted", localenv, runs.namespace, secret="planted")
    runs.create(on_runner(body, runner.node, TRAINER))
    pods: dict[str, dict[str, Any]] = {}

    def keep(attempt: int) -> None:
        pod = wait_for(lambda: runs.pod(f"planted-{attempt}"), 60, f"attempt {attempt}'s pod")
        pods[pod.metadata.name] = api_client.sanitize_for_serialization(pod)

    keep(1)
    runs.wait_status(
        "planted",
        lambda s: (s.get("latestCheckpoint") or {}).get("step") == 1,
        60,
        "step 1 committed with the planted keys",
    )
    runs.core.create_namespaced_pod_eviction(
        "planted-1",
        runs.namespace,
        client.V1Eviction(metadata=client.V1ObjectMeta(name="planted-1")),
    )
    keep(2)
    keep(3)
    status = runs.wait_status(
        "planted", lambda s: s.get("phase") == "Succeeded", 120, "the run to succeed"
    )
    assert (status["preemptions"], status["restarts"], status["attempt"]) == (1, 1, 3)
    assert status["latestCheckpoint"]["step"] == 3  # committed with the planted keys

    folders = sorted(runner.state_dir.glob(f"{runs.namespace}_planted-*"))
    logs = {
        p.name + "/" + f.name: f.read_text(errors="replace")
        for p in folders
        for f in p.glob("*.log")
    }
    assert {"trainer.log", "trainingrun-sync.log", "trainingrun-restore.log"} <= {
        k.split("/")[1] for k in logs
    }, sorted(logs)
    assert "attempt 3: saved step 3" in logs[f"{runs.namespace}_planted-3/trainer.log"]
    seen = {
        "operator log": tenant_operator.log_path.read_text(errors="replace"),
        "pod runner log": runner.runner_log(),
        **logs,
        "events": json.dumps(
            api_client.sanitize_for_serialization(runs.core.list_namespaced_event(runs.namespace))
        ),
        "the run": json.dumps(runs.get("planted")),
        "pods": json.dumps(pods),
    }
    assert "DEBUG" in seen["operator log"]  # --verbose took
    for marker in (access_key, secret_key):
        found = [where for where, text in seen.items() if marker in text]
        assert not found, f"{marker[:8]}... found in {found}"


# -- revoked credentials -------------------------------------------------------------------------


def test_revoked_credentials_turn_protected_false_and_a_fixed_secret_commits_again(
    tenant_operator: OperatorProcess,
    runner: RunnerHandle,
    localenv: LocalEnv,
    api_client: Any,
    module_namespaces: Callable[[str], str],
) -> None:
    runs = Runs.with_credentials(api_client, module_namespaces("revoked"), localenv)
    runs.create(on_runner(tenant_run("revoked", localenv, runs.namespace), runner.node, SAVER))
    runs.wait_status("revoked", lambda s: s.get("latestCheckpoint"), 60, "a checkpoint committed")
    # Rotated to a key that may read but not write; the sidecar restarts (as after a crash)
    # and reads it. The kubelet resolves a Secret's env at each start; so does the runner.
    readonly = credentials_secret(localenv, identity="readonly")
    runs.core.patch_namespaced_secret("s3creds", runs.namespace, readonly)
    sync_pid = runner.wait_pid(runs.namespace, "revoked-1", "trainingrun-sync")
    os.kill(sync_pid, signal.SIGKILL)
    denied_at = time.monotonic()

    def protected() -> dict[str, Any] | None:
        conditions = runs.status("revoked").get("conditions") or []
        return next((c for c in conditions if c["type"] == "Protected"), None)

    cond = wait_for(
        lambda: (c := protected()) and c["reason"] == "AccessDenied" and c,
        ACCESS_DENIED_SECONDS + 60,
        "Protected False with AccessDenied",
    )
    print(f"\nrevoked: Protected False (AccessDenied) {time.monotonic() - denied_at:.1f} s after")
    assert cond["status"] == "False"
    assert "checkpoints are not being committed: access denied" in cond["message"]
    assert readonly.string_data["AWS_SECRET_ACCESS_KEY"] not in cond["message"]
    assert runs.status("revoked")["phase"] == "Running"
    stuck = runs.status("revoked")["latestCheckpoint"]["step"]

    runs.core.patch_namespaced_secret("s3creds", runs.namespace, credentials_secret(localenv))
    runs.wait_status(
        "revoked",
        lambda s: (
            s["latestCheckpoint"]["step"] > stuck
            and any(c["type"] == "Protected" and c["status"] == "True" for c in s["conditions"])
        ),
        ACCESS_DENIED_SECONDS + 60,
        "commits again with the fixed Secret",
    )
    runs.delete("revoked")


# -- hostile inputs (tests/e2e/hostile.py) --------------------------------------------------


def test_hostile_inputs_get_clear_outcomes_and_supervision_goes_on(
    tenant_operator: OperatorProcess,
    witness: Witness,
    runner: RunnerHandle,
    blackhole: Blackhole,
    trickle: Trickle,
    token_trap: Trickle,
    localenv: LocalEnv,
    api_client: Any,
    s3: Any,
    module_namespaces: Callable[[str], str],
) -> None:
    usual = witness.preempt()
    t, slow = (
        Tenant(
            Runs.with_credentials(api_client, module_namespaces(prefix), localenv),
            localenv,
            s3,
            runner.node,
            blackhole,
            trickle,
            token_trap,
        )
        for prefix in ("hostile", "slow-endpoints")
    )
    report: list[str] = []

    for case in REFUSED:
        body = t.run(case.name)
        case.change(body)
        try:
            t.runs.custom.create_namespaced_custom_object(
                api.GROUP,
                api.VERSION,
                t.runs.namespace,
                api.PLURAL,
                body,
                field_validation="Strict",
            )
        except client.ApiException as e:
            said = case.says in (e.body or "")
            if e.status not in (400, 422) or not said:
                report.append(f"{case.name}: {e.status} {e.body}")
            print(f"refused {case.name}: {e.status} {said}")
        else:
            report.append(f"{case.name}: accepted")

    cases = [(t, case) for case in HOSTILE] + [(slow, case) for case in SLOW_ENDPOINTS]
    for tenant, case in cases:
        case.make(tenant, case.name)
    pending = {case.name: (tenant, case.check) for tenant, case in cases}
    seen: dict[str, str | None] = {}
    deadline = time.monotonic() + 150
    while pending and time.monotonic() < deadline:
        witness.preempt()
        for name, (tenant, check) in list(pending.items()):
            seen[name] = check(tenant, name)
            if seen[name] is None:
                print(f"outcome {name}: as expected")
                del pending[name]
    report += [f"{name}: {seen.get(name)}" for name in pending]
    for _ in range(2):  # the outcomes hold: nothing crashed, nothing loops
        witness.preempt()
    assert tenant_operator.alive()
    log = tenant_operator.log_path.read_text(errors="replace")
    assert "Traceback" not in log and " ERROR " not in log, "the operator logged an error"

    during = sorted(witness.seconds[1:])
    print(
        f"\nwitness: usual {usual:.2f} s; {len(during)} preemptions while hostile: median "
        f"{during[len(during) // 2]:.2f} s, max {during[-1]:.2f} s (limit {WITNESS_LIMIT:.0f} s)"
    )
    assert not report, "\n".join(report)
    assert token_trap.connections == 0, "a key file's token_uri was called"
    assert max(witness.seconds) <= WITNESS_LIMIT, witness.seconds
    assert len(REFUSED) + len(HOSTILE) + len(SLOW_ENDPOINTS) >= 45
    # Nothing looped: the runs that fail kept their attempts few.
    for name in ("template-notice-annotation-failing-trainer", "init-container-exits-3"):
        assert t.runs.status(name)["attempt"] == 2
