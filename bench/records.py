"""Records, the writing side (issue 19): put_record throughput through the Python API, one writer.

    .venv/bin/python bench/records.py [--n 20000] [--concurrency 1 64] [--db-dir DIR]

For each `--concurrency` C, a fresh database (in `--db-dir`, default a temporary directory) is opened as
`relay record` opens it (`relay.commands.records.open_records`: the store with the hooks `relay serve` has, the
ingest path, the node key), and `--n` rows of `articles` (each its own coordinate: d = "a<i>", a title, a
summary and published_at) are put with C calls in flight at once.  Each put encodes the row, reserves its
created_at on the writer (one short transaction), signs it, and takes it through ingest (signature check,
writer batch, projection).  Every outcome is checked (accepted), and the row count of `articles` at the end.
Reported per C: records/s (wall), and the process CPU seconds per 1,000 records; printed and written to
bench/results/records-<stamp>.json.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from relay.commands.records import open_records  # noqa: E402
from relay.config import load_config  # noqa: E402
from relay.logging import configure_logging  # noqa: E402

RESULTS = BENCH / "results"


async def _run(db: Path, n: int, concurrency: int) -> dict:
    config = load_config(None, {}, {"store": {"path": str(db)}})
    async with open_records(config) as records:
        records.node_key  # created before the clock starts
        started, cpu = time.perf_counter(), time.process_time()
        next_row = iter(range(n))

        async def writer() -> None:
            for i in next_row:
                row = {"d": f"a{i}", "title": f"title {i}", "summary": "s" * 40, "published_at": i}
                written = await records.put_record("articles", row)
                assert written.outcome.accepted, written.outcome

        await asyncio.gather(*(writer() for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        page = await records.query_records("articles", limit=n + 1)
        assert len(page.rows) == n, len(page.rows)
    return {"concurrency": concurrency, "records": n, "seconds": round(wall, 3),
            "records_per_second": round(n / wall), "cpu_seconds_per_1000": round(cpu / n * 1000, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="rows put per run")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64], help="puts in flight at once")
    parser.add_argument("--db-dir", type=Path, help="where the databases go (default: a temporary directory)")
    args = parser.parse_args()
    configure_logging("warning", "console")
    results = []
    with tempfile.TemporaryDirectory(dir=args.db_dir) as tmp:
        for c in args.concurrency:
            result = asyncio.run(_run(Path(tmp) / f"records-{c}" / "relay.db", args.n, c))
            print(f"concurrency {c:>4}: {result['records_per_second']:>7} records/s, "
                  f"{result['cpu_seconds_per_1000']} CPU s per 1,000 ({result['records']} in {result['seconds']} s)")
            results.append(result)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"records-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"cpus": os.cpu_count(), "runs": results}, indent=2) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
