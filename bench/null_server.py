"""A do-nothing Nostr "relay" to measure the load generator itself.

    .venv/bin/python bench/null_server.py --port 7100 [--procs 1]

A websockets server (the library's sans-I/O ServerProtocol on a uvloop Protocol) that answers every EVENT with ["OK",id,true,""]
without parsing, verifying or storing anything (the id is cut out of the raw text), every
REQ with EOSE, every COUNT with 0.  --procs N forks N accept loops on one SO_REUSEPORT
port (connections are spread by the kernel).  Compression is off.  Prints READY.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys

import orjson

try:
    import uvloop
except ImportError:  # pragma: no cover
    uvloop = None

from websockets.frames import Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol


def _ok(msg: str) -> str | None:
    i = msg.find('"id":"')  # compact JSON (what the generator sends); else parse
    if i >= 0 and msg[i + 70:i + 71] == '"':
        return '["OK","' + msg[i + 6:i + 70] + '",true,""]'
    try:
        ev = orjson.loads(msg)[1]
        return orjson.dumps(["OK", ev.get("id", ""), True, ""]).decode()
    except Exception:
        return None


class NullProtocol(asyncio.Protocol):
    """websockets' sans-I/O ServerProtocol driven from a raw asyncio Protocol, so that all
    replies to one read are written with a single transport.write."""

    def connection_made(self, transport):
        self.t = transport
        self.ws = ServerProtocol(max_size=2**22)  # no extensions: no compression
        sock = transport.get_extra_info("socket")
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    def data_received(self, data):
        ws = self.ws
        ws.receive_data(data)
        for ev in ws.events_received():
            if isinstance(ev, Request):
                ws.send_response(ws.accept(ev))
                continue
            if ev.opcode not in (Opcode.TEXT, Opcode.BINARY):
                continue  # pings are answered by the protocol, close handled below
            reply = answer(bytes(ev.data).decode())
            if reply is not None:
                ws.send_text(reply.encode())
        out = ws.data_to_send()
        if out:
            closing = out[-1] == b""
            self.t.write(b"".join(out))
            if closing or ws.close_expected():
                self.t.close()

    def eof_received(self):
        self.ws.receive_eof()
        return False


def answer(msg: str) -> str | None:
    if msg.startswith('["EVENT"'):
        return _ok(msg)
    if msg.startswith('["REQ"'):
        return orjson.dumps(["EOSE", orjson.loads(msg)[1]]).decode()
    if msg.startswith('["COUNT"'):
        return orjson.dumps(["COUNT", orjson.loads(msg)[1], {"count": 0}]).decode()
    if msg.startswith('["CLOSE"'):
        return None
    return '["NOTICE","unknown message"]'


async def run(sock: socket.socket) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(s, stop.set)
    server = await loop.create_server(NullProtocol, sock=sock)
    await stop.wait()
    server.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--procs", type=int, default=1)
    args = ap.parse_args()
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("loopback only")
    socks = []
    for _ in range(args.procs):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((args.host, args.port))
        s.listen(1024)
        s.setblocking(False)
        socks.append(s)
    children = []
    for s in socks[1:]:
        pid = os.fork()
        if pid == 0:
            for o in socks:
                if o is not s:
                    o.close()
            if uvloop:
                uvloop.install()
            asyncio.run(run(s))
            os._exit(0)
        children.append(pid)
    for o in socks[1:]:
        o.close()
    print(f"READY ws://{args.host}:{args.port} procs={args.procs}", flush=True)
    if uvloop:
        uvloop.install()
    try:
        asyncio.run(run(socks[0]))
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for pid in children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


if __name__ == "__main__":
    main()
