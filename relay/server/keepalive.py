"""The relay's keepalive: one task pings every client of a server (RFC 6455 section 5.5.2) and closes one
that has neither answered nor read for `[server] ping_timeout_seconds`.

How this works: each connection is watched (`Keepalive.watch`) from its start to its end.  Every
`PROGRESS_CHECK_SECONDS` the one task looks at each: a connection due a ping gets one (a task that lives
until the pong); one whose ping is answered is due again `ping_interval_seconds` later; one whose ping is
not answered is given up once its peer's TCP has acknowledged nothing of what was written to it for the
timeout (a ping waits behind every byte written before it, so a client steadily reading a large answer gets
its pong late, and stays).  A task per connection held 2.1 kB for every idle client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from relay.wire.websocket import PROGRESS_CHECK_SECONDS, Progress, Wire


class _Watch:
    __slots__ = ("on_timeout", "next_ping", "pong", "progress")

    def __init__(self, on_timeout: Callable[[], None], next_ping: float) -> None:
        self.on_timeout = on_timeout
        self.next_ping = next_ping  # loop time of the next ping, while none is in flight
        self.pong: asyncio.Future | None = None  # the ping in flight, done once answered
        self.progress: Progress | None = None  # the peer's reading since that ping was sent


class Keepalive:
    """Pings each watched `Wire` every `interval` seconds; calls its `on_timeout()` (which must not block) once
    it has neither answered its ping nor taken any of what was written to it for `timeout` seconds.

    `run()` is the task; single-threaded (event loop).
    """

    def __init__(self, interval: float, timeout: float) -> None:
        self.interval = interval
        self.timeout = timeout
        self._watched: dict[Wire, _Watch] = {}

    def watch(self, wire: Wire, on_timeout: Callable[[], None]) -> None:
        """Ping `wire` from `interval` seconds from now on, until `forget` or its timeout."""
        self._watched[wire] = _Watch(on_timeout, asyncio.get_running_loop().time() + self.interval)

    def forget(self, wire: Wire) -> None:
        """Stop watching `wire` (its connection ended); its ping in flight, if any, is abandoned."""
        watch = self._watched.pop(wire, None)
        if watch is not None and watch.pong is not None:
            watch.pong.cancel()

    async def run(self) -> None:
        """Look at every watched wire every `PROGRESS_CHECK_SECONDS`, until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(PROGRESS_CHECK_SECONDS)
            self.look(loop.time())

    def look(self, now: float) -> None:
        """Ping the wires due a ping at loop time `now`, and give up on those silent for `timeout` seconds."""
        for wire, watch in list(self._watched.items()):
            if watch.pong is None:
                if now >= watch.next_ping:
                    watch.pong, watch.progress = asyncio.ensure_future(wire.ping()), Progress()
            elif watch.pong.done():
                watch.pong, watch.next_ping = None, now + self.interval
            elif watch.progress.look(wire.taken_bytes()) >= self.timeout:
                self.forget(wire)
                watch.on_timeout()
