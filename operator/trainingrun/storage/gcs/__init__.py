"""The Google Cloud Storage store (google-cloud-storage)."""
