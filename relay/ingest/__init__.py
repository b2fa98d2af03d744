"""The one path of every event into the relay, whatever its source (docs/architecture.md, "The path of one EVENT").

`Ingest` (pipeline.py) takes each event through parsing, the event rules,
the source's rules (source.py) and the one signature pool (verifier.py) to
the writer queue, and answers a typed `Outcome` (outcome.py).
"""

from relay.ingest.outcome import Outcome
from relay.ingest.pipeline import Ingest
from relay.ingest.source import IMPORT, RECORD, Source

__all__ = ["IMPORT", "Ingest", "Outcome", "RECORD", "Source"]
