"""``python -m ingest.cli``: the floe command."""

from ingest.cli import app

app()
