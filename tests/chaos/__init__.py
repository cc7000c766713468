"""The chaos test: a fleet of TrainingRuns (most on kwok nodes, some running the real example
trainer on pod runner nodes) under every fault at once, at random and overlapping, for a bounded
time, with the invariants checked as events arrive and again at the end.

Faults: operator SIGKILL (the leader; a standby takes over), the kube-apiserver restarted,
SeaweedFS stopped for 60 s, nodes deleted and turned NotReady, notice taints, evictions, trainer
SIGKILLs and the sync sidecar SIGKILLed mid-upload. Invariants: ``observe.INVARIANTS``.

    .venv/bin/python -m tests.chaos [--minutes 10] [--runs 200] [--real 6]
        [--write docs/benchmarks.md]

``make chaos`` runs it at full size; tests/e2e/test_chaos.py runs a 2-minute version in
``make test``.
"""
