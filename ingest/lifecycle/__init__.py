"""Lifecycle tools that read through the repository: garbage collection, integrity checks, replication, relocation."""

from ingest.lifecycle._check import Problem, check, check_ref
from ingest.lifecycle._gc import GcReport, gc, parse_duration
from ingest.lifecycle._history import ArraysFootprint, HistorySweep, arrays_footprint
from ingest.lifecycle._live import LiveFiles, history_pointers, live_table_files
from ingest.lifecycle._relocate import RelocateReport, relocate
from ingest.lifecycle._replica_refs import ReplicateReport
from ingest.lifecycle._replicate import replicate

__all__ = [
    "ArraysFootprint",
    "GcReport",
    "HistorySweep",
    "LiveFiles",
    "Problem",
    "RelocateReport",
    "ReplicateReport",
    "arrays_footprint",
    "check",
    "check_ref",
    "gc",
    "history_pointers",
    "live_table_files",
    "parse_duration",
    "relocate",
    "replicate",
]
