"""Pure decision code: plain data in, plain data out.

Building the pod of an attempt, classifying how an attempt ended, choosing the next step and
choosing the checkpoint live here. Nothing in this package imports kubernetes, boto3 or kopf;
import-linter holds that line (see pyproject.toml).
"""
