"""The main job on the local environment: a real fine-tuning run, applied with kubectl, kept alive
by the operator through a preemption, and finished.

    make demo        (python -m tests.demo)

Brings up the environment (control plane, SeaweedFS), installs the CRD, starts the operator and a
local pod runner node (so the attempt's pod runs as real processes: the restore init container,
the sync sidecar and the trainer, ``examples/finetune.py``, a tiny GPT-2 trained with the
HuggingFace Trainer on CPU), and applies ``examples/trainingrun-finetune.yaml`` pointed at the
local bucket. Once a checkpoint is committed to the bucket manifest it evicts the pod through the
Eviction API, as a spot reclaim does, and shows ``kubectl get trainingruns`` as the run resumes
from that checkpoint and succeeds. The environment stays up afterwards; ``make cluster-down``
removes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from tests import localenv
from tests.integration.support import Runs, credentials_secret, wait_for
from tests.podrunner import RunnerHandle, placement, running_runner, start_runner

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "trainingrun-finetune.yaml"
NAMESPACE = "demo"
NODE = "demo-runner"
MAX_STEPS, SAVE_STEPS, STEP_DELAY = 60, 10, 0.25
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


def demo_run(env: localenv.LocalEnv, prefix: str) -> dict[str, Any]:
    """The example manifest, pointed at the local bucket and the pod runner node; the pod
    runner ignores images and runs each container's command as a local process."""
    run: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    run["metadata"]["name"] = "finetune-demo"
    run["spec"]["checkpoint"]["storage"] = {
        "uri": f"s3://{env.bucket}/{prefix}",
        "endpoint": env.s3_endpoint,
        "region": env.s3_region,
        "credentialsSecret": "s3-credentials",
    }
    pod_spec = run["spec"]["template"]["spec"]
    pod_spec.update(placement(NODE))
    trainer = pod_spec["containers"][0]
    trainer["workingDir"] = str(REPO)
    trainer["args"] = [
        f"--max-steps={MAX_STEPS}",
        f"--save-steps={SAVE_STEPS}",
        f"--step-delay={STEP_DELAY}",
    ]
    trainer["env"] = []
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


def main() -> int:
    started = time.monotonic()
    env = localenv.up()
    env.kubectl("apply", "--server-side", "-f", str(REPO / "crds" / "trainingrun.yaml"))
    env.wait_established("trainingruns.trainingrun.dev")
    localenv.start_operator(env)
    ensure_runner(env)
    api_client = config.new_client_from_config(config_file=env.kubeconfig)
    core = client.CoreV1Api(api_client)

    env.kubectl("create", "namespace", NAMESPACE, check=False)
    run = demo_run(env, f"demo-{int(time.time())}")
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
        f"(storage: local SeaweedFS {run['spec']['checkpoint']['storage']['uri']}, node {NODE})",
        flush=True,
    )
    manifest = yaml.safe_dump(run, sort_keys=False)
    saved = localenv.state_dir(env.name) / DEMO_MANIFEST
    saved.write_text(manifest)
    print(env.kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=manifest).strip())
    print(f"(the manifest as applied: {saved})", flush=True)

    runs = Runs(api_client, NAMESPACE)
    runs.wait_status(name, lambda s: s.get("activePod") == f"{name}-1", 60, "attempt 1")
    runs.wait_pod_running(f"{name}-1", timeout_s=120)
    say(f"attempt 1 runs: pod {name}-1 with its restore, sync and trainer containers")
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

    say(f"preemption: evicting pod {name}-1 through the Eviction API (as a spot reclaim does)")
    core.create_namespaced_pod_eviction(
        f"{name}-1",
        NAMESPACE,
        client.V1Eviction(metadata=client.V1ObjectMeta(name=f"{name}-1", namespace=NAMESPACE)),
    )
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
    show_runs(env)

    final = runs.wait_status(
        name, lambda s: s.get("phase") in ("Succeeded", "Failed"), 600, "the run's end"
    )
    say(f"the run ended: {final.get('phase')}")
    show_runs(env)
    user_command(env, "status", name, "-n", NAMESPACE)
    kubectl_shown(
        env,
        "get",
        "events",
        "-n",
        NAMESPACE,
        "--field-selector",
        f"involvedObject.name={name}",
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
