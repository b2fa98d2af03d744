"""The parts of a relay process are built once, with what they need passed in (relay/assembly.py): no module under
relay/ sets an attribute of a built part from outside it (`ingest.sink = ...`, `store.forward_job = ...`), the
rewiring that made each process's sequence of its own."""

from __future__ import annotations

import ast
import inspect
import textwrap

from relay.assembly import Node
from relay.channel.follower import FeedFollower
from relay.channel.worker import WriterChannel
from relay.channel.writer import ChannelServer
from relay.ingest import Ingest
from relay.ingest.moderation import Moderation
from relay.ingest.records import RecordApi
from relay.metrics import Metrics
from relay.server.app import RelayServer
from relay.store.reads import ReadPool
from relay.store.store import Store
from relay.sync.claims import ShardKeeper
from relay.sync.scheduler import Scheduler
from tests.test_layers import read_sources

PARTS = (Node, Store, ReadPool, Ingest, Moderation, RecordApi, RelayServer, Metrics, WriterChannel, ChannelServer,
         FeedFollower, Scheduler, ShardKeeper)
# Same names on other objects: a per-IP record's count of connections (not `RelayServer.connections`).
OTHER_OBJECTS = {"relay/server/ratelimit.py: state.connections"}


def own_attributes(cls: type) -> set[str]:
    """The public attributes `cls` sets on itself (`self.name = ...` in any of its methods, its bases' included)."""
    names: set[str] = set()
    for klass in cls.__mro__[:-1]:
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id == "self" and not node.attr.startswith("_"):
                names.add(node.attr)
    return names


def set_from_outside(sources: dict[str, tuple[str, str]], names: set[str]) -> list[str]:
    """Each `x.name = ...` of one of `names` in `sources` whose `x` is not the object itself nor one it holds
    (`self`, `self.part`), as `path:line: x.name`."""
    found = []
    for path, text in sources.values():
        for node in ast.walk(ast.parse(text, path)):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr in names \
                    and _root(node.value) != "self" and f"{path}: {ast.unparse(node)}" not in OTHER_OBJECTS:
                found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def _root(expr: ast.expr) -> str | None:
    """The name an attribute chain starts from (`self._scrape.store` -> self)."""
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def test_no_module_sets_an_attribute_of_a_built_part():
    """What a part needs is a parameter of its constructor (or of `open`), never an attribute set afterwards."""
    names = set().union(*(own_attributes(cls) for cls in PARTS))
    found = set_from_outside(read_sources(), names)
    assert not found, "attributes of built parts set from outside them:\n" + "\n".join(found)


def test_the_check_sees_a_part_rewired():
    """The check above fails on the rewiring it forbids (a worker's ingest given the channel afterwards)."""
    names = own_attributes(Ingest) | own_attributes(RelayServer)
    rewired = {"relay.worker": ("relay/worker.py", "ingest.sink = channel.submit\nnode.server.routes = None\n")}
    assert set_from_outside(rewired, names) == ["relay/worker.py:1: ingest.sink", "relay/worker.py:2: node.server.routes"]
