"""The transaction hooks a configuration asks for, in the order they run inside each write transaction.

`relay.assembly.open_store` passes them to `Store.open` for every process that
writes (`relay serve`, `relay import`, `relay sync`): derived tables written
without their hook would no longer agree with the events (`relay verify` tells).
"""

from __future__ import annotations

import json

from relay.config import Config, shards_of
from relay.protocol.claims import FLEET_WIDE_FILTER
from relay.protocol.filters import parse_filter
from relay.store.negentropy import DropNegentropyIndex, NegentropyIndex
from relay.store.projectors.engine import ProjectorHook
from relay.store.search import DropSearchIndex, SearchIndex
from relay.store.writes import TransactionHook


def hooks(config: Config, background_builds: bool = False, served: bool = False) -> list[TransactionHook]:
    """The TransactionHooks for `config`: the projectors of `[[projectors]]` (if any), the negentropy index, then
    the search index (NIP-50).

    Each hook's `setup` runs at `Store.open`: a projector that is new or
    changed is built then, which can take a while on a large store, unless
    `background_builds` (`relay serve`) leaves a plain projector's build to
    `background.build_in_background` (relay/store/projectors/build.py), and
    `served` (another process serves the database) leaves a build in progress to it.
    """
    found: list[TransactionHook] = []
    if config.projectors:
        found.append(ProjectorHook(config.projectors, max_refusals=config.store.max_projector_refusals,
                                   rebuild_batch=config.store.projector_rebuild_batch, background=background_builds,
                                   build_batch=config.store.projector_build_batch,
                                   row_tables=config.store.row_change_tables, served=served))
    found.append(negentropy_hook(config))
    found.append(search_hook(config))
    return found


def search_hook(config: Config) -> TransactionHook:
    """The NIP-50 full-text index of `[search] kinds`; with `enabled = false`, its removal."""
    return SearchIndex(config.search.kinds) if config.search.enabled else DropSearchIndex()


def negentropy_hook(config: Config) -> TransactionHook:
    """The NIP-77 index of the full set, of `[negentropy] filters`, and with shards of each shard's filter and
    of the fleet-wide kinds (what peers reconcile shard by shard); with `enabled = false`, its removal."""
    if not config.negentropy.enabled:
        return DropNegentropyIndex()
    # a filter named twice is indexed once (the index keys filters by their spec)
    negentropy = config.negentropy
    filters = [parse_filter(f) for f in negentropy.filters + negentropy.protected_filters]
    if shards := shards_of(config):
        filters += [parse_filter(json.loads(s.filter)) for s in shards] + [FLEET_WIDE_FILTER]
    return NegentropyIndex(filters, private_kinds=config.auth.private_kinds)
