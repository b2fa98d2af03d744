"""Byte budgets: memory held by stored REQ results not yet handed to their sockets, relay-wide and per client IP."""

from __future__ import annotations


class ByteBudget:
    """At most `max_bytes` held at once by all holders together (bytes), and each byte also taken from
    `within` (a share of a larger budget: one client IP's of the relay's) when given.

    A REQ takes the size of its stored results before sending them and gives
    each chunk back once its socket took it, so results queued for clients
    that do not read cannot grow without bound.  Single-threaded (event loop).
    """

    def __init__(self, max_bytes: int, within: ByteBudget | None = None) -> None:
        self.max_bytes = max_bytes
        self.within = within
        self.held = 0

    def short_of(self, n: int) -> ByteBudget | None:
        """The budget, this one or one it is `within`, that `n` more bytes would pass (the innermost first);
        None when they fit in all."""
        if self.held + n > self.max_bytes:
            return self
        return None if self.within is None else self.within.short_of(n)

    def take(self, n: int) -> bool:
        """Reserve `n` bytes here and in `within`; False (nothing reserved) when that would pass either bound."""
        if self.short_of(n) is not None:
            return False
        self.held += n
        if self.within is not None:
            self.within.take(n)
        return True

    def release(self, n: int) -> None:
        """Give back `n` bytes taken before (here and in `within`)."""
        self.held -= n
        if self.within is not None:
            self.within.release(n)
