"""The status page in a real browser: headless Chromium screenshots of a relay with real data, desktop and phone.

    .venv/bin/python bench/status_page_screenshots.py                  # ~15 s; PNGs in /tmp/relay-status-page/
    .venv/bin/python bench/status_page_screenshots.py --out /tmp/x --events 3000

Two relays on 127.0.0.1: a peer holding the first --events/4 events of
/work/shared/data/all_real_valid_dedup.jsonl (or --data), and the relay shown,
with two worker processes, holding the next --events (`relay import`), which
syncs down from that peer (a second configured peer, at a name that does not
resolve, fails).  Its `[[policies]]` refuse large notes (from clients and
peers) and one denied author; a client then publishes a malformed profile
(a projector refusal), a denied author's note and a large note (policy
refusals).  Headless Chromium (`chromium`, Debian's package) then shows the
page at 1280x1000 and as a phone (390x844, DevTools' device emulation:
`--window-size` lays a page out at least 500 px wide), each in its first
screen and whole, writing one PNG each, and reports for each whether the page scrolls
sideways (`document.documentElement.scrollWidth` past the viewport's width).
Needs `.venv/bin/relay`; every process it starts is stopped by its own pid.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import HOST, REPO, Server, free_port  # noqa: E402

sys.path.insert(0, str(REPO))
from relay.keys import NodeKey  # noqa: E402

DATA = Path("/work/shared/data/all_real_valid_dedup.jsonl")
RELAY = REPO / ".venv" / "bin" / "relay"
VIEWS = {"desktop-1280x1000": (1280, 1000, False, False), "desktop-1280-full": (1280, 1000, False, True),
         "phone-390x844": (390, 844, True, False), "phone-390-full": (390, 844, True, True)}
"""name -> (width, height, a phone's viewport, the whole page)"""
SPAMMER = NodeKey(bytes([7]) * 32)
AUTHOR = NodeKey(bytes([9]) * 32)


def config(directory: Path, port: int, peers: str = "", policies: str = "", workers: int = 0) -> Path:
    """A relay.toml in `directory`: its database there, `port`, loopback not rate limited, and the given tables."""
    directory.mkdir(parents=True)
    path = directory / "relay.toml"
    path.write_text(f"""
[info]
name = "Status page test relay"
description = "Real events from public fixtures, a peer, a failing peer and two write policies."
[server]
host = "{HOST}"
port = {port}
workers = {workers}
[store]
path = "{directory / 'relay.db'}"
[rate_limits]
exempt = ["127.0.0.0/8"]
{peers}
{policies}
""")
    return path


def import_events(path: Path, lines: list[str]) -> None:
    """`relay import` of `lines` (JSON events) into the relay of config `path`."""
    source = path.parent / "events.jsonl"
    source.write_text("".join(lines))
    subprocess.run([str(RELAY), "import", "--config", str(path), str(source)], check=True, capture_output=True,
                   timeout=300)


def serve(name: str, path: Path, port: int) -> Server:
    return Server(name, [str(RELAY), "serve", "--config", str(path)], port, path.parent).start()


async def publish(url: str, events: list[dict]) -> list[list]:
    """Each event's OK message."""
    async with websockets.connect(url) as ws:
        replies = []
        for event in events:
            await ws.send(json.dumps(["EVENT", event]))
            while (reply := json.loads(await ws.recv()))[:2] != ["OK", event["id"]]:
                pass  # an AUTH challenge
            replies.append(reply[2:])
        return replies


def wait_for_sync(port: int, timeout: float = 60.0) -> str:
    """The page once its peer 1 has synced (it shows "in sync"), read again every 2 s (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        request = urllib.request.Request(f"http://{HOST}:{port}/", headers={"Accept": "text/html"})
        with urllib.request.urlopen(request, timeout=10) as response:
            page = response.read().decode()
        if "in sync" in page or time.monotonic() > deadline:
            return page
        time.sleep(2)


class Browser:
    """Headless Chromium driven over the DevTools protocol (its WebSocket): `await show(...)` per view."""

    def __init__(self, chromium: str, directory: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                      f"--remote-debugging-port={self.port}", f"--user-data-dir={directory}",
                                      "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._ids = iter(range(1, 1_000_000))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def page_socket(self) -> str:
        """The DevTools WebSocket URL of the browser's page, once it answers (bounded)."""
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{HOST}:{self.port}/json/list", timeout=2) as response:
                    return next(t for t in json.load(response) if t["type"] == "page")["webSocketDebuggerUrl"]
            except (OSError, StopIteration):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("chromium's DevTools did not answer") from None
                time.sleep(0.2)

    async def show(self, url: str, png: Path, width: int, height: int, mobile: bool, whole: bool) -> tuple[int, int]:
        """Load `url` in a `width` x `height` viewport (`mobile`: a phone's, honouring the viewport meta), write
        a screenshot (`whole`: the whole page) to `png`; returns (document scrollWidth, viewport width)."""
        async with websockets.connect(self.page_socket(), max_size=64 * 1024 * 1024) as ws:
            async def call(method: str, **params) -> dict:
                ident = next(self._ids)
                await ws.send(json.dumps({"id": ident, "method": method, "params": params}))
                while (answer := json.loads(await ws.recv())).get("id") != ident:
                    pass  # events
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]

            await call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                       mobile=mobile)
            await call("Page.enable")
            await call("Page.navigate", url=url)
            while json.loads(await ws.recv()).get("method") != "Page.loadEventFired":
                pass
            measured = await call("Runtime.evaluate", returnByValue=True,
                                  expression="[document.documentElement.scrollWidth, window.innerWidth]")
            clip = {}
            if whole:
                size = (await call("Page.getLayoutMetrics"))["cssContentSize"]
                clip = {"clip": {"x": 0, "y": 0, "width": width, "height": size["height"], "scale": 1},
                        "captureBeyondViewport": True}
            shot = await call("Page.captureScreenshot", format="png", **clip)
            png.write_bytes(base64.b64decode(shot["data"]))
            return tuple(measured["result"]["value"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/relay-status-page"))
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--events", type=int, default=2000, help="events of the relay shown (its peer: a quarter)")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("no chromium: apt-get install -y chromium")
    shutil.rmtree(args.out, ignore_errors=True)
    lines = args.data.read_text().splitlines(keepends=True)
    peer_lines, own_lines = lines[:args.events // 4], lines[args.events // 4:args.events // 4 + args.events]

    peer_port, port = free_port(), free_port()
    peer_config = config(args.out / "peer", peer_port)
    import_events(peer_config, peer_lines)
    (args.out / "denied.txt").write_text(SPAMMER.pubkey + "\n")
    shown_config = config(args.out / "relay", port, workers=2, peers=f"""
[[sync.peers]]
url = "ws://{HOST}:{peer_port}"
direction = "down"
[[sync.peers]]
url = "wss://relay.example.invalid"
direction = "up"
""", policies=f"""
[[policies]]
name = "note_size"
call = "relay.policies.builtin:max_size"
options = {{ bytes_per_kind = {{ "1" = 3000 }} }}
sources = ["client", "peer"]
[[policies]]
name = "denylist"
call = "relay.policies.builtin:pubkey_list"
options = {{ deny_file = "{args.out / 'denied.txt'}" }}
""")
    import_events(shown_config, own_lines)
    servers = [serve("status-peer", peer_config, peer_port), serve("status-relay", shown_config, port)]
    try:
        replies = asyncio.run(publish(f"ws://{HOST}:{port}", [
            AUTHOR.sign_event(0, [], "{not json"),
            SPAMMER.sign_event(1, [], "buy now"),
            AUTHOR.sign_event(1, [], "a long note " * 300),
        ]))
        print("published (OK replies):", *replies)
        page = wait_for_sync(port)
        (args.out / "page.html").write_text(page)
        browser = Browser(chromium, args.out / "chromium-profile")
        try:
            for name, (width, height, mobile, whole) in VIEWS.items():
                png = args.out / f"status-{name}.png"
                scrolled, viewport = asyncio.run(browser.show(f"http://{HOST}:{port}/", png, width, height,
                                                              mobile, whole))
                print(png, f"document {scrolled} px wide in a {viewport} px viewport:",
                      "scrolls sideways" if scrolled > viewport else "no sideways scroll")
        finally:
            browser.stop()
    finally:
        for server in servers:
            server.stop()


if __name__ == "__main__":
    main()
