"""Differences that reconciliation with a peer keeps finding, run after run.

Most differences close in the run that finds them: the event is fetched or
pushed.  One that comes back in the next run was refused on one side for a
reason sync cannot change (a rule of the peer's, retention, a relay that
keeps older versions of a deleted coordinate): counted per peer in
`sync_peers.lasting_differences` (`relay status`, /metrics) and logged, each
id once while it lasts.
"""

from __future__ import annotations

from collections.abc import Set

LOGGED_IDS = 100  # ids named in one log line; the count says how many more


class LastingDifferences:
    """The ids found different in the last two runs with one peer."""

    def __init__(self) -> None:
        self._previous: Set[bytes] | None = None
        self._logged: set[bytes] = set()

    def update(self, differences: Set[bytes] | None) -> tuple[int, list[str]] | None:
        """Take one finished run's have and need ids (None: too many to compare).

        Returns (how many were also found by the run before, the hex ids among
        them not logged yet), or None when either run was not compared.
        """
        previous, self._previous = self._previous, differences
        if previous is None or differences is None:
            return None
        lasting = previous & differences
        new = lasting - self._logged
        self._logged = set(lasting)
        return len(lasting), sorted(i.hex() for i in new)
