"""The operator: the kopf wiring, the reconcile pass and its rooms, and its client of the
Kubernetes API."""
