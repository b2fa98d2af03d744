"""Diagnostic: does a relay answer one connection's pipelined EVENTs in order, and does it
judge replaceable events in the order they were sent?

    .venv/bin/python bench/order_check.py --relay ours [--n 5000] [--window 1000]
    .venv/bin/python bench/order_check.py --url ws://127.0.0.1:7777

Publishes the first n bench events (each strictly newer than the previous) on ONE
connection with up to --window unanswered, then reports OK order inversions and, for each
OK false, whether a newer event of the same (pubkey, kind) was sent *later* on the same
connection (i.e. the relay committed a later message first).
"""
from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import events  # noqa: E402
from wsraw import WSClient  # noqa: E402


async def check(url: str, lines: list[bytes], window: int) -> dict:
    evs = [orjson.loads(ln) for ln in lines]
    pos = {e["id"]: i for i, e in enumerate(evs)}
    order: list[int] = []
    bad: list[tuple[str, str]] = []

    def cb(m: bytes):
        r = orjson.loads(m)
        if r[0] == "OK":
            order.append(pos.get(r[1], -1))
            if r[2] is not True:
                bad.append((r[1], str(r[3])))

    ws = await WSClient.connect(url, cb)
    sent = 0
    deadline = time.time() + 120
    while sent < len(lines) and time.time() < deadline:
        if sent - len(order) >= window:
            await asyncio.sleep(0.0005)
            continue
        k = min(100, window - (sent - len(order)), len(lines) - sent)
        ws.send_many([events.event_message(x) for x in lines[sent:sent + k]])
        sent += k
        await ws.drain()
    while len(order) < sent and time.time() < deadline:
        await asyncio.sleep(0.05)
    await ws.close()
    inversions = sum(1 for a, b in zip(order, order[1:]) if b < a)
    details = []
    for eid, reason in bad:
        i = pos[eid]
        e = evs[i]
        later = next((j for j in range(i + 1, len(evs)) if evs[j]["pubkey"] == e["pubkey"]
                      and evs[j]["kind"] == e["kind"]), None)
        details.append({"index": i, "kind": e["kind"], "reason": reason,
                        "newer_same_pubkey_kind_sent_later_at": later})
    return {"sent": sent, "answered": len(order), "ok_order_inversions": inversions,
            "ok_false": len(bad), "details": details}


def main() -> None:
    ap, g = common.target_parser(__doc__)
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--window", type=int, default=1000)
    args = ap.parse_args()
    if args.relay == "localrelay" and args.n > 5900:
        sys.exit("LocalRelay closes a connection after 6,000 messages a minute: use --n <= 5900")
    srv = common.FACTORIES[args.relay]().start() if args.relay else None
    try:
        common.install_uvloop()
        r = asyncio.run(check(srv.url if srv else args.url, events.load(args.n), args.window))
    finally:
        if srv:
            srv.stop()
    print(f"sent {r['sent']}, answered {r['answered']}, OK order inversions "
          f"{r['ok_order_inversions']}, OK false {r['ok_false']}")
    for d in r["details"][:10]:
        print(f"  event #{d['index']} kind {d['kind']}: {d['reason']!r}; newer same "
              f"(pubkey, kind) sent later at #{d['newer_same_pubkey_kind_sent_later_at']}")


if __name__ == "__main__":
    main()
