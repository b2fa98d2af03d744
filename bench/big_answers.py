"""Memory under many concurrent REQs for large stored answers: the relay's RSS before, at its peak, and
3 s after the clients have gone.

    .venv/bin/python bench/big_answers.py                     # 100 and 300 clients, ~1 min
    .venv/bin/python bench/big_answers.py --clients 50 --big 200   # smaller

One relay (ours): `relay import` of the real events in ../shared/data (all_real_valid_dedup.jsonl), plus
--big kind-1 events of --content-bytes each (signed here), then `relay serve` on default limits but for the
rate limits (the clients are one IP).  Each round, --clients connections at once send one
`REQ {"kinds": [k], "limit": 5000}` (k = 0, 1, 7 in turn: the kind-1 answers hold the big events), read
to EOSE or CLOSED, and close.  Printed per round: answers by ending and size, RSS before, its peak (sampled
every 50 ms) and 3 s after, and VmHWM (the process's peak so far, not the round's).  Configured bounds to compare with: `limits.max_stored_results_bytes`
(256 MiB), `limits.max_query_bytes` (16 MiB) per read connection (4), their page caches (16 MiB each).
"""
from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from wsraw import WSClient  # noqa: E402

sys.path.insert(0, str(common.REPO))
from tests.helpers import Keys  # noqa: E402

REAL = common.REPO.parent / "shared" / "data" / "all_real_valid_dedup.jsonl"


def rss_mb(pid: int, field: str = "VmRSS") -> int:
    """A memory field of the relay process (/proc/PID/status), in MB."""
    return common.rss_bytes(pid, tree=False, field=field) // 2**20


async def _answer(url: str, kind: int) -> tuple[str, int]:
    done: asyncio.Future = asyncio.get_running_loop().create_future()
    events = [0]

    def on_msg(m: bytes) -> None:
        if m.startswith(b'["EVENT"'):
            events[0] += 1
        elif (m.startswith(b'["EOSE"') or m.startswith(b'["CLOSED"')) and not done.done():
            done.set_result(orjson.loads(m)[0])

    ws = await WSClient.connect(url, on_msg)
    ws.send_many([orjson.dumps(["REQ", "s", {"kinds": [kind], "limit": 5000}])])
    ending = await asyncio.wait_for(done, 120)
    await ws.close(1.0)
    return ending, events[0]


async def _round(url: str, pid: int, clients: int) -> None:
    peak = [0]

    async def watch() -> None:
        while True:
            peak[0] = max(peak[0], rss_mb(pid))
            await asyncio.sleep(0.05)

    before, t0 = rss_mb(pid), time.perf_counter()
    watcher = asyncio.create_task(watch())
    answers = await asyncio.gather(*(_answer(url, (0, 1, 7)[i % 3]) for i in range(clients)))
    watcher.cancel()
    seconds = time.perf_counter() - t0
    await asyncio.sleep(3)
    print(f"{clients} clients in {seconds:.1f} s: answers {dict(Counter(answers))}; relay RSS MB: before {before},"
          f" peak {peak[0]} (sampled), 3 s after {rss_mb(pid)}; VmHWM so far {rss_mb(pid, 'VmHWM')}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 300], help="clients per round (default 100 300)")
    ap.add_argument("--big", type=int, default=500, help="large kind-1 events added (default 500)")
    ap.add_argument("--content-bytes", type=int, default=60_000, help="content of each large event (default 60,000)")
    args = ap.parse_args()
    srv = common.ours()
    keys, now = Keys(7), int(time.time())
    big = srv.cwd / "big.jsonl"
    big.write_bytes(b"".join(orjson.dumps(keys.sign(content="x" * args.content_bytes, created_at=now - 1000 + i))
                             + b"\n" for i in range(args.big)))
    for source in (REAL, big):
        subprocess.run([str(common.REPO / ".venv" / "bin" / "relay"), "import", "--create", str(source), "--db",
                               str(srv.cwd / "relay.db")], cwd=common.REPO, capture_output=True, check=True)
    srv.start()
    try:
        common.install_uvloop()
        for clients in args.clients:
            asyncio.run(_round(srv.url, srv.pid, clients))
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
