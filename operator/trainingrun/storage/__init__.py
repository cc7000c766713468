"""Object stores: one ``Store`` interface and its S3, Cloud Storage and Azure Blob
implementations."""
