"""TrainingRun: a Kubernetes operator that keeps fine-tuning runs alive through spot preemption
and failures without losing work."""

__version__ = "0.1.0"
