"""Two of our relays, peered both ways over NIP-77, with records written on both (relay/ingest/records.py): they
end with the same events and the same projected rows, and `relay verify` is clean on both."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from pathlib import Path

from relay.keys import NodeKey
from relay.store.projectors import BUILTIN_PROJECTORS
from tests.conftest import make_config
from tests.helpers import eventually
from tests.inprocess import Relay
from tests.served import free_port, relay_cli_async
from tests.sync.conftest import remote_ids
from tests.sync.mesh import table_dumps

TIMEOUT = 20.0
TABLES = [s.table for s in BUILTIN_PROJECTORS]


def _node(tmp_path, name: str, port: int, peer_port: int) -> Relay:
    (tmp_path / name).mkdir(exist_ok=True)
    return Relay(make_config(tmp_path / name, server={"port": port},
                             sync={"peers": [{"url": f"ws://127.0.0.1:{peer_port}"}], "interval_seconds": 0.5,
                                   "backoff_initial_seconds": 0.1, "backoff_max_seconds": 0.5}))


@asynccontextmanager
async def _pair(tmp_path):
    """Nodes a and b, each with the other as its peer, started; both stopped at the end."""
    pa, pb = free_port(), free_port()
    nodes = [_node(tmp_path, "a", pa, pb), _node(tmp_path, "b", pb, pa)]
    for node in nodes:
        await node.start()
    try:
        yield nodes
    finally:
        for node in nodes:
            await node.stop()


async def _same_tables(a: Relay, b: Relay) -> bool:
    if await remote_ids(a.url) != await remote_ids(b.url):
        return False
    dumps = [table_dumps(Path(n.config.store.path), TABLES) for n in (a, b)]
    return dumps[0] == dumps[1]


async def test_records_written_on_both_nodes_converge(tmp_path):
    """Each node writes rows with its node key, both write one coordinate with a shared key at once, and one
    deletes and re-creates a row: both end with identical tables, and verify is clean."""
    shared = NodeKey(bytes(range(7, 39)))
    async with _pair(tmp_path) as (a, b):
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
