"""The Azure Blob Storage store (azure-storage-blob)."""
