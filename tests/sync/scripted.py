"""A tiny scripted relay for sync tests: NIP-77 responder over our engine, REQ by ids, EVENT with chosen OKs, NIP-42.

Every behaviour is chosen by the test: which items it advertises in negentropy,
which events it serves for a REQ, the OK it answers to each EVENT, whether it
keeps the events it accepts (advertises and serves them from then on), whether
it drops the connection right after answering its n-th EVENT, whether it
requires AUTH (and accepts or refuses it), or whether it answers NIP-77 with a
NOTICE, a NEG-ERR or silence, like relays without NIP-77.
"""

from __future__ import annotations

import json
import secrets
import time

import websockets

from relay.protocol.event import EventLimits, parse_event, verify_signature
from relay.protocol.negentropy import Negentropy, SortedVector

MODES = ("normal", "notice", "neg-err", "silent", "unknown-close")


class ScriptedRelay:
    """Serve on 127.0.0.1:<free port>; `url` once started.  Records EVENTs received and AUTH events."""

    def __init__(self, advertise: list[dict] = (), serve: dict[str, dict] | None = None,
                 ok: dict[str, tuple[bool, str]] | None = None, mode: str = "normal",
                 auth: str | None = None, keep: bool = False, drop_after: int | None = None) -> None:
        assert mode in MODES
        assert auth in (None, "accept", "refuse")
        self.advertise = list(advertise)
        self.serve = dict(serve if serve is not None else {e["id"]: e for e in advertise})
        self.ok = ok or {}
        self.mode = mode
        self.auth = auth
        self.keep = keep  # events it accepts are advertised and served from then on, as if stored
        self.drop_after = drop_after  # close the connection after answering this many EVENTs (over all connections)
        self.received: list[dict] = []
        self.auth_events: list[tuple[str, dict]] = []  # (challenge sent, AUTH event received)
        self.messages: list[list] = []
        self.live: list[tuple[object, str]] = []  # (socket, sub_id) of REQs without ids
        self._server = None
        self.url = ""

    async def __aenter__(self) -> ScriptedRelay:
        self._server = await websockets.serve(self._handle, "127.0.0.1", 0, max_size=None)
        self.url = f"ws://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, ws) -> None:
        challenge = secrets.token_hex(16)
        authed = False
        negs: dict[str, Negentropy] = {}
        async for frame in ws:
            m = json.loads(frame)
            self.messages.append(m)
            verb = m[0]
            if self.mode == "notice":
                await ws.send(json.dumps(["NOTICE", f"unknown message type {verb}"]))
                continue
            if verb == "AUTH":
                authed = await self._auth(ws, m[1], challenge) or authed
                continue
            if self.auth and not authed:
                await ws.send(json.dumps(["AUTH", challenge]))
                await ws.send(json.dumps(_auth_refusal(m)))
                continue
            if verb == "NEG-OPEN":
                if self.mode == "neg-err":
                    await ws.send(json.dumps(["NEG-ERR", m[1], "blocked: this relay does not sync that"]))
                elif self.mode == "unknown-close":
                    await ws.close(1003, "unsupported")
                    return
                elif self.mode == "normal":
                    vector = SortedVector.from_items((e["created_at"], bytes.fromhex(e["id"])) for e in self.advertise)
                    negs[m[1]] = Negentropy(vector, 60_000)
                    await ws.send(json.dumps(["NEG-MSG", m[1], negs[m[1]].reconcile(bytes.fromhex(m[3])).hex()]))
            elif verb == "NEG-MSG":
                await ws.send(json.dumps(["NEG-MSG", m[1], negs[m[1]].reconcile(bytes.fromhex(m[2])).hex()]))
            elif verb == "NEG-CLOSE":
                negs.pop(m[1], None)
            elif verb == "REQ":
                if not any("ids" in f for f in m[2:]):
                    self.live.append((ws, m[1]))
                for f in m[2:]:
                    for event_id in f.get("ids", []):
                        if event_id in self.serve:
                            await ws.send(json.dumps(["EVENT", m[1], self.serve[event_id]]))
                await ws.send(json.dumps(["EOSE", m[1]]))
            elif verb == "EVENT":
                event = m[1]
                self.received.append(event)
                accepted, message = self.ok.get(event["id"], (True, ""))
                if self.keep and accepted:
                    self.advertise.append(event)
                    self.serve[event["id"]] = event
                await ws.send(json.dumps(["OK", event["id"], accepted, message]))
                if len(self.received) == self.drop_after:
                    await ws.close(1001, "going away")
                    return

    async def broadcast(self, event: dict) -> None:
        """Take `event` as if published here: advertise and serve it, and send it to every live REQ."""
        self.advertise.append(event)
        self.serve[event["id"]] = event
        for ws, sub_id in self.live:
            await ws.send(json.dumps(["EVENT", sub_id, event]))

    async def _auth(self, ws, event: dict, challenge: str) -> bool:
        self.auth_events.append((challenge, event))
        parsed = parse_event(event, EventLimits(), time.time())
        tags = {t[0]: t[1] for t in event["tags"] if len(t) > 1}
        valid = (verify_signature(parsed) and event["kind"] == 22242 and tags.get("relay") == self.url
                 and tags.get("challenge") == challenge)
        if not valid:
            await ws.send(json.dumps(["OK", event["id"], False, "invalid: bad AUTH event"]))
            return False
        if self.auth == "refuse":
            await ws.send(json.dumps(["OK", event["id"], False, "restricted: this node is not on the allow list"]))
            return False
        await ws.send(json.dumps(["OK", event["id"], True, ""]))
        return True


def _auth_refusal(m: list) -> list:
    reason = "auth-required: sync is for known nodes"
    if m[0] == "EVENT":
        return ["OK", m[1]["id"], False, reason]
    if m[0] == "NEG-OPEN":
        return ["NEG-ERR", m[1], reason]
    return ["CLOSED", m[1], reason]
