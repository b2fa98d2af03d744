"""Records, the writing side: a row of a declared projector is signed into an event and taken through ingest.

How this works.  `put_record` encodes the row (relay/store/projectors/encode.py: the unsigned event whose
projection is exactly that row, refused naming the field otherwise), reserves the event's `created_at` for its
coordinate on the writer (relay/store/clock.py: strictly later than anything the store has seen there, in a
committed row, so two processes never sign one value), signs it with the node key or the key given
(relay/keys.py), and submits it through the ONE ingest path as `RECORD` (validated, stored, projected, fanned
out, pushed to peers like any event).  `delete_record` does the same for a NIP-09 kind-5 event: an `a` tag for
a replaceable or addressable row (its coordinate's clock too, so a later put is newer than the deletion and
re-creates the row), an `e` tag for a regular one.  Both return the signed event and its `Outcome`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import structlog

from relay.config import Config
from relay.ingest.outcome import Outcome
from relay.ingest.pipeline import Ingest
from relay.ingest.source import RECORD
from relay.keys import NodeKey, key_path, load_or_create
from relay.protocol.event import is_addressable, is_hex64, is_replaceable
from relay.protocol.rejection import Rejection
from relay.store import clock
from relay.store.batch import DELETION_KIND, Coordinate
from relay.store.projectors.encode import RowRefused, encode
from relay.store.projectors.spec import ProjectorSpec, column_identity
from relay.store.records import Records, has_row
from relay.store.store import Store

FUTURE_MARGIN_SECONDS = 60
"""A reserved created_at stays this far inside `limits.max_created_at_future_seconds` (clocks of peers differ)."""

Row = Mapping[str, object]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Written:
    """What a put or a delete did: the signed `event` (a NIP-01 JSON-ready dict) and its `outcome` (the OK)."""

    event: dict[str, Any]
    outcome: Outcome


class RecordApi(Records):
    """Reading (`Records`: get_record, query_records) and writing (put_record, delete_record) rows of a store's
    declared projectors: the Python API of records (`Node.records`).

    `key()` gives the node key (read or created on first use); `max_future_seconds` is
    `limits.max_created_at_future_seconds`; `max_message_bytes` is `limits.max_message_bytes`, which the
    `["EVENT", event]` message of a record must fit in, as a client's must (else no client could read it).
    """

    def __init__(self, store: Store, specs: Iterable[object], ingest: Ingest, key: Callable[[], NodeKey],
                 max_future_seconds: int, max_message_bytes: int = 1_048_576) -> None:
        specs = list(specs)
        super().__init__(store, specs)
        self.ingest = ingest
        self.specs = {s.table: s for s in specs if isinstance(s, ProjectorSpec)}
        self._key = key
        self._node_key: NodeKey | None = None
        self.max_future_seconds = max_future_seconds
        self.max_message_bytes = max_message_bytes

    @classmethod
    def from_config(cls, config: Config, store: Store, ingest: Ingest) -> RecordApi:
        """The records of `config`'s projectors, signed with the node key (`[sync] secret_key_file`)."""
        path = key_path(config.sync.secret_key_file, config.store.path)
        return cls(store, config.projectors, ingest, lambda: load_or_create(path),
                   config.limits.max_created_at_future_seconds, config.limits.max_message_bytes)

    @property
    def node_key(self) -> NodeKey:
        """The node key, read (or created) on first use.

        Raises:
            NodeKeyError: the key file cannot be created or read.
        """
        if self._node_key is None:
            self._node_key = self._key()
        return self._node_key

    async def put_record(self, table: str, row: Row | Sequence[Row], key: NodeKey | None = None,
                         created_at: int | None = None, extra_tags: Sequence[Sequence[str]] = (),
                         expiration: int | None = None, wait: bool = True) -> Written:
        """Sign `row` of `table` into an event (by `key`, default the node key) and submit it through ingest.

        `row`: column -> value; for a `row_per_tag` table, the key's whole list of rows (one tag each; removing
        a row is a put of the others).  `created_at` (unix seconds; None: reserved per coordinate, see module
        docstring); `extra_tags` are added as given; `expiration` adds a NIP-40 `expiration` tag.  When the
        reserved created_at would pass `now + limits.max_created_at_future_seconds - 60` (writes to one
        coordinate faster than one a second), waits until it fits (logging `record_clock_wait` once), or with
        `wait=False` raises.  An event whose `["EVENT", event]` message exceeds `max_message_bytes` is refused
        (`Outcome` "invalid:"), as ingest's event limits refuse it (tags, content).

        Raises:
            RecordQueryError: ("table") not a declared projector's table.
            RowRefused: the row is not the projection of any event; names the field.
            Rejection: "rate-limited: ..." with `wait=False` (see above); "invalid: ..." for a `created_at`
            further ahead than `limits.max_created_at_future_seconds` (nothing is reserved then).
        """
        spec = self._spec(table)
        signer = key or self.node_key
        tags = [*extra_tags, *([["expiration", str(expiration)]] if expiration is not None else [])]
        unsigned = encode(spec, row, signer.pubkey, created_at, tags)
        coordinate = _coordinate(spec, unsigned.tags, signer.pubkey)
        when = await self._created_at(coordinate, created_at, wait)
        return await self._submit(signer.sign_event(unsigned.kind, unsigned.tags, unsigned.content, when))

    async def delete_record(self, table: str, key: NodeKey | None = None, pk: Row | None = None,
                            event_id: str | None = None, reason: str = "", wait: bool = True) -> Written:
        """Delete a row of `table` signed by `key` (default the node key) with a NIP-09 kind-5 event whose content
        is `reason`: by `pk` (the columns of the event's key: pubkey, and d for an addressable kind, which get an
        `a` tag; the event id for a regular kind, an `e` tag), or by `event_id` (64 hex, an `e` tag).  When no
        row of `table` matches, nothing is submitted: the outcome is "invalid: no such row ...".

        Raises:
            RecordQueryError: ("table") not a declared projector's table.
            RowRefused: ("pk") neither or both of pk and event_id; a key column missing, extra, or of another
            signer (a deletion only removes its signer's events, NIP-09).
            Rejection: "rate-limited: ..." with `wait=False` (see `put_record`).
        """
        spec = self._spec(table)
        signer = key or self.node_key
        if (pk is None) == (event_id is None):
            raise RowRefused("pk", "give either pk (the row's key) or event_id")
        coordinate = None
        if event_id is not None:
            if not is_hex64(event_id):
                raise RowRefused("event_id", f"expected 64 lowercase hex, got {event_id!r}")
            target, match = ["e", event_id], {"_event_id": event_id}
        else:
            target, coordinate = _target(spec, pk, signer.pubkey)
            match = {column: pk[column] for column in spec.class_key_columns()}
        tags = [target, ["k", str(spec.kind)]]
        if not await self.store.read_snapshot(has_row, spec.table, match):  # a kind-5 would delete nothing
            event = signer.sign_event(DELETION_KIND, tags, reason, int(time.time()))
            return Written(event, Outcome(False, "invalid", f"no such row of {spec.table}: nothing to delete"))
        when = await self._created_at(coordinate, None, wait)
        return await self._submit(signer.sign_event(DELETION_KIND, tags, reason, when))

    def _spec(self, table: str) -> ProjectorSpec:
        self.view(table)  # RecordQueryError("table") naming the tables
        return self.specs[table]

    async def _created_at(self, coordinate: Coordinate | None, requested: int | None, wait: bool) -> int:
        """`requested` (checked against the future limit); else now, or for a coordinate the value reserved for it.

        A requested value is not noted in `record_clock`: once ingest stores it, the coordinate's high-water mark
        holds it, and a value ingest refuses must not move the clock (later puts would wait behind it)."""
        if requested is not None:
            if requested > int(time.time()) + self.max_future_seconds:
                raise Rejection("invalid", f"created_at {requested} is too far in the future (at most "
                                           f"{self.max_future_seconds} s ahead, limits.max_created_at_future_seconds)")
            return requested
        if coordinate is None:  # regular: keyed on the event id, nothing to order
            return int(time.time())
        margin = max(self.max_future_seconds - FUTURE_MARGIN_SECONDS, 0)
        told = False
        while True:
            now = int(time.time())
            value = await self.ingest.writer.run_job(clock.reserve, coordinate, now, now + margin)
            if value <= now + margin:
                return value
            if not wait:
                raise Rejection("rate-limited", f"created_at {value} of this coordinate would be more than "
                                                f"{margin} s ahead: write it less often")
            if not told:  # once: a silent wait looks like a hang
                told = True
                log.warning("record_clock_wait", created_at=value, seconds=value - now - margin,
                            reason="writes to this coordinate ran ahead of the clock (more than one a second)")
            await asyncio.sleep(value - now - margin)

    async def _submit(self, event: dict[str, Any]) -> Written:
        size = len(orjson.dumps(["EVENT", event]))
        if size > self.max_message_bytes:  # what no client could have sent, none could read in a REQ either
            return Written(event, Outcome(False, "invalid", f"event too large: its EVENT message is {size} bytes "
                                                            f"(limits.max_message_bytes: {self.max_message_bytes})"))
        [(outcome, _)] = await self.ingest.accept_many([event], RECORD)
        return Written(event, outcome)


def _coordinate(spec: ProjectorSpec, tags: list[list[str]], pubkey: str) -> Coordinate | None:
    """(kind, pubkey, d) of a replaceable or addressable kind's event with `tags`, else None (NIP-01)."""
    if is_replaceable(spec.kind):
        return (spec.kind, bytes.fromhex(pubkey), "")
    if is_addressable(spec.kind):
        d = next((t[1] for t in tags if len(t) > 1 and t[0] == "d"), "")
        return (spec.kind, bytes.fromhex(pubkey), d)
    return None


def _target(spec: ProjectorSpec, pk: Row, pubkey: str) -> tuple[list[str], Coordinate | None]:
    """The kind-5 tag deleting the event behind key `pk` (its class key's columns), and its coordinate."""
    columns = spec.class_key_columns()
    for column in pk:
        if column not in columns:
            raise RowRefused(column, f"not a column of the event's key (key: {', '.join(columns)}; to remove one row "
                                     "of several, put the others)")
    values = {}
    for column in columns:
        if type(pk.get(column)) is not str:
            raise RowRefused(column, f"missing: the event's key of {spec.table} is {', '.join(columns)}")
        values[column_identity(spec, column)] = pk[column]
    if "id" in values:
        if not is_hex64(values["id"]):
            raise RowRefused(columns[0], f"expected an event id (64 lowercase hex), got {values['id']!r}")
        return ["e", values["id"]], None
    if values["pubkey"] != pubkey:
        raise RowRefused(columns[0], "a deletion removes only its signer's events (NIP-09): sign with that key")
    coordinate = _coordinate(spec, [["d", values.get("tag:d", "")]], pubkey)
    return ["a", f"{spec.kind}:{pubkey}:{coordinate[2]}"], coordinate


__all__ = ["FUTURE_MARGIN_SECONDS", "RecordApi", "Written"]
