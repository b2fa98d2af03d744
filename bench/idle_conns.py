"""Memory of idle connections: the relay's RSS (whole process tree) idle, then with --conns idle
WebSockets open; the difference per 1,000 connections.

    .venv/bin/python bench/idle_conns.py --url ws://127.0.0.1:7777 --relay-pid PID --conns 2000
    .venv/bin/python bench/idle_conns.py --relay ours --conns 2000      # start ours (fresh store)

The connections complete the WebSocket handshake and then send nothing (no REQ, no EVENT), from this one
process (its open-files limit is raised to the hard limit).  RSS is VmRSS summed over the relay's PID and its
descendants (ours runs a writer and its workers), read --settle seconds after the last connection opened;
RssAnon (private heap, without mapped database pages) beside it.  A relay's own connection limits (per IP,
open files) show up as refused connections, reported.
"""
from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from wsraw import WSClient  # noqa: E402

OPEN_AT_ONCE = 100  # handshakes in flight at a time


async def _open(url: str, n: int) -> tuple[list[WSClient], int]:
    """Open n idle WebSockets to url; (the open ones, how many failed)."""
    opened: list[WSClient] = []
    failed = 0
    for i in range(0, n, OPEN_AT_ONCE):
        batch = await asyncio.gather(*(WSClient.connect(url) for _ in range(min(OPEN_AT_ONCE, n - i))),
                                     return_exceptions=True)
        opened += [c for c in batch if isinstance(c, WSClient)]
        failed += sum(1 for c in batch if not isinstance(c, WSClient))
    return opened, failed


async def _measure(url: str, relay_pid: int, conns: int, settle: float) -> dict:
    idle = common.rss_detail(relay_pid)
    opened, failed = await _open(url, conns)
    await asyncio.sleep(settle)
    still_open = sum(1 for c in opened if not c.is_closed)
    loaded = common.rss_detail(relay_pid)
    await asyncio.gather(*(c.close(2.0) for c in opened), return_exceptions=True)
    per_1000 = 1000 / still_open if still_open else float("nan")
    return {"conns": conns, "open": still_open, "failed": failed,
            "rss_idle_mb": idle["vmrss_mb"], "rssanon_idle_mb": idle["rssanon_mb"],
            "rss_open_mb": loaded["vmrss_mb"], "rssanon_open_mb": loaded["rssanon_mb"],
            "mb_per_1000": (loaded["vmrss_mb"] - idle["vmrss_mb"]) * per_1000,
            "anon_mb_per_1000": (loaded["rssanon_mb"] - idle["rssanon_mb"]) * per_1000}


def idle_memory(url: str, relay_pid: int, conns: int = 2000, settle: float = 3.0) -> dict:
    """RSS of relay_pid's process tree idle and with `conns` idle WebSockets to `url` held open.

    Returns MiB: rss_idle_mb / rssanon_idle_mb, rss_open_mb / rssanon_open_mb, mb_per_1000 and
    anon_mb_per_1000 (delta per 1,000 connections still open after `settle` seconds), and the counts
    conns, open, failed."""
    common.raise_fd_limit()
    common.install_uvloop()
    return asyncio.run(_measure(url, relay_pid, conns, settle))


def fmt(r: dict) -> str:
    return (f"idle VmRSS {r['rss_idle_mb']:.1f} MB (RssAnon {r['rssanon_idle_mb']:.1f}); with {r['open']:,} idle "
            f"connections {r['rss_open_mb']:.1f} MB (RssAnon {r['rssanon_open_mb']:.1f}): "
            f"{r['mb_per_1000']:.1f} MB per 1,000 connections (RssAnon {r['anon_mb_per_1000']:.1f})"
            + (f"; {r['failed']:,} refused" if r["failed"] else ""))


def main() -> None:
    ap, _ = common.target_parser(__doc__)
    ap.add_argument("--relay-pid", type=int, help="with --url: the PID whose process tree's RSS to read")
    ap.add_argument("--conns", type=int, default=2000)
    ap.add_argument("--settle", type=float, default=3.0, help="seconds between the last open and the reading")
    args = ap.parse_args()
    if args.url and not args.relay_pid:
        ap.error("--url needs --relay-pid")
    srv = common.FACTORIES[args.relay]().start() if args.relay else None
    try:
        time.sleep(1.0 if srv else 0.0)  # a relay just started settles its start-up allocations
        r = idle_memory(srv.url if srv else args.url, srv.pid if srv else args.relay_pid, args.conns, args.settle)
        print(fmt(r))
    finally:
        if srv:
            srv.stop()


if __name__ == "__main__":
    main()
