"""A relay-wide byte budget: memory held by stored REQ results not yet handed to their sockets."""

from __future__ import annotations


class ByteBudget:
    """At most `max_bytes` held at once by all holders together (bytes).

    A REQ takes the size of its stored results before sending them and gives
    each chunk back once its socket took it, so results queued for clients
    that do not read cannot grow without bound.  Single-threaded (event loop).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0

    def take(self, n: int) -> bool:
        """Reserve `n` bytes; False (nothing reserved) when that would pass `max_bytes`."""
        if self.held + n > self.max_bytes:
            return False
        self.held += n
        return True

    def release(self, n: int) -> None:
        """Give back `n` bytes taken before."""
        self.held -= n
