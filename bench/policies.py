"""Write policies' cost: ingest and REQ in the same run with no policy, one Python policy, one strfry plugin.

    .venv/bin/python bench/policies.py --n 50000                 # a few minutes (3 setups x 3 runs)
    .venv/bin/python bench/policies.py --n 2000 --reps 1         # a quick check that it runs

For each setup a fresh `relay serve` (rate limits off) gets the same --n signed events over one
connection, --window EVENTs in flight, counted by OK; then every event is read back by REQ (ids
filters of 500; older replaceable versions superseded meanwhile are not there).  Reported per event,
median of --reps runs: wall µs and relay CPU µs (utime+stime of the relay's process tree, so the
plugin's process counts) for ingest and REQ, and the difference from the setup without policies.
The Python policy is the shipped `max_size` (a dict lookup and a length); the plugin is strfry's
documented whitelist shape in Node.js, accepting every pubkey.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import time

import orjson

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
import common  # noqa: E402
import events  # noqa: E402
from wsraw import WSClient  # noqa: E402

# strfry's docs/plugins.md example, with every pubkey on the list.
PLUGIN_JS = r"""
const rl = require('readline').createInterface({input: process.stdin, output: process.stdout, terminal: false});
rl.on('line', (line) => {
    const req = JSON.parse(line);
    if (req.type !== 'new') { console.error('unexpected request type'); return; }
    console.log(JSON.stringify({id: req.event.id, action: 'accept'}));
});
"""

SETUPS = {
    "none": "",
    "python": '[[policies]]\ncall = "relay.policies.builtin:max_size"\noptions = { default_bytes = 1048576 }\n',
    "plugin": '[[policies]]\ncommand = ["node", "{plugin}"]\ntimeout_seconds = 5.0\n',
}


def config_text(run_dir, port: int, setup: str) -> str:
    return (f'[server]\nhost = "{common.HOST}"\nport = {port}\n[store]\npath = "{run_dir / "relay.db"}"\n'
            f'[rate_limits]\nenabled = false\n[log]\nlevel = "warning"\n'
            + SETUPS[setup].replace("{plugin}", str(run_dir / "plugin.js")))


async def ingest(url: str, lines: list[bytes], window: int) -> tuple[int, float]:
    """Publish `lines` pipelined; returns (OK true count, seconds from first send to last OK)."""
    done = asyncio.get_running_loop().create_future()
    room = asyncio.Event()
    answered = accepted = 0

    def on_message(message: bytes) -> None:
        nonlocal answered, accepted
        if message.startswith(b'["OK"'):
            answered += 1
            accepted += orjson.loads(message)[2] is True
            if answered == len(lines) and not done.done():
                done.set_result(None)
            room.set()

    client = await WSClient.connect(url, on_message)
    started = time.perf_counter()
    for sent, line in enumerate(lines):
        while sent - answered >= window:
            room.clear()
            await room.wait()
        client.send(events.event_message(line))
    await asyncio.wait_for(done, 600)
    seconds = time.perf_counter() - started
    await client.close()
    return accepted, seconds


async def read_back(url: str, ids: list[str], chunk: int = 500) -> tuple[int, float]:
    """REQ every id (filters of `chunk` ids, one REQ at a time); returns (events received, seconds)."""
    received = 0
    eose = asyncio.Event()

    def on_message(message: bytes) -> None:
        nonlocal received
        if message.startswith(b'["EVENT"'):
            received += 1
        elif message.startswith(b'["EOSE"'):
            eose.set()

    client = await WSClient.connect(url, on_message)
    started = time.perf_counter()
    for i in range(0, len(ids), chunk):
        eose.clear()
        client.send(json.dumps(["REQ", f"r{i}", {"ids": ids[i:i + chunk]}]).encode())
        await asyncio.wait_for(eose.wait(), 60)
        client.send(json.dumps(["CLOSE", f"r{i}"]).encode())
    seconds = time.perf_counter() - started
    await client.close()
    return received, seconds


def run_setup(setup: str, lines: list[bytes], ids: list[str], window: int) -> dict:
    port = common.free_port()
    run_dir = common._rundir(f"policies-{setup}", port)
    (run_dir / "plugin.js").write_text(PLUGIN_JS)
    config = run_dir / "relay.toml"
    config.write_text(config_text(run_dir, port, setup))
    server = common.Server(f"policies-{setup}", [str(common.REPO / ".venv" / "bin" / "relay"), "serve",
                                                  "--config", str(config)], port, run_dir)
    with server.start():
        cpu = common.cpu_seconds(server.pid)
        stored, ingest_seconds = asyncio.run(ingest(server.url, lines, window))
        ingest_cpu = common.cpu_seconds(server.pid) - cpu
        cpu = common.cpu_seconds(server.pid)
        received, req_seconds = asyncio.run(read_back(server.url, ids))
        req_cpu = common.cpu_seconds(server.pid) - cpu
    n = len(lines)
    if stored != n:
        raise RuntimeError(f"{setup}: {stored} of {n} events answered OK true")
    # Older replaceable versions in the set were accepted, then superseded: fewer are read back.
    return {"ingest_us": ingest_seconds / n * 1e6, "ingest_cpu_us": ingest_cpu / n * 1e6,
            "req_us": req_seconds / received * 1e6, "req_cpu_us": req_cpu / received * 1e6, "read": received}


def pair(r: dict, what: str, base: dict | None = None) -> str:
    """"wall / cpu" µs of `what` (ingest or req), or their differences from `base` when given."""
    wall, cpu = r[f"{what}_us"], r[f"{what}_cpu_us"]
    if base is None:
        return f"{wall:.1f} / {cpu:.1f}"
    return f"{wall - base[what + '_us']:+.1f} / {cpu - base[what + '_cpu_us']:+.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=50_000, help="events per run")
    ap.add_argument("--reps", type=int, default=3, help="runs per setup (the median is reported)")
    ap.add_argument("--window", type=int, default=1000, help="EVENTs in flight")
    ap.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    args = ap.parse_args()
    if "plugin" in args.setups and shutil.which("node") is None:
        sys.exit("the plugin setup needs Node.js (node on PATH); try --setups none python")
    lines = events.load(args.n, quiet=True)
    ids = [orjson.loads(line)["id"] for line in lines]
    results: dict[str, dict] = {}
    for setup in args.setups:
        runs = [run_setup(setup, lines, ids, args.window) for _ in range(args.reps)]
        results[setup] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    if len({r["read"] for r in results.values()}) > 1:
        raise RuntimeError(f"the setups read back different counts: {results}")
    base = results.get("none")
    print(f"{args.n} events, {args.reps} run(s) each, median µs per event (wall / relay CPU)")
    print(f"{'setup':8} {'ingest':>16} {'vs none':>16} {'REQ':>16} {'vs none':>16}")
    for setup, r in results.items():
        cells = [pair(r, "ingest"), pair(r, "ingest", base), pair(r, "req"), pair(r, "req", base)]
        print(f"{setup:8} " + " ".join(f"{c:>16}" for c in cells))
    out = common.RESULTS / f"policies-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"n": args.n, "reps": args.reps, "results": results}, indent=1))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
