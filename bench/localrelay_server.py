"""Run rust-nostr's LocalRelay (nostr-sdk 0.45.x Python bindings) on 127.0.0.1:PORT until killed.

Run it with the bench/.venv-localrelay interpreter (see setup_refs.sh):

    bench/.venv-localrelay/bin/python bench/localrelay_server.py --port 7102

Default storage is the builder's in-memory database, which keeps at most 75,000 events
(oldest dropped).  --lmdb DIR uses NostrLmdb instead.  The builder's default rate limit
(20 REQs, 60 notes/minute per connection) would throttle any benchmark, so it is lifted.
Prints "READY ws://..." on stdout once listening.
"""
from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import nostr_sdk as ns


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--lmdb", default=None, help="directory for NostrLmdb (default: in-memory)")
    ap.add_argument("--max-connections", type=int, default=10_000)
    ap.add_argument("--max-filter-limit", type=int, default=5_000)
    ap.add_argument("--log", choices=["error", "warn", "info", "debug", "trace"], default=None,
                    help="enable the Rust logger at this level (stdout)")
    args = ap.parse_args()
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("refusing to bind anything but loopback")

    if args.log:
        ns.init_logger(getattr(ns.LogLevel, args.log.upper()))
    b = (
        ns.LocalRelayBuilder()
        .addr(args.host)
        .port(args.port)
        .max_connections(args.max_connections)
        .max_filter_limit(args.max_filter_limit)
        .rate_limit(ns.RateLimit(max_reqs=100_000, notes_per_minute=4_000_000_000))
    )
    if args.lmdb:
        db = await ns.NostrLmdb.open(args.lmdb)
        b = b.database(db)
    relay = b.build()
    await relay.run()
    url = await relay.url()
    print(f"READY {url}", flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(s, stop.set)
    await stop.wait()
    relay.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
