"""``python -m ingest.cli``: the floe command."""

from ingest.cli import run

# Guarded: a spawned helper process (the ingest's read-ahead) imports this module again as ``__mp_main__``.
if __name__ == "__main__":
    run()
