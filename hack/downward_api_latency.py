"""How long a real kubelet takes to rewrite a downward-API volume file after a pod annotation
changes (issue 46): the operator's preemption notice reaches the sync sidecar this way.

    KUBECONFIG=... .venv/bin/python hack/downward_api_latency.py --node trainingrun-real-0 \\
        --kubelet-root /tmp/trainingrun-node/trainingrun-real-0/kubelet --image IMAGE [--samples 5]

Runs one pod on the node (the image's ``sleep``, a downward-API volume of the pod's annotations),
then, per sample, patches an annotation and polls the projected file on the node's disk every
2 ms: the figure is from just before the PATCH is sent to the new value being readable. Prints
each sample and the median and max, deletes the pod.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from kubernetes import client, config

NAMESPACE = "default"
POD = "downward-api-latency"
KEY = "trainingrun.dev/probe"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--node", required=True)
    parser.add_argument("--kubelet-root", required=True, type=Path)
    parser.add_argument("--image", required=True)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=180.0)
    args = parser.parse_args()
    config.load_kube_config()
    api = client.CoreV1Api()
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "annotations": {KEY: "start"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": args.node},
            # The local real node's taint (tests/localnode.py): only pods that ask land there.
            "tolerations": [{"key": "trainingrun.dev/real-node", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "probe",
                    "image": args.image,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "volumeMounts": [{"name": "podinfo", "mountPath": "/etc/podinfo"}],
                }
            ],
            "volumes": [
                {
                    "name": "podinfo",
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "annotations",
                                "fieldRef": {"fieldPath": "metadata.annotations"},
                            }
                        ]
                    },
                }
            ],
        },
    }
    api.create_namespaced_pod(NAMESPACE, pod)
    try:
        deadline = time.monotonic() + args.timeout
        while True:
            live = api.read_namespaced_pod(POD, NAMESPACE)
            if live.status.phase == "Running":
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"pod not Running after {args.timeout}s: {live.status}")
            time.sleep(0.5)
        path = (
            args.kubelet_root
            / "pods"
            / live.metadata.uid
            / "volumes/kubernetes.io~downward-api/podinfo/annotations"
        )
        samples = []
        for i in range(args.samples):
            value = f"sample-{i}-{time.time_ns()}"
            start = time.monotonic()
            api.patch_namespaced_pod(POD, NAMESPACE, {"metadata": {"annotations": {KEY: value}}})
            while value not in path.read_text():
                if time.monotonic() - start > args.timeout:
                    raise SystemExit(f"sample {i}: {value} not projected after {args.timeout}s")
                time.sleep(0.002)
            took = time.monotonic() - start
            samples.append(took)
            print(f"sample {i}: {took:.3f} s")
            time.sleep(2)  # apart, so one sample's sync never carries the next one's change
        print(f"median {statistics.median(samples):.3f} s, max {max(samples):.3f} s")
    finally:
        api.delete_namespaced_pod(POD, NAMESPACE, grace_period_seconds=0)


if __name__ == "__main__":
    main()
