"""Two of our relays, peered both ways over NIP-77, with records written on both (relay/ingest/records.py): they
end with the same events and the same projected rows, and `relay verify` is clean on both."""

from __future__ import annotations

import asyncio
from pathlib import Path

from relay.keys import NodeKey
from relay.store.projectors import BUILTIN_PROJECTORS
from tests.helpers import eventually
from tests.inprocess import Relay
from tests.served import relay_cli_async
from tests.sync.conftest import peered_pair, remote_ids
from tests.sync.mesh import table_dumps

TIMEOUT = 20.0
TABLES = [s.table for s in BUILTIN_PROJECTORS]


async def _same_tables(a: Relay, b: Relay) -> bool:
    if await remote_ids(a.url) != await remote_ids(b.url):
        return False
    dumps = [table_dumps(Path(n.config.store.path), TABLES) for n in (a, b)]
    return dumps[0] == dumps[1]


async def test_records_written_on_both_nodes_converge(tmp_path):
    """Each node writes rows with its node key, both write one coordinate with a shared key at once, and one
    deletes and re-creates a row: both end with identical tables, and verify is clean."""
    shared = NodeKey(bytes(range(7, 39)))
    async with peered_pair(tmp_path) as (a, b):
        ra, rb = a.node.records, b.node.records
        assert ra.node_key.pubkey != rb.node_key.pubkey
        await ra.put_record("profiles", {"name": "node a"})
        await rb.put_record("profiles", {"name": "node b"})
        await ra.put_record("follows", [{"followed": rb.node_key.pubkey}, {"followed": "aa" * 32}])
        await rb.put_record("articles", {"d": "post", "title": "one", "published_at": 1})
        await rb.delete_record("articles", pk={"pubkey": rb.node_key.pubkey, "d": "post"})
        await rb.put_record("articles", {"d": "post", "title": "two"})
        await asyncio.gather(ra.put_record("profiles", {"name": "from a"}, key=shared),
                             rb.put_record("profiles", {"name": "from b"}, key=shared))
        await ra.put_record("follows", [{"followed": "aa" * 32}])  # one row removed: a put of the others
        assert await eventually(lambda: _same_tables(a, b), TIMEOUT)
        dump = table_dumps(Path(a.config.store.path), TABLES)
        assert len(dump["profiles"]) == 3 and len(dump["follows"]) == 1 and len(dump["articles"]) == 1
        assert "two" in dump["articles"][0]  # the title of the version put after the deletion
    for node in (a, b):
        code, out, _ = await relay_cli_async("verify", "--db", node.config.store.path)
        assert code == 0, out
