"""Checkpoints: the local folder and its layouts, the bucket manifest, and the fenced commit
protocol."""
