"""`relay shards`: the fleet's coverage claims (kind 30803) this database holds, as a table or JSON, read-only."""

from __future__ import annotations

import json
import time
from contextlib import closing

from relay.commands import open_readonly, utc_time
from relay.config import Config, fleet_pubkeys
from relay.status import duration
from relay.sync.claims import claim_dict, read_claims, read_instance

HEADER = ("shard", "status", "since", "until", "age", "expires", "node", "counted", "url")


def run_shards(config: Config, as_json: bool) -> int:
    """`relay shards [--json]`: every live claim stored here, by shard then node; exit 0, 2 (one line) when there
    is no relay database at `store.path`.

    JSON: `{"claims": [{"shard", "pubkey", "url", "instance", "status", "since", "until", "age_seconds",
    "expires_in_seconds", "id", "counted", "this_node"}]}` (times in unix seconds): `counted` when the pubkey is
    one of the fleet's (`[sharding] fleet_pubkeys`, else the peers'), `this_node` when the claim names this
    database's instance.  Else a tab-separated table with the header `HEADER`, times in UTC.
    """
    conn = open_readonly(config.store.path, "shards")
    if conn is None:
        return 2
    now = int(time.time())
    with closing(conn):
        claims, instance = read_claims(conn), read_instance(conn)
    fleet = fleet_pubkeys(config)
    rows = [{**claim_dict(c, now), "counted": c.pubkey in fleet,
             "this_node": c.instance == instance} for c in sorted(claims, key=lambda c: (c.shard_id, c.pubkey))]
    if as_json:
        print(json.dumps({"claims": rows}))
        return 0
    print("\t".join(HEADER))
    for r in rows:
        node = "this node" if r["this_node"] else r["pubkey"]
        print("\t".join((r["shard"], r["status"], utc_time(r["since"], "-"), utc_time(r["until"], "-"),
                         duration(r["age_seconds"]), duration(r["expires_in_seconds"]), node,
                         "yes" if r["counted"] else "no", r["url"])))
    return 0


