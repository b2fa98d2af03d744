"""Convergence soak: relays peered in a ring or a full mesh, a seeded workload published to random nodes while
nodes are SIGKILLed and partitioned; for each seed, the time until every node serves the same events, and the checks.

    .venv/bin/python bench/convergence.py --seeds 20                      # ring of 4, seeds 1..20: ~4 min if all pass
    .venv/bin/python bench/convergence.py --seeds 5 --first-seed 100 --nodes 5 --topology mesh --keep /tmp/conv

The harness is tests/sync/mesh.py and tests/sync/mesh_workload.py (the CI form is
tests/sync/test_convergence.py): after the last step every node must serve the same events
(within --timeout seconds), agreeing with a model of NIP-01/09/40 on the events accepted,
with byte-identical projected tables, and `relay verify` clean.  Prints one line per seed
(pass/fail, seconds to converge) and the failures; exit 1 if any seed failed. Loopback only.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: relay/ and tests/
from tests.sync.mesh import TOPOLOGIES  # noqa: E402
from tests.sync.mesh_workload import run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=20, help="how many seeds to run (default 20)")
    parser.add_argument("--first-seed", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--nodes", type=int, default=4, help="relay processes (default 4)")
    parser.add_argument("--topology", choices=sorted(TOPOLOGIES), default="ring", help="ring (default) or mesh")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for convergence (default 30)")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it (databases, configs, logs)")
    args = parser.parse_args()
    seconds, failed = [], []
    with tempfile.TemporaryDirectory(prefix="convergence-") as tmp:
        workdir = args.keep or Path(tmp)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            (workdir / f"seed{seed}").mkdir(parents=True, exist_ok=True)
            report = asyncio.run(run(workdir / f"seed{seed}", seed, args.nodes, args.topology, args.timeout))
            print(("PASS " if not report.failures else "FAIL ") + report.summary(), flush=True)
            for failure in report.failures:
                print(f"    {failure}", flush=True)
            if report.seconds is not None:
                seconds.append(report.seconds)
            if report.failures:
                failed.append(seed)
    spread = (f"; seconds to converge: median {statistics.median(seconds):.1f}, max {max(seconds):.1f}"
              if seconds else "")
    print(f"{args.seeds - len(failed)} of {args.seeds} seeds passed{spread}; failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
