"""Lifecycle tools that read through the repository: integrity checks (gc and replicate follow)."""

from ingest.lifecycle._check import Problem, check, check_ref

__all__ = ["Problem", "check", "check_ref"]
