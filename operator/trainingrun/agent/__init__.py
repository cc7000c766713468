"""The agent: the restore init container and the checkpoint sync sidecar in every training pod."""
