"""`relay verify`'s part for the NIP-50 search index: its one line, with the first rows that disagree."""

from __future__ import annotations

import sqlite3

from relay.config import Config
from relay.store.projectors.verify import TableCheck
from relay.store.search import verify_search

SHOWN = 10  # events.seq values listed per kind of problem


def check_search(conn: sqlite3.Connection, config: Config) -> TableCheck:
    """Compare the search index with the events (`conn` opened read-only, `mode=ro`)."""
    return verify_search(conn, config.search.kinds if config.search.enabled else None)


def print_search_check(check: TableCheck, config: Config) -> bool:
    """Print `check`'s outcome; True when the index agrees with the events (or search is disabled and none is left)."""
    search = config.search
    if check.problem:
        print(f"search index: {check.problem}")
    elif not search.enabled:
        print("search index: disabled, none kept")
    elif check.ok:
        print(f"search index: ok, {check.rows} events indexed (kinds {', '.join(map(str, search.kinds))})")
    else:
        print(f"search index: {len(check.missing)} events missing, {len(check.orphan)} rows without an event,"
              f" {len(check.mismatched)} mismatched of {check.rows} rows")
        found = (("missing", check.missing), ("without an event", check.orphan), ("mismatched", check.mismatched))
        for what, seqs in found:
            if seqs:
                more = f" and {len(seqs) - SHOWN} more" if len(seqs) > SHOWN else ""
                print(f"  {what} (events.seq): {', '.join(map(str, seqs[:SHOWN]))}{more}")
    return check.ok
