"""The main job on the local environment: a TrainingRun applied with kubectl, kept alive by the
operator through a real preemption (an eviction through the Eviction API) and a failure.

    make demo        (python -m tests.demo)

Brings up the environment (control plane, kwok node, SeaweedFS), installs the CRD, starts the
operator, applies the example run pointed at the local bucket, commits a checkpoint to the bucket
as the sync sidecar does, preempts the attempt, fails the next one, and shows
``kubectl get trainingruns -o wide`` after each step. Pods run on a kwok node, so their
containers are simulated; the chain of real trainer processes comes with the local pod runner.
The environment stays up afterwards.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import yaml
from kubernetes import client, config

from tests import localenv
from tests.integration.support import Runs, commit_checkpoint, credentials_secret, wait_for

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "demo"
RUN = "finetune-demo"


def show(env: localenv.LocalEnv, title: str) -> None:
    print(f"\n== {title}\n$ kubectl get trainingruns -n {NAMESPACE} -o wide", flush=True)
    print(env.kubectl("get", "trainingruns", "-n", NAMESPACE, "-o", "wide"), flush=True)


def main() -> int:
    env = localenv.up()
    env.kubectl("apply", "-f", str(REPO / "crds" / "trainingrun.yaml"))
    env.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "crd/trainingruns.trainingrun.dev"
    )
    localenv.start_operator(env)
    api_client = config.new_client_from_config(config_file=env.kubeconfig)
    core = client.CoreV1Api(api_client)

    env.kubectl("create", "namespace", NAMESPACE, check=False)
    env.kubectl("delete", "trainingrun", RUN, "-n", NAMESPACE, "--ignore-not-found", "--wait=true")
    env.kubectl(
        "apply",
        "-f",
        "-",
        stdin=yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": "demo-node-0",
                    "annotations": {localenv.KWOK_NODE_ANNOTATION: "fake"},
                    "labels": {"type": "kwok", "kubernetes.io/hostname": "demo-node-0"},
                },
            }
        ),
    )
    secret = credentials_secret(env, "s3-credentials")
    try:
        core.create_namespaced_secret(NAMESPACE, secret)
    except client.ApiException as e:
        if e.status != 409:
            raise
        core.replace_namespaced_secret("s3-credentials", NAMESPACE, secret)

    run = yaml.safe_load((REPO / "examples" / "trainingrun.yaml").read_text())
    prefix = f"demo-{int(time.time())}"
    run["spec"]["checkpoint"]["storage"] = {
        "uri": f"s3://{env.bucket}/{prefix}",
        "endpoint": env.s3_endpoint,
        "region": env.s3_region,
        "credentialsSecret": "s3-credentials",
    }
    run["spec"]["restartPolicy"]["backoff"] = {"initialSeconds": 2, "maxSeconds": 10, "factor": 2}
    run["spec"]["template"]["spec"]["containers"][0]["resources"] = {}
    print(
        f"$ kubectl apply -f examples/trainingrun.yaml  (storage: local SeaweedFS, s3://{env.bucket}/{prefix})"
    )
    print(env.kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(run)).strip())

    runs = Runs(api_client, NAMESPACE)
    runs.wait_status(RUN, lambda s: s.get("activePod") == f"{RUN}-1", 60, "attempt 1")
    runs.wait_pod_running(f"{RUN}-1")
    show(env, "attempt 1 runs")

    s3 = localenv.s3_client(env)
    commit_checkpoint(
        s3, env.bucket, f"{prefix}/{NAMESPACE}/{RUN}", 100, {"model.safetensors": b"\0" * 4096}
    )
    print("\n== the sync sidecar committed checkpoint-100 to the bucket manifest")

    print(f"\n== preemption: evicting pod {RUN}-1 through the Eviction API")
    core.create_namespaced_pod_eviction(
        f"{RUN}-1",
        NAMESPACE,
        client.V1Eviction(metadata=client.V1ObjectMeta(name=f"{RUN}-1", namespace=NAMESPACE)),
    )
    runs.wait_status(RUN, lambda s: s.get("activePod") == f"{RUN}-2", 60, "attempt 2")
    pod = runs.wait_pod_running(f"{RUN}-2")
    show(env, "attempt 2 resumed from the committed checkpoint; counted as a preemption")
    print(
        "trainer env:",
        {k: v for k, v in runs.env_of(pod).items() if k.startswith("TRAININGRUN_RESUME")},
    )

    print(f"\n== failure: the trainer of {RUN}-2 exits 1")
    runs.end_pod(f"{RUN}-2", 1)
    runs.wait_status(RUN, lambda s: s.get("activePod") == f"{RUN}-3", 60, "attempt 3")
    runs.wait_pod_running(f"{RUN}-3")
    show(env, "attempt 3 after a backoff; counted as a restart")

    print(f"\n== the trainer of {RUN}-3 finishes")
    runs.end_pod(f"{RUN}-3", 0)
    wait_for(lambda: runs.status(RUN).get("phase") == "Succeeded", 60, "Succeeded")
    show(env, "succeeded")
    print(f"$ kubectl get events -n {NAMESPACE} --field-selector involvedObject.name={RUN}")
    print(
        env.kubectl(
            "get",
            "events",
            "-n",
            NAMESPACE,
            "--field-selector",
            f"involvedObject.name={RUN}",
            "--sort-by=.lastTimestamp",
        )
    )
    print("The environment stays up. Look around:")
    print('  eval "$(.venv/bin/python -m tests.localenv env)"; kubectl get trainingruns -A')
    print("Tear it down: make cluster-down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
