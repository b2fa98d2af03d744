"""A causal projector as the target of a `build.Build`: the same steps, checkpoint and states as a plain one.

How this works.  `prepare` recreates the projector's tables and forgets its
`causal_ops` rows and refusals.  Each step records the operations of its
events (`CausalEngine.add`, in `events.seq` order) and settles, in the same
transaction, every log they touched (`CausalEngine.settle`), exactly as a
live write transaction does.  `settle` makes a log's tables and states the
fold of `apply` over the chain computed from every operation recorded for
it so far, so the last settle of a log, after its last operation was
recorded (by a step or by a live write), leaves what a from-scratch rebuild
leaves: live writes are applied normally while the build runs.  A step
leaves no operation unsettled, so a crash needs no more than the checkpoint.
"""

from __future__ import annotations

import sqlite3

from relay.store.projectors.build import chunks_by_seq
from relay.store.projectors.causal import CausalEngine, create_tables


class CausalTarget:
    """The tables and `causal_ops` rows of one causal projector, built operation by operation (module docstring)."""

    def __init__(self, engine: CausalEngine) -> None:
        self.engine = engine
        self.name, self.kind = engine.spec.name, engine.spec.kind

    def prepare(self, cur: sqlite3.Cursor, fill: bool) -> str:
        """Recreate the tables and forget the operations and refusals (a causal build is never a fill)."""
        create_tables(cur, self.engine.spec, drop=True)
        cur.execute("DELETE FROM causal_ops WHERE projector = ?", (self.name,))
        cur.execute("DELETE FROM projector_refusals WHERE projector = ?", (self.name,))
        return "recreated"

    def project(self, cur: sqlite3.Cursor, seqs: list[int], refusals: list, fill: bool) -> None:
        """Record the operations of the events of `seqs`, then settle the logs they touched."""
        conn = cur.connection
        touched: set[tuple[str, str]] = set()
        for events in chunks_by_seq(cur, seqs):
            touched |= self.engine.add(conn, events, refusals)
        for log_id, author in sorted(touched):
            self.engine.settle(conn, log_id, author, refusals)
