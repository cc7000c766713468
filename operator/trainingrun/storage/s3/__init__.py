"""The S3 store (boto3): AWS S3 and S3-compatible endpoints."""
