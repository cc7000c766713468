"""TrainingRun: a Kubernetes operator that keeps fine-tuning runs alive through spot preemption
and failures without losing work."""

from importlib import metadata

# One source for the version: pyproject.toml's, as installed. The agent image's default tag
# (decide.pod.AgentSettings) follows it; tests/unit/test_version.py holds the chart's
# appVersion to it.
try:
    __version__ = metadata.version("trainingrun")
except metadata.PackageNotFoundError:  # the source tree on sys.path, not installed
    __version__ = "0+unknown"
