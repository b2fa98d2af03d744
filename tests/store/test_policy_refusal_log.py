"""The log of write policies' refusals for people (relay/store/refused.py): bounded, newest first."""

from __future__ import annotations

from relay.store import refused
from relay.store.db import connect_readonly
from relay.store.store import Store


def _logged(i: int) -> tuple[str, int, str, str, str]:
    return (f"{i:064x}", 1, "client", "no_links", f"blocked: link {i}")


def _recent(path) -> tuple[list[tuple], set[bytes]]:
    conn = connect_readonly(path)
    try:
        return refused.recent(conn, 1000), refused.refused_among(conn, [bytes(32)])
    finally:
        conn.close()


async def test_the_log_keeps_the_newest_refusals_and_a_refused_again_event_moves_to_the_top(tmp_path):
    """LOG_ROWS + 5 refusals keep the newest LOG_ROWS, newest first, with kind, source, policy and message; the
    same event refused again is one row, now the newest; peers' settled ids are recorded beside."""
    store = await Store.open(tmp_path / "relay.db")
    try:
        for i in range(refused.LOG_ROWS + 5):
            await store.run_job(refused.record, [], 1000 + i, refused.MAX_ROWS, [_logged(i)])
        rows, _ = _recent(tmp_path / "relay.db")
        assert [r[1] for r in rows] == [f"{i:064x}" for i in reversed(range(5, refused.LOG_ROWS + 5))]
        assert rows[0] == (1000 + refused.LOG_ROWS + 4, f"{refused.LOG_ROWS + 4:064x}", 1, "client", "no_links",
                           f"blocked: link {refused.LOG_ROWS + 4}")
        await store.run_job(refused.record, [(bytes(32), "ws://peer")], 5000, refused.MAX_ROWS, [_logged(50)])
    finally:
        await store.close()
    rows, settled = _recent(tmp_path / "relay.db")
    assert rows[0][:2] == (5000, f"{50:064x}") and [r[1] for r in rows].count(f"{50:064x}") == 1
    assert len(rows) <= refused.LOG_ROWS and settled == {bytes(32)}
