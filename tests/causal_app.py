"""A causal projector's `apply` function for tests that declare it in TOML (`apply = "tests.causal_app:apply"`).

Operations carry JSON content {"key", "value"}: each sets one key of the (log, author)'s document, and every
applied operation is appended to its history.
"""

from __future__ import annotations

import json
import sqlite3

from relay.store.projectors import Operation

TOML = """
[[causal_projectors]]
name = "docs"
kind = 4242
apply = "tests.causal_app:apply"
revision = {revision}

[[causal_projectors.tables]]
name = "doc_values"
columns = [{{ name = "key", type = "TEXT" }}, {{ name = "value", type = "TEXT" }}]
primary_key = ["_log", "_author", "key"]

[[causal_projectors.tables]]
name = "doc_history"
columns = [{{ name = "seq", type = "INTEGER" }}, {{ name = "event_id", type = "TEXT" }}]
"""
"""The configuration declaring it (format with `revision`)."""


def apply(conn: sqlite3.Connection, op: Operation) -> None:
    """Set the operation's key in doc_values and append it to doc_history."""
    body = json.loads(op.event.content)
    conn.execute("INSERT INTO doc_values (_log, _author, key, value) VALUES (?, ?, ?, ?)"
                 " ON CONFLICT (_log, _author, key) DO UPDATE SET value = excluded.value",
                 (op.log_id, op.author, body["key"], body["value"]))
    conn.execute("INSERT INTO doc_history (_log, _author, seq, event_id) VALUES (?, ?, ?, ?)",
                 (op.log_id, op.author, op.seq, op.event.id))
