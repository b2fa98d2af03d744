"""Logging never stops the relay: log lines go to stderr from a thread of their own (relay/logging.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import websockets

from tests.served import answers_health, clean_env, free_port

CONNECTIONS = 600  # two log lines each (opened, closed): well past a pipe's 64 KiB


async def test_relay_keeps_serving_while_nobody_reads_its_stderr(tmp_path):
    """stderr is a pipe that is never read: once its buffer is full, a relay that wrote log lines on the event loop
    would hang there.  It must keep accepting connections and answering REQs (the surplus lines are dropped)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "relay", "serve", "--port", str(port), "--db", tmp_path / "relay.db"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=clean_env(RELAY_LOG__FORMAT="json"), cwd=tmp_path)
    try:
        for _ in range(200):
            if await asyncio.to_thread(answers_health, port):
                break
            await asyncio.sleep(0.05)
        url = f"ws://127.0.0.1:{port}"
        for _ in range(CONNECTIONS):
            async with websockets.connect(url, open_timeout=5, close_timeout=5):
                pass
        async with websockets.connect(url, open_timeout=5) as ws:
            await ws.send('["REQ", "after", {"limit": 1}]')
            replies = [await asyncio.wait_for(ws.recv(), 5) for _ in range(2)]  # the AUTH challenge, then EOSE
            assert replies[1] == '["EOSE","after"]', replies
    finally:
        proc.terminate()
        _, err = await asyncio.to_thread(proc.communicate, timeout=30)  # reading now lets the writer finish
    assert proc.returncode == 0
    assert b'"event": "relay_stopped"' in err.splitlines()[-1]
