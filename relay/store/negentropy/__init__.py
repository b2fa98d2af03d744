"""The NIP-77 negentropy index in SQLite: (created_at, id) of the live events, kept in the write transaction.

How this works
--------------
For the full event set (filter `{}`) and for each filter configured under
`[negentropy] filters`, the index keeps the (created_at, id) of the matching
events in `neg_nodes` rows (migrations 0002 and 0005) that form a two-level
B+-tree with per-node counts and id sums, so that a fingerprint of any range
costs far less than reading every item in it.  The parts, by seam:

* index.py: `NegentropyIndex`, the transaction hook that decides which
  filters are indexed, builds their trees at setup and feeds each write
  transaction's changes to them;
* tree.py: the nodes of one filter and the writer that keeps them in step,
  inside the write transaction;
* reader.py: serving a NEG-OPEN from the index (`IndexReader`, `IndexView`,
  `reconcile_from_index`), or from a query for a filter no index serves
  (`query_vector`);
* verify.py: `relay verify`, the index recomputed from `events` and compared.

Source: NIP-77 and its appendix "Negentropy Protocol V1" (fingerprints:
the sum of the ids mod 2^256, which the nodes' id sums add up to).
"""

from relay.store.negentropy.index import (
    FULL_SET_SPEC,
    DropNegentropyIndex,
    NegentropyIndex,
    filter_spec,
    public_spec,
)
from relay.store.negentropy.reader import (
    GroupCache,
    IndexOutOfStep,
    IndexReader,
    IndexView,
    query_vector,
    reconcile_from_index,
    window_segments,
)
from relay.store.negentropy.tree import MAX_CHILDREN, SENTINEL, Key, build_nodes, update_items
from relay.store.negentropy.verify import IndexCheck, check_nodes, indexed_items, recompute, verify_index

__all__ = [
    "FULL_SET_SPEC",
    "MAX_CHILDREN",
    "SENTINEL",
    "DropNegentropyIndex",
    "GroupCache",
    "IndexCheck",
    "IndexOutOfStep",
    "IndexReader",
    "IndexView",
    "Key",
    "NegentropyIndex",
    "build_nodes",
    "check_nodes",
    "filter_spec",
    "indexed_items",
    "public_spec",
    "query_vector",
    "reconcile_from_index",
    "recompute",
    "update_items",
    "verify_index",
    "window_segments",
]
