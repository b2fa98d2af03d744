"""The status page: `GET /` from a browser (`Accept: text/html`) shows the relay to people.

One HTML document with inline CSS, no script and no external asset but the
relay's icon: the NIP-11 identity (name, description and icon as NIP-11
serves them, NIP-86's changes included; NIPs, software), uptime, events by kind
and the database size, the sync peers with their last reconciliation and
counts, the projectors with their rows and state, and the newest projector
refusals.  Nothing private: no database path, no client or peer IP address
(a peer whose URL names an IP is shown by its number), no error texts (they
may name hosts), no event content.  The page is built from `relay.status`
on a thread at most once per `CACHE_SECONDS`, so a busy page costs the
database one `GROUP BY kind` per interval, whoever asks; a NIP-86 change of
the name, description or icon is shown at once.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from html import escape
from http import HTTPStatus
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

import orjson

from relay.config import Config
from relay.ingest.moderation import Moderation
from relay.server import nip11
from relay.server.wire.http import HttpRequest, HttpResponse
from relay.status import duration, gather_status, recent_refusals
from relay.store.db import connect_readonly

CACHE_SECONDS = 10.0
"""A rendered page is served this long before it is built again."""
SHOWN_KINDS = 20  # kinds listed by count; the rest are summed on one line
SHOWN_REFUSALS = 10
CONTENT_TYPE = "text/html; charset=utf-8"

_STYLE = """
:root { color-scheme: light dark; --line: #8884; --muted: #888; }
body { font: 15px/1.5 system-ui, sans-serif; margin: 0 auto; max-width: 60rem; padding: 1.5rem; }
h1 { margin-bottom: 0; } h2 { margin-top: 2rem; border-bottom: 1px solid var(--line); }
.muted, caption { color: var(--muted); } caption { text-align: left; }
table { border-collapse: collapse; width: 100%; } td, th { padding: .25rem .5rem; text-align: left; }
tr + tr td { border-top: 1px solid var(--line); } td.n { text-align: right; font-variant-numeric: tabular-nums; }
code { font-size: .85em; word-break: break-all; }
"""


class StatusPage:
    """The page of one node (`config`), which started at `started` (monotonic seconds); `answer` is the route.

    `moderation` holds NIP-86's overrides of `[info]` (name, description, icon), shown as NIP-11 shows them.
    """

    def __init__(self, config: Config, started: float, moderation: Moderation) -> None:
        self.config = config
        self.started = started
        self.moderation = moderation
        self._page: bytes = b""
        self._built = -CACHE_SECONDS
        self._built_with: dict[str, str] = {}  # the overrides the page shows
        self._lock = asyncio.Lock()

    async def answer(self, request: HttpRequest) -> HttpResponse:
        """`GET <endpoint>` with Accept naming text/html: 200 and the page (at most CACHE_SECONDS old, and
        built again at once when NIP-86 has changed the name, description or icon since)."""
        async with self._lock:  # concurrent requests share one build
            # read on the event loop, which alone changes them: the build runs on a thread
            overrides = self.moderation.info()
            if time.monotonic() - self._built >= CACHE_SECONDS or overrides != self._built_with:
                self._page = (await asyncio.to_thread(self._build, overrides)).encode()
                self._built, self._built_with = time.monotonic(), overrides
        return HttpResponse(HTTPStatus.OK, self._page, CONTENT_TYPE)

    def _build(self, overrides: Mapping[str, str]) -> str:
        status = gather_status(self.config)
        conn = connect_readonly(Path(self.config.store.path))
        try:
            refusals = recent_refusals(conn, None, SHOWN_REFUSALS)
        finally:
            conn.close()
        info = orjson.loads(nip11.document(self.config, overrides, self.moderation.kinds))
        return render(info, status, refusals, time.monotonic() - self.started, time.time())


def render(info: dict, status: dict, refusals: list[tuple], uptime: float, now: float) -> str:
    """The page as HTML text.

    `info` is the NIP-11 document (dict; its `icon`, an http(s) URL, is shown when present), `status` is
    `gather_status`'s dict, `refusals` are `recent_refusals` rows, `uptime` seconds since start, `now` unix
    seconds.
    """
    name = escape(info["name"])
    nips = ", ".join(str(n) for n in info["supported_nips"])
    database = status["database"]
    parts = [
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{name}</title><style>{_STYLE}</style></head><body>",
        f"<header>{_icon(info.get('icon'))}<h1>{name}</h1><p>{escape(info['description'])}</p>",
        f'<p class="muted">NIPs {nips} &middot; {escape(info["software"])} {escape(info["version"])} '
        f"&middot; up {duration(uptime)}</p></header>",
        _events(status["events"], database["bytes"] + database["wal_bytes"]),
        _peers(status["peers"], now),
        _projectors(status["projectors"]),
        _refusals(refusals),
        "</body></html>\n",
    ]
    return "\n".join(parts)


def _icon(url: str | None) -> str:
    """The relay's NIP-11 icon as an image, when it is an http(s) URL (one set before NIP-86 checked it may
    not be); else nothing."""
    if url is None or urlsplit(url).scheme.lower() not in ("http", "https"):
        return ""
    return f'<img src="{escape(url)}" alt="" width="64" height="64" referrerpolicy="no-referrer">'


def _table(section: str, title: str, caption: str, head: tuple[str, ...], rows: list[tuple]) -> str:
    """A section with a heading and a table ("none" without rows); each cell is escaped, numbers right-aligned."""
    cells = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows) or \
        f'<tr><td class="muted" colspan="{len(head)}">none</td></tr>'
    header = "".join(f"<th>{escape(h)}</th>" for h in head)
    return (f'<section id="{section}"><h2>{escape(title)}</h2><table><caption>{escape(caption)}</caption>'
            f"<thead><tr>{header}</tr></thead><tbody>{cells}</tbody></table></section>")


def _cell(value: object) -> str:
    if isinstance(value, int):
        return f'<td class="n">{value:,}</td>'
    return f"<td>{escape(str(value))}</td>"


def _events(events: dict, size: int) -> str:
    kinds = list(events["by_kind"].items())
    rows = [(f"kind {kind}", count) for kind, count in kinds[:SHOWN_KINDS]]
    if len(kinds) > SHOWN_KINDS:
        rows.append((f"{len(kinds) - SHOWN_KINDS} other kinds", sum(c for _, c in kinds[SHOWN_KINDS:])))
    return _table("events", "Events", f"{events['total']:,} events; database {size / 1048576:.1f} MiB",
                  ("kind", "events"), rows)


def _peers(peers: list[dict], now: float) -> str:
    rows = [(_peer_name(p["url"], i), p.get("direction", "-"), _ago(p.get("last_success"), now),
             p.get("events_in", 0), p.get("events_out", 0), p.get("refused", 0), _peer_state(p))
            for i, p in enumerate(peers, 1)]
    return _table("peers", "Sync peers", f"{len(peers)} peers (NIP-77)",
                  ("peer", "direction", "last sync", "events in", "events out", "refused", "state"), rows)


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


def _projectors(projectors: list[dict]) -> str:
    rows = [(p["name"], str(p["kind"]), p["state"], p["rows"], p["refusals"]) for p in projectors]
    return _table("projectors", "Projectors", f"{len(projectors)} projected tables",
                  ("table", "kind", "state", "rows", "refusals"), rows)


def _refusals(refusals: list[tuple]) -> str:
    rows = [(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at)), name, event_id, reason)
            for at, name, event_id, reason in refusals]
    return _table("refusals", "Recent refusals", "events stored but not projected, newest first",
                  ("time", "projector", "event", "reason"), rows)


def _ago(seconds: float | None, now: float) -> str:
    return "never" if seconds is None else f"{duration(max(0.0, now - seconds))} ago"
