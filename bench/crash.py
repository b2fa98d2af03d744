"""Crash soak: SIGKILL a `relay serve` at random moments while it ingests, restart it, check it, many times.

    .venv/bin/python bench/crash.py --kills 200              # ~10 min on a quiet machine
    .venv/bin/python bench/crash.py --kills 50 --seed 7 --connections 8 --keep /tmp/crash
    .venv/bin/python bench/crash.py --kills 100 --workers 2  # a random worker, then the writer, after each start

The harness and its checks are tests/reliability/harness.py (the CI form is
tests/reliability/test_crash.py): after every restart, every event answered
`OK true` is served unless an event the relay stored superseded or deleted
it (checked against an independent NIP-01/09 model), `relay verify` (projected
tables and negentropy indexes) exits 0 and `PRAGMA integrity_check` is ok.
With `--workers N` the relay runs `serve --workers N`, and after each start
a random worker is killed (and checked after its restart), then the writer.
Prints kills survived, events sent / acknowledged / served, refusals by
prefix and the first failure, if any (exit 1). Loopback only.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: relay/ and tests/
from tests.reliability.harness import CrashReport, run  # noqa: E402


def show_every_tenth(report: CrashReport) -> None:
    if report.checks % 10 == 0:
        print(report.summary(), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=200, help="SIGKILLs to survive (default 200)")
    parser.add_argument("--seed", type=int, help="workload and timing seed (default: random, printed)")
    parser.add_argument("--connections", type=int, default=4, help="publishing connections (default 4)")
    parser.add_argument("--answers-per-kill", type=int, default=300,
                        help="a publishing cycle is killed after 1..N OK replies (default 300)")
    parser.add_argument("--workers", type=int, default=0,
                        help="serve --workers N: kill a random worker, then the writer, after each start (default 0)")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it (database, config, logs)")
    args = parser.parse_args()
    seed = random.randrange(1 << 30) if args.seed is None else args.seed
    print(f"crash soak: {args.kills} kills, seed {seed}, {args.connections} connections, {args.workers} workers",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="crash-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        report = asyncio.run(run(workdir, args.kills, seed, args.connections, args.answers_per_kill,
                                 progress=show_every_tenth, workers=args.workers))
    print(report.summary())
    for failure in report.failures:
        print(f"FAILURE after {report.kills} kills: {failure}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
