"""Cost of one operation on the shared per-IP rate-limit table (relay/server/iptable.py), per process.

Runs `--processes` processes that each, as worker i, open the same table and
time `--ops` token takes (one group lock each: two fcntl calls and a few struct
reads) and `--ops` connect/disconnect pairs, spread over `--ips` client IPs.
Prints microseconds per operation per process, as JSON lines.

    python bench/ip_table.py --processes 2 --ops 200000 --ips 1000
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import tempfile
import time
from pathlib import Path

from relay.server.iptable import IpTable

BUCKETS = [(1e9, 10**9)] * 3  # never empty: every take costs the same


def _run(path: str, worker: int, ops: int, ips: int) -> None:
    table = IpTable.open(path, worker, BUCKETS)
    names = [f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(ips)]
    slots = [table.connect(ip) for ip in names]
    start = time.perf_counter()
    for i in range(ops):
        table.take(slots[i % ips], 0)
    take = (time.perf_counter() - start) / ops * 1e6
    start = time.perf_counter()
    for i in range(ops):
        table.disconnect(table.connect(names[i % ips]))
    connect = (time.perf_counter() - start) / ops * 1e6
    print(json.dumps({"worker": worker, "take_us": round(take, 2), "connect_disconnect_us": round(connect, 2)}),
          flush=True)
    table.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--ops", type=int, default=200_000)
    parser.add_argument("--ips", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        path = str(Path(directory) / "limits")
        IpTable.create(path, args.processes, BUCKETS).close()
        spawn = multiprocessing.get_context("spawn")
        processes = [spawn.Process(target=_run, args=(path, i, args.ops, args.ips)) for i in range(args.processes)]
        for p in processes:
            p.start()
        for p in processes:
            p.join()


if __name__ == "__main__":
    main()
