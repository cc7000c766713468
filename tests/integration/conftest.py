"""Fixtures for operator integration tests live in tests/conftest.py (the CRD, the one session
operator, per-test namespaces with a credentials Secret), shared with the e2e tier."""
