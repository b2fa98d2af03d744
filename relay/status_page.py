"""The status page: `GET /` from a browser (`Accept: text/html`) shows the relay to people.

One HTML document with inline CSS, no script and no external asset but the
relay's icon, readable from a 390 px phone up (each table scrolls sideways
in its own box): the NIP-11 identity (name, description and icon as NIP-11
serves them, NIP-86's changes included; NIPs, software), the relay's
WebSocket URL to copy (`[server] public_url`, else the one this request
names), uptime, events by kind (common kinds named) and the database size,
the sync peers with their last reconciliation and counts, the shards held
(with `[[shards]]`: this node's claim, the copies claimed elsewhere, the
events the guard holds back, under-replication), the projectors
with their rows and state, and the newest refusals: by a projector (stored,
not projected) or by a write policy (not stored; relay/store/refused.py).
Nothing private: no database path, no client or peer IP address (a peer
whose URL names an IP is shown by its number), no error texts (they may
name hosts), no event content.  What the page shows is read from
`relay.status` on a thread at most once per `CACHE_SECONDS`, so a busy
page costs the database one `GROUP BY kind` per interval, whoever asks; a
NIP-86 change of the name, description or icon is shown at once.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from dataclasses import dataclass
from html import escape
from http import HTTPStatus
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit

import orjson

from relay.config import Config
from relay.ingest.moderation import Moderation
from relay.protocol.kinds import kind_label
from relay.server import nip11
from relay.wire.http import HttpRequest, HttpResponse
from relay.status import duration, gather_status, recent_refusals
from relay.store import refused
from relay.store.db import connect_readonly

CACHE_SECONDS = 10.0
"""A page is served this long before what it shows is read again."""
CACHED_URLS = 4
"""Pages kept per snapshot, one per WebSocket URL shown (Host header); others are made for each request."""
SHOWN_KINDS = 20  # kinds listed by count; the rest are summed on one line
SHOWN_REFUSALS = 10
CONTENT_TYPE = "text/html; charset=utf-8"

_STYLE = """
:root { color-scheme: light dark; --line: #8884; --muted: #888; }
body { font: 15px/1.5 system-ui, sans-serif; margin: 0 auto; max-width: 60rem; padding: 1rem;
       overflow-wrap: break-word; }
h1 { margin-bottom: 0; } h2 { margin-top: 2rem; border-bottom: 1px solid var(--line); }
.muted, caption { color: var(--muted); } caption { text-align: left; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; }
td, th { padding: .25rem .5rem; text-align: left; vertical-align: top; } th { white-space: nowrap; }
tr + tr td { border-top: 1px solid var(--line); }
.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
code, td.id { font: .85em ui-monospace, monospace; word-break: break-all; }
td.id { min-width: 9.5em; } td.url { min-width: 10em; word-break: break-all; } td.text { min-width: 12em; }
td.time { min-width: 6.5em; }
.url code { font-size: 1em; user-select: all; padding: .1rem .3rem; border: 1px solid var(--line); }
"""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the page shows, as read at one time: the NIP-11 document (`info`), `gather_status`'s dict, and
    the newest refusals as `_refusals` takes them."""

    info: dict
    status: dict
    projector_refusals: list[tuple]
    policy_refusals: list[tuple]


class StatusPage:
    """The page of one node (`config`), which started at `started` (monotonic seconds); `answer` is the route.

    `moderation` holds NIP-86's overrides of `[info]` (name, description, icon), shown as NIP-11 shows them.
    """

    def __init__(self, config: Config, started: float, moderation: Moderation) -> None:
        self.config = config
        self.started = started
        self.moderation = moderation
        self._snapshot: Snapshot | None = None
        self._pages: dict[str, bytes] = {}  # WebSocket URL -> the page of this snapshot showing it
        self._built = -CACHE_SECONDS
        self._built_with: dict[str, str] = {}  # the overrides the snapshot shows
        self._lock = asyncio.Lock()

    async def answer(self, request: HttpRequest) -> HttpResponse:
        """`GET <endpoint>` with Accept naming text/html: 200 and the page (read at most CACHE_SECONDS ago, and
        again at once when NIP-86 has changed the name, description or icon since), showing the WebSocket URL
        this request names (`relay_url`)."""
        async with self._lock:  # concurrent requests share one read
            # read on the event loop, which alone changes them: the read runs on a thread
            overrides = self.moderation.info()
            if time.monotonic() - self._built >= CACHE_SECONDS or overrides != self._built_with:
                self._snapshot = await asyncio.to_thread(self._read, overrides)
                self._built, self._built_with = time.monotonic(), overrides
                self._pages.clear()
        url = relay_url(self.config.server.public_url, request)
        page = self._pages.get(url)
        if page is None:  # ~0.3 ms
            page = render(self._snapshot, url, time.monotonic() - self.started, time.time()).encode()
            if len(self._pages) < CACHED_URLS:
                self._pages[url] = page
        return HttpResponse(HTTPStatus.OK, page, CONTENT_TYPE)

    def _read(self, overrides: Mapping[str, str]) -> Snapshot:
        status = gather_status(self.config)
        conn = connect_readonly(Path(self.config.store.path))
        try:
            projector_refusals = recent_refusals(conn, None, SHOWN_REFUSALS)
            policy_refusals = refused.recent(conn, SHOWN_REFUSALS)
        finally:
            conn.close()
        info = orjson.loads(nip11.document(self.config, overrides, self.moderation.kinds))
        return Snapshot(info, status, projector_refusals, policy_refusals)


def relay_url(public_url: str, request: HttpRequest) -> str:
    """The WebSocket URL to show: `public_url` when set, else the request's: its Host header, path and scheme
    (wss:// when a TLS proxy says `X-Forwarded-Proto: https`); "" without a Host header."""
    if public_url:
        return public_url
    host = request.header("host")
    if not host:
        return ""
    proto = request.header("x-forwarded-proto").partition(",")[0].strip().lower()
    return f"{'wss' if proto == 'https' else 'ws'}://{host}{request.path}"


def render(snapshot: Snapshot, url: str, uptime: float, now: float) -> str:
    """The page as HTML text: `snapshot`, the WebSocket `url` ("": none shown), `uptime` seconds since start,
    `now` unix seconds."""
    info, status = snapshot.info, snapshot.status
    name = escape(info["name"])
    nips = ", ".join(str(n) for n in info["supported_nips"])
    database = status["database"]
    parts = [
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{name}</title><style>{_STYLE}</style></head><body>",
        f"<header>{_icon(info.get('icon'))}<h1>{name}</h1><p>{escape(info['description'])}</p>",
        f'<p class="url">WebSocket URL: <code id="url">{escape(url)}</code></p>' if url else "",
        f'<p class="muted">NIPs {nips} &middot; {escape(info["software"])} {escape(info["version"])} '
        f"&middot; up {duration(uptime)}</p></header>",
        _events(status["events"], database["bytes"] + database["wal_bytes"]),
        _peers(status["peers"], now),
        _shards(status["shards"]) if "shards" in status else "",
        _projectors(status["projectors"]),
        _refusals(snapshot.projector_refusals, snapshot.policy_refusals, status["projectors"]),
        "</body></html>\n",
    ]
    return "\n".join(parts)


def _icon(url: str | None) -> str:
    """The relay's NIP-11 icon as an image, when it is an http(s) URL (one set before NIP-86 checked it may
    not be); else nothing."""
    if url is None or urlsplit(url).scheme.lower() not in ("http", "https"):
        return ""
    return f'<img src="{escape(url)}" alt="" width="64" height="64" referrerpolicy="no-referrer">'


def _table(section: str, title: str, caption: str, head: tuple[str, ...], rows: list[tuple],
           classes: Mapping[str, str] = MappingProxyType({})) -> str:
    """A section with a heading and a table ("none" without rows) in a box that scrolls sideways when too wide;
    each cell is escaped.  `classes` gives columns, by name, a class of _STYLE for their cells and header: "n"
    (a number, right-aligned), "id" (64 hex), "url", "text" (a sentence), "time"."""
    attrs = [f' class="{classes[h]}"' if h in classes else "" for h in head]
    cells = "".join("<tr>" + "".join(map(_cell, row, attrs)) + "</tr>" for row in rows) or \
        f'<tr><td class="muted" colspan="{len(head)}">none</td></tr>'
    header = "".join(f'<th{a} scope="col">{escape(h)}</th>' for h, a in zip(head, attrs))
    return (f'<section id="{section}"><h2>{escape(title)}</h2><div class="scroll"><table>'
            f"<caption>{escape(caption)}</caption><thead><tr>{header}</tr></thead><tbody>{cells}</tbody>"
            "</table></div></section>")


def _cell(value: object, attrs: str) -> str:
    text = f"{value:,}" if isinstance(value, int) else escape(str(value))
    return f"<td{attrs}>{text}</td>"


def plural(count: int, noun: str, nouns: str = "") -> str:
    """`count` and the noun agreeing with it: "1 peer", "2 peers", "1,024 events" (`nouns`: the plural, when
    not `noun` + "s")."""
    return f"{count:,} {noun if count == 1 else nouns or noun + 's'}"


def _events(events: dict, size: int) -> str:
    kinds = list(events["by_kind"].items())
    rows = [(kind_label(int(kind)), count) for kind, count in kinds[:SHOWN_KINDS]]
    if len(kinds) > SHOWN_KINDS:
        rows.append((plural(len(kinds) - SHOWN_KINDS, "other kind"), sum(c for _, c in kinds[SHOWN_KINDS:])))
    return _table("events", "Events", f"{plural(events['total'], 'event')}; database {size / 1048576:.1f} MiB",
                  ("kind", "events"), rows, {"events": "n"})


def _peers(peers: list[dict], now: float) -> str:
    rows = [(_peer_name(p["url"], i), p.get("direction", "-"), _ago(p.get("last_success"), now),
             p.get("events_in", 0), p.get("events_out", 0), p.get("refused", 0), _peer_state(p))
            for i, p in enumerate(peers, 1)]
    return _table("peers", "Sync peers", f"{plural(len(peers), 'peer')} (NIP-77)",
                  ("peer", "direction", "last sync", "events in", "events out", "refused", "state"), rows,
                  {"peer": "url", "events in": "n", "events out": "n", "refused": "n"})


def _shards(shards: list[dict]) -> str:
    rows = [(s["id"], s["claim"]["status"] if s["claim"] else "no claim yet", s["claimed_copies"], s["held_back"],
             "UNDER-REPLICATED: removals wait" if s["under_replicated"] else "replicated") for s in shards]
    return _table("shards", "Shards", f"{plural(len(shards), 'shard')} held here (kind-30803 claims)",
                  ("shard", "this node", "copies elsewhere", "held back", "state"), rows,
                  {"copies elsewhere": "n", "held back": "n"})


def _peer_name(url: str, number: int) -> str:
    """The peer's URL, or "peer N" when its host is an IP address or localhost (not for the public)."""
    host = urlsplit(url).hostname or ""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return f"peer {number}" if host in ("", "localhost") else url
    return f"peer {number}"


def _peer_state(peer: dict) -> str:
    if not peer.get("configured"):
        return "not configured"
    failed, succeeded = peer.get("last_error_at") or 0, peer.get("last_success") or 0
    return "failing" if failed > succeeded else ("in sync" if succeeded else "not synced yet")


def _kind(kind: object) -> str:
    """A kind as `kind_label` shows it; anything else (a removed projector's unknown kind: "?") as it is."""
    return kind_label(kind) if isinstance(kind, int) else str(kind)


def _projectors(projectors: list[dict]) -> str:
    rows = [(p["name"], _kind(p["kind"]), p["state"], p["rows"], p["refusals"]) for p in projectors]
    return _table("projectors", "Projectors", plural(len(projectors), "projected table"),
                  ("table", "kind", "state", "rows", "refusals"), rows, {"rows": "n", "refusals": "n"})


def _refusals(by_projectors: list[tuple], by_policies: list[tuple], projectors: list[dict]) -> str:
    """The newest SHOWN_REFUSALS of both: projector refusals as `recent_refusals` gives them (unix seconds,
    projector, event id, reason), policy refusals as `refused.recent` does."""
    kinds = {p["name"]: p["kind"] for p in projectors}
    found = [(at, kinds.get(name, "?"), f"projector {name}", event_id, reason)
             for at, name, event_id, reason in by_projectors]
    found += [(at, kind, f"policy {policy} ({source})", event_id, reason)
              for at, event_id, kind, source, policy, reason in by_policies]
    found.sort(key=lambda row: row[0], reverse=True)
    rows = [(time.strftime("%Y-%m-%d %H:%M", time.gmtime(at)), _kind(kind), by, event_id, reason)
            for at, kind, by, event_id, reason in found[:SHOWN_REFUSALS]]
    return _table("refusals", "Recent refusals", "newest first, times UTC: a policy's refusal is not stored; a "
                  "projector's event is stored but not projected", ("time", "kind", "refused by", "event", "reason"),
                  rows, {"time": "time", "event": "id", "reason": "text"})


def _ago(seconds: float | None, now: float) -> str:
    return "never" if seconds is None else f"{duration(max(0.0, now - seconds))} ago"
