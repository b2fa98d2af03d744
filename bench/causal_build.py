"""Seconds to build a causal projector from stored operations (relay/store/projectors/causal_build.py).

    .venv/bin/python bench/causal_build.py [--logs 1000] [--length 500] [--batch 2000] [--db PATH]

The store: `--logs` chains of `--length` operations of kind 4242 (one author each; the tests' `docs` projector,
tests/causal_app.py), written seq by seq across the logs through `Store.submit` (ids real, signatures not checked
below ingest) into `--db` (kept and reused when it holds that many operations, else a temporary file).  Then
`relay projectors rebuild docs`' function (`engine.force_rebuild`) builds it in steps of `--batch` events, as
`relay serve` does in the background: each step records its operations and settles every log it touched, so a
log spread over many steps is settled once per step (the cost to watch as `--length` grows past `--batch`).

Results: the build's seconds and operations per second; printed and written to
bench/results/causal_build-<stamp>.json.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import orjson

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from common import write_results  # noqa: E402

from relay.config import load_config  # noqa: E402
from relay.logging import configure_logging  # noqa: E402
from relay.node import open_store  # noqa: E402
from relay.protocol.event import EventLimits, parse_event  # noqa: E402
from relay.store.projectors import force_rebuild  # noqa: E402
from tests.causal_app import TOML  # noqa: E402

KIND = 4242


def operation(log: int, seq: int, prev: str | None) -> dict:
    """Operation `seq` of chain `log` (its own author), a back-link to `prev`; a signature of zeros."""
    tags = [["log", "doc"], ["seq", str(seq)]] + ([["prev", prev]] if prev else [])
    body = [0, f"{log + 1:064x}", 1_700_000_000 + seq, KIND, tags, json.dumps({"key": f"k{seq % 7}", "value": seq})]
    return dict(zip(("id", "pubkey", "created_at", "kind", "tags", "content"),
                    [hashlib.sha256(orjson.dumps(body)).hexdigest(), *body[1:]]), sig="00" * 64)


async def fill(db: Path, logs: int, length: int) -> None:
    config = dataclasses.replace(load_config(None, {}, {"store": {"path": str(db)}}), projectors=())
    store = await open_store(config, 1)
    limits, now, prev = EventLimits(), time.time(), [None] * logs
    try:
        for seq in range(length):
            ops = [operation(n, seq, prev[n]) for n in range(logs)]
            prev = [op["id"] for op in ops]
            outcomes = await asyncio.gather(*(store.submit(parse_event(op, limits, now)) for op in ops))
            assert all(ok for ok, _ in outcomes), outcomes[:3]
    finally:
        await store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logs", type=int, default=1000, help="chains (authors)")
    parser.add_argument("--length", type=int, default=500, help="operations per chain")
    parser.add_argument("--batch", type=int, default=2000, help="[store] projector_build_batch")
    parser.add_argument("--db", type=Path, help="database to fill or reuse (default: a temporary one)")
    args = parser.parse_args()
    configure_logging("warning", "console")
    total = args.logs * args.length
    with tempfile.TemporaryDirectory() as tmp_name:
        db = args.db or Path(tmp_name) / "ops.db"
        if not db.exists() or sqlite3.connect(db).execute(
                "SELECT count(*) FROM events WHERE kind = ?", (KIND,)).fetchone()[0] != total:
            db.unlink(missing_ok=True)
            asyncio.run(fill(db, args.logs, args.length))
        config_file = Path(tmp_name) / "relay.toml"
        config_file.write_text(TOML.format(revision=1), encoding="utf-8")
        specs = [s for s in load_config(config_file).projectors if s.name == "docs"]
        conn = sqlite3.connect(db, isolation_level=None)
        try:
            started = time.perf_counter()
            read = force_rebuild(conn, specs, "docs", args.batch, 10_000)
            seconds = time.perf_counter() - started
        finally:
            conn.close()
    assert read == total, (read, total)
    report = {"logs": args.logs, "length": args.length, "batch": args.batch, "operations": total,
              "seconds": round(seconds, 3), "operations_per_second": round(total / seconds)}
    print(f"{total} operations ({args.logs} logs of {args.length}), steps of {args.batch}: "
          f"{seconds:.2f} s, {total / seconds:,.0f} operations/s")
    write_results("causal_build", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
