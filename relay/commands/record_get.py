"""`relay record get TABLE --pk JSON`: one row of a declared projector, read on a read-only connection.

Like `relay query`, it opens the database file read-only (no hooks, no setup, no write lock), so it runs beside
a relay that serves the database, even while it builds a projector, and never creates a database.
"""

from __future__ import annotations

import sqlite3
import sys
from contextlib import closing

import orjson

from relay.commands import open_readonly
from relay.config import Config
from relay.store.db import read_transaction
from relay.store.projectors.spec import ProjectorSpec
from relay.store.records import RecordQueryError, TableBuilding, views, when_built

NOT_AVAILABLE = 3


def run_get(config: Config, table: str, pk: object) -> int:
    """Print the row of `table` whose key is `pk` (an object of key columns) as one JSON object.

    Exit 0; 2 no relay database there (missing, or another file), an unknown table or a bad key (named); 3 no
    such row, or the table is being built.
    """
    view = views(config.projectors).get(table)
    if view is None:
        print(f"relay record: table: {table!r} is not a readable projected table (tables: "
              + ", ".join(sorted(views(config.projectors))) + ")", file=sys.stderr)
        return 2
    if not isinstance(pk, dict):
        print("relay record: pk: expected a JSON object of the key's columns", file=sys.stderr)
        return 2
    conn = open_readonly(config.store.path, "record get")
    if conn is None:
        return 2
    projector = next(s.name for s in config.projectors if isinstance(s, ProjectorSpec) and s.table == table)
    with closing(conn):
        try:
            with read_transaction(conn):
                row = when_built(conn, projector, table, view.get, pk)
        except RecordQueryError as exc:
            print(f"relay record: {exc}", file=sys.stderr)
            return 2
        except TableBuilding as exc:
            print(f"relay record: building: {exc}; try again when it is done", file=sys.stderr)
            return NOT_AVAILABLE
        except sqlite3.Error as exc:  # e.g. a table not created yet: no relay has opened it with this projector
            print(f"relay record: {config.store.path}: {exc}", file=sys.stderr)
            return 1
    if row is None:
        print(f"relay record: no row of {table} with this key", file=sys.stderr)
        return NOT_AVAILABLE
    sys.stdout.write(orjson.dumps(row).decode() + "\n")
    return 0
