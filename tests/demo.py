"""The main job on the local environment: a real fine-tuning run, applied with kubectl, kept alive
by the operator through a preemption, and finished.

    make demo                  (python -m tests.demo --node podrunner)
    make demo NODE=real        (python -m tests.demo --node real)

Brings up the environment (control plane, SeaweedFS), installs the CRD, starts the operator, and
applies ``examples/trainingrun-finetune.yaml`` pointed at the local bucket, on one of two nodes:

- ``real``: the environment's real node (tests/localnode.py: a kubelet, containerd
  and runc). The pod runs the images ``make images`` built: the example trainer image
  (``examples/finetune.py``, a tiny GPT-2 trained with the HuggingFace Trainer on CPU) and the
  agent image for the restore init container and the sync sidecar (a native sidecar, ordered and
  stopped by the kubelet). Its S3 endpoint is the node's bridge gateway.
- ``podrunner`` (the default): a local pod runner node (tests/podrunner), which runs each
  container's command as a local process from this clone and ignores the images: nothing to
  build. The real node's first run builds and imports 6 GB of images (about 25 minutes more on
  2 cores; docs/dev/real-node-notes.md), over a new user's 20-minute budget.

Once a checkpoint is committed to the bucket manifest it evicts the pod through the Eviction API,
as a spot reclaim does: the node's kubelet delivers SIGTERM, the trainer saves at its next step
end and exits 143, the sidecar commits that save, and ``kubectl get trainingruns`` shows the run
resume from it and succeed. Along the way it shows the run's Progress and ETA (the operator
reads progress every 5 s here, every minute by default), says how far off the ETA shown after
the resume was from the time the trainer then took, and prints the goodput ledger and the
attempts' timeline (``trainingrun status``). The environment stays up afterwards;
``make cluster-down`` removes it (the real node with it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from tests import localenv, localnode
from tests.integration.support import Runs, credentials_secret, wait_for
from tests.podrunner import RunnerHandle, placement, running_runner, start_runner
from trainingrun.contract import parse_time

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "trainingrun-finetune.yaml"
NAMESPACE = "demo"
NODE = "demo-runner"  # the pod runner node of --node podrunner
# The agent image the operator injects on the real node (make images), never pulled.
AGENT_IMAGE = "ghcr.io/trainingrun/agent:dev"
MAX_STEPS, SAVE_STEPS, STEP_DELAY = 150, 10, 0.25
# The real node's trainer takes 0.03 s a step (the pod runner's, 0.1-0.3 s, on a loaded machine):
# the example's own 0.5 s leaves room to evict the pod after checkpoint 20 and before the end.
REAL_STEP_DELAY = 0.5
# The operator reads progress, and the sidecars publish it, every 5 s instead of every minute:
# the demo's attempts last less than a minute.
OPERATOR_SETTINGS = {"TRAININGRUN_PROGRESS_REFRESH_SECONDS": "5"}
# The preemption comes once this checkpoint is committed: the resume has something to start from.
PREEMPT_AFTER_STEP = 20
# The manifest as applied, kept in the environment's folder ($TRAININGRUN_ENV_DIR) to start more
# runs from (docs/quickstart.md).
DEMO_MANIFEST = "demo-trainingrun.yaml"


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def kubectl_shown(env: localenv.LocalEnv, *args: str) -> None:
    print(f"$ kubectl {' '.join(args)}", flush=True)
    print(env.kubectl(*args).rstrip(), flush=True)


def show_runs(env: localenv.LocalEnv) -> None:
    kubectl_shown(env, "get", "trainingruns", "-n", NAMESPACE, "-o", "wide")


def committed_steps(s3: Any, bucket: str, run_key: str) -> list[int]:
    try:
        body = s3.get_object(Bucket=bucket, Key=f"{run_key}/manifest.json")["Body"].read()
    except s3.exceptions.NoSuchKey:
        return []
    return sorted(e["step"] for e in json.loads(body)["entries"])


def demo_run(env: localenv.LocalEnv, prefix: str, node: str) -> dict[str, Any]:
    """The example manifest, pointed at the local bucket and ``node``: on the real node with its
    image as it is (never pulled) and S3 at the node's gateway; on the pod runner, which ignores
    images and runs each container's command as a local process, from this clone."""
    run: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    run["metadata"]["name"] = "finetune-demo"
    real = node == "real"
    run["spec"]["checkpoint"]["storage"] = {
        "uri": f"s3://{env.bucket}/{prefix}",
        "endpoint": env.node_s3_endpoint if real else env.s3_endpoint,
        "region": env.s3_region,
        "credentialsSecret": "s3-credentials",
    }
    pod_spec = run["spec"]["template"]["spec"]
    pod_spec.update(localnode.placement() if real else placement(NODE))
    trainer = pod_spec["containers"][0]
    trainer["args"] = [
        f"--max-steps={MAX_STEPS}",
        f"--save-steps={SAVE_STEPS}",
        f"--step-delay={REAL_STEP_DELAY if real else STEP_DELAY}",
    ]
    trainer["env"] = []
    if real:
        trainer["imagePullPolicy"] = "Never"  # the example's user as it is: its image's, root
        trainer["env"] = [{"name": "HOME", "value": "/tmp"}]  # caches of torch and transformers
    else:
        trainer["workingDir"] = str(REPO)
        trainer["resources"] = {}
    return run


def ensure_runner(env: localenv.LocalEnv) -> RunnerHandle | None:
    """The demo's pod runner node: reused when one runs already, else started."""
    if running_runner(env, NODE):
        print(f"pod runner node {NODE} already runs", flush=True)
        return None
    handle = start_runner(env, node=NODE)
    print(f"pod runner node {NODE} started (log {handle.log_path})", flush=True)
    return handle


def user_command(env: localenv.LocalEnv, *args: str) -> None:
    """``trainingrun ...`` (also ``kubectl trainingrun ...``), shown with its output."""
    print(f"$ trainingrun {' '.join(args)}", flush=True)
    out = subprocess.run(
        [str(Path(sys.executable).parent / "trainingrun"), *args],
        env={**os.environ, "KUBECONFIG": env.kubeconfig},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    print((out.stdout + out.stderr).rstrip(), flush=True)


def trainer_ending(core: client.CoreV1Api, pod: str, timeout_s: float = 120) -> str | None:
    """How the trainer container of ``pod`` ended (exit code and reason) as its kubelet reports
    it, polled until the pod is gone or ``timeout_s``; None when it was never seen ended."""
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        try:
            status = core.read_namespaced_pod(pod, NAMESPACE).status
        except client.ApiException as e:
            if e.status == 404:
                break
            raise
        for c in status.container_statuses or []:
            if c.name == "trainer" and c.state.terminated:
                t = c.state.terminated
                seen = f"exit code {t.exit_code} ({t.reason})"
        if seen and status.phase in ("Failed", "Succeeded"):
            break
        time.sleep(0.5)
    return seen


def _eta_of(attempt: int) -> Any:
    def has(status: dict[str, Any]) -> bool:
        progress = status.get("progress") or {}
        return progress.get("attempt") == attempt and progress.get("etaSeconds") is not None

    return has


def eta_check(progress: dict[str, Any], final: dict[str, Any]) -> str:
    """The ETA shown after the resume against the time the trainer then took to its last step
    (the last attempt's ``lastStepTime`` in the goodput ledger)."""
    seen = parse_time(progress["observedAt"])
    last = (final.get("attempts") or [{}])[-1].get("lastStepTime")
    end = parse_time(last)
    if seen is None or end is None:
        return "ETA after the resume: the last step's time is not in the ledger"
    took = (end - seen).total_seconds()
    error = abs(progress["etaSeconds"] - took) / took * 100 if took > 0 else float("inf")
    return (
        f"ETA after the resume: {progress['etaSeconds']} s at step {progress['step']} "
        f"(observed {progress['observedAt']}); the trainer took {took:.0f} s more to its last "
        f"step: {error:.0f}% off"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.demo", description=__doc__)
    parser.add_argument("--node", choices=["real", "podrunner"], default="podrunner")
    node = parser.parse_args(argv).node
    started = time.monotonic()
    if node == "real":
        os.environ[localnode.WANTED_ENV] = "1"
    env = localenv.up()
    env.kubectl("apply", "--server-side", "-f", str(REPO / "crds" / "trainingrun.yaml"))
    env.wait_established("trainingruns.trainingrun.dev")
    if node == "real":
        localenv.start_operator(
            env,
            {
                **OPERATOR_SETTINGS,
                "TRAININGRUN_AGENT_IMAGE": AGENT_IMAGE,
                "TRAININGRUN_AGENT_PULL_POLICY": "Never",
            },
        )
        where = f"real node {env.real_node}, images {AGENT_IMAGE} and the example's"
    else:
        localenv.start_operator(env, OPERATOR_SETTINGS)
        ensure_runner(env)
        where = f"pod runner node {NODE}"
    print(f"environment up after {time.monotonic() - started:.0f} s ({where})", flush=True)
    api_client = config.new_client_from_config(config_file=env.kubeconfig)
    core = client.CoreV1Api(api_client)

    env.kubectl("create", "namespace", NAMESPACE, check=False)
    run = demo_run(env, f"demo-{int(time.time())}", node)
    name = run["metadata"]["name"]
    env.kubectl("delete", "trainingrun", name, "-n", NAMESPACE, "--ignore-not-found", "--wait=true")
    secret = credentials_secret(env, "s3-credentials")
    try:
        core.create_namespaced_secret(NAMESPACE, secret)
    except client.ApiException as e:
        if e.status != 409:
            raise
        core.replace_namespaced_secret("s3-credentials", NAMESPACE, secret)

    say(
        f"a TrainingRun of {EXAMPLE.relative_to(REPO)}: {MAX_STEPS} steps, a checkpoint every "
        f"{SAVE_STEPS}"
    )
    print(
        f"$ kubectl apply -n {NAMESPACE} -f {EXAMPLE.relative_to(REPO)}   "
        f"(storage: local SeaweedFS {run['spec']['checkpoint']['storage']['uri']}; {where})",
        flush=True,
    )
    manifest = yaml.safe_dump(run, sort_keys=False)
    saved = localenv.state_dir(env.name) / DEMO_MANIFEST
    saved.write_text(manifest)
    print(env.kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=manifest).strip())
    print(f"(the manifest as applied: {saved})", flush=True)

    runs = Runs(api_client, NAMESPACE)
    runs.wait_status(name, lambda s: s.get("activePod") == f"{name}-1", 60, "attempt 1")
    runs.wait_pod_running(f"{name}-1", timeout_s=180)
    say(
        f"attempt 1 runs: pod {name}-1 with its restore, sync and trainer containers "
        f"({time.monotonic() - started:.0f} s in)"
    )
    show_runs(env)

    s3 = localenv.s3_client(env)
    storage_uri = run["spec"]["checkpoint"]["storage"]["uri"]
    run_key = f"{storage_uri.removeprefix(f's3://{env.bucket}/')}/{NAMESPACE}/{name}"
    wait_for(
        lambda: committed_steps(s3, env.bucket, run_key)[-1:] >= [PREEMPT_AFTER_STEP],
        300,
        f"checkpoint-{PREEMPT_AFTER_STEP} committed",
    )
    say(f"the sync sidecar committed checkpoints {committed_steps(s3, env.bucket, run_key)}")
    user_command(env, "checkpoints", "list", name, "-n", NAMESPACE)
    runs.wait_status(name, lambda s: (s.get("progress") or {}).get("step"), 60, "progress shown")
    show_runs(env)  # Progress, and the ETA once the attempt has a rate

    say(f"preemption: evicting pod {name}-1 through the Eviction API (as a spot reclaim does)")
    core.create_namespaced_pod_eviction(
        f"{name}-1",
        NAMESPACE,
        client.V1Eviction(metadata=client.V1ObjectMeta(name=f"{name}-1", namespace=NAMESPACE)),
    )
    ending = trainer_ending(core, f"{name}-1")
    print(f"the trainer of {name}-1 ended: {ending or 'not seen'}", flush=True)
    status = runs.wait_status(name, lambda s: s.get("activePod") == f"{name}-2", 180, "attempt 2")
    resume = status.get("resumeStep")
    say(
        f"attempt 2 resumes from step {resume}: counted as a preemption, not a restart; "
        f"committed checkpoints now {committed_steps(s3, env.bucket, run_key)}"
    )
    if resume is not None and resume % SAVE_STEPS:
        print(
            f"(step {resume} is not a multiple of {SAVE_STEPS}: on SIGTERM the trainer saved at "
            "the next step end and the sidecar committed it before the pod ended)",
            flush=True,
        )
    eta = runs.wait_status(name, _eta_of(2), 120, "attempt 2's ETA")["progress"]
    show_runs(env)

    final = runs.wait_status(
        name, lambda s: s.get("phase") in ("Succeeded", "Failed"), 600, "the run's end"
    )
    say(f"the run ended: {final.get('phase')}")
    show_runs(env)
    print(eta_check(eta, final), flush=True)
    say("the goodput ledger: where the run's time went, and the attempts")
    user_command(env, "status", name, "-n", NAMESPACE)
    # This run's Events only: an earlier demo's run of the same name has Events of its own.
    uid = runs.get(name)["metadata"]["uid"]
    kubectl_shown(
        env,
        "get",
        "events",
        "-n",
        NAMESPACE,
        "--field-selector",
        f"involvedObject.uid={uid}",
        "--sort-by=.lastTimestamp",
    )
    print(f"\ndemo took {time.monotonic() - started:.0f} s", flush=True)
    print("The environment stays up. Look around (docs/quickstart.md goes on from here):")
    print('  eval "$(.venv/bin/python -m tests.localenv env)"')
    print(f"  kubectl get trainingruns,pods -n {NAMESPACE}")
    print(f"  kubectl trainingrun checkpoints list {name} -n {NAMESPACE}")
    print("Tear it down: make cluster-down")
    return 0 if final.get("phase") == "Succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
