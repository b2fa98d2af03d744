"""`[[shards]]`, `[sharding]` and projectors' `shard_id` (relay/config.py): what loads, and each refusal naming
its key (README, "Shards")."""

from __future__ import annotations

import pytest

from relay.config import ConfigError, ShardConfig, fleet_pubkeys, load_config, shards_of
from relay.store.projectors.spec import ProjectorSpec, spec_hash

PEER = "b" * 64


def _load(tmp_path, text: str):
    path = tmp_path / "relay.toml"
    path.write_text(text)
    return load_config(path)


def test_shards_load_with_their_filters_as_compact_json(tmp_path):
    """Each table's filter as compact JSON with sorted keys (the claim's `filter` tag); `hold` defaults to true;
    `{}` is an archive node's shard."""
    config = _load(tmp_path, '[[shards]]\nid = "all"\nfilter = {}\n'
                             '[[shards]]\nid = "tagged-notes"\nfilter = {"#t" = ["nostr"], kinds = [1, 1111]}\n'
                             'hold = false\n')
    assert shards_of(config) == (ShardConfig("all", "{}"),
                                 ShardConfig("tagged-notes", '{"#t":["nostr"],"kinds":[1,1111]}', hold=False))


@pytest.mark.parametrize("table, message", [
    ('id = "a"\nfilter = {kinds = [0], "#t" = ["x"]}', "tags are allowed only with kinds that are all regular"),
    ('id = "a"\nfilter = {kinds = [1, 30023], "#t" = ["x"]}', "tags are allowed only with kinds that are all regular"),
    ('id = "a"\nfilter = {"#t" = ["x"]}', "tags are allowed only with kinds that are all regular"),
    ('id = "a"\nfilter = {kinds = [1], since = 5}', "shards[0].filter.since: a shard's filter has kinds, authors"),
    ('id = "a"\nfilter = {kinds = [1], limit = 5}', "shards[0].filter.limit: a shard's filter has kinds, authors"),
    ('id = "a"\nfilter = {search = "x"}', "shards[0].filter.search: a shard's filter has kinds, authors"),
    ('id = "a"\nfilter = {ids = ["' + "a" * 64 + '"]}', "shards[0].filter.ids: a shard's filter has kinds, authors"),
    ('id = "a"\nfilter = {kinds = []}', "shards[0].filter: matches no event"),
    ('id = "a"\nfilter = {kinds = ["1"]}', "shards[0].filter:"),
    ('id = "a"\nfilter = 5', "shards[0].filter: must be a table"),
    ('id = "a"', "shards[0].filter: missing"),
    ('filter = {}', "shards[0].id: missing"),
    ('id = "a"\nfilter = {kinds = [20001], "#t" = ["x"]}', "shards[0].filter.kinds: [20001] are ephemeral kinds"),
    ('id = "a"\nfilter = {kinds = [1, 25000]}', "shards[0].filter.kinds: [25000] are ephemeral kinds"),
    ('id = "a"\nfilter = {kinds = [5]}', "shards[0].filter.kinds: kinds [5, 62, 30803] are fleet-wide"),
    ('id = "a"\nfilter = {kinds = [30803, 62]}', "shards[0].filter.kinds: kinds [5, 62, 30803] are fleet-wide"),
    ('id = "a b"\nfilter = {}', "shards[0].id: 1 to 64 letters"),
    ('id = ""\nfilter = {}', "shards[0].id: 1 to 64 letters"),
    ("id = 5\nfilter = {}", "shards[0].id: 1 to 64 letters"),
    ('id = "a"\nfilter = {}\nhold = "yes"', "shards[0].hold: expected true or false"),
    ('id = "a"\nfilter = {}\nowner = "me"', "shards[0].owner: unknown key"),
])
def test_a_bad_shard_is_refused_naming_its_key(tmp_path, table, message):
    """A shard keeps every version of a coordinate together: tags only with regular kinds; its filter has no
    time range, limit, search or ids; an id is a short name; unknown keys are refused."""
    with pytest.raises(ConfigError) as refused:
        _load(tmp_path, f"[[shards]]\n{table}\n")
    assert message in str(refused.value)


def test_a_shard_id_is_declared_once(tmp_path):
    with pytest.raises(ConfigError, match="shards\\[1\\].id: a is declared twice"):
        _load(tmp_path, '[[shards]]\nid = "a"\nfilter = {}\n[[shards]]\nid = "a"\nfilter = {kinds = [1]}\n')


PROJECTOR = """
[[projectors]]
table = "notes"
kind = 1
shard_id = "{shard}"
primary_key = ["id"]
fields = [{{ name = "id", type = "TEXT", source = "id" }}]
"""


def test_a_projector_shard_id_declares_the_shard_of_its_kind(tmp_path):
    """A projector's `shard_id` is a held shard of its kind; naming a `[[shards]]` table of that filter is the
    same shard; of another filter, refused."""
    config = _load(tmp_path, PROJECTOR.format(shard="notes"))
    assert shards_of(config) == (ShardConfig("notes", '{"kinds":[1]}'),)
    same = _load(tmp_path, PROJECTOR.format(shard="n") + '[[shards]]\nid = "n"\nfilter = {kinds = [1]}\n')
    assert shards_of(same) == (ShardConfig("n", '{"kinds":[1]}'),)
    with pytest.raises(ConfigError, match='notes.shard_id: n is the shard of {"kinds":\\[7\\]}, not of kind 1'):
        _load(tmp_path, PROJECTOR.format(shard="n") + '[[shards]]\nid = "n"\nfilter = {kinds = [7]}\n')


def test_a_shard_id_changes_no_projected_row():
    """`shard_id` is left out of the spec's hash: declaring it rebuilds no table."""
    fields = [{"name": "id", "type": "TEXT", "source": "id"}]
    plain = ProjectorSpec.from_dict({"table": "notes", "kind": 1, "primary_key": ["id"], "fields": fields})
    sharded = ProjectorSpec.from_dict({"table": "notes", "kind": 1, "primary_key": ["id"], "fields": fields,
                                       "shard_id": "notes"})
    assert sharded.shard_id == "notes" and spec_hash(plain) == spec_hash(sharded)


def test_sharding_defaults_follow_the_peers_and_the_interval(tmp_path):
    """`fleet_pubkeys` defaults to the pubkeys of `[[sync.peers]]`; `claim_ttl_seconds` 0 to 3 x the interval."""
    config = _load(tmp_path, f'[sharding]\nclaim_interval_seconds = 10\n[[sync.peers]]\nurl = "ws://127.0.0.1:9"\n'
                             f'pubkey = "{PEER}"\n[[sync.peers]]\nurl = "ws://127.0.0.1:8"\n')
    assert fleet_pubkeys(config) == {PEER} and config.sharding.ttl_seconds() == 30
    listed = _load(tmp_path, f'[sharding]\nfleet_pubkeys = ["{"c" * 64}"]\nclaim_interval_seconds = 5\nclaim_ttl_seconds = 7\n'
                             f'[[sync.peers]]\nurl = "ws://127.0.0.1:9"\npubkey = "{PEER}"\n')
    assert fleet_pubkeys(listed) == {"c" * 64} and listed.sharding.ttl_seconds() == 7
    with pytest.raises(ConfigError, match="sharding.fleet_pubkeys"):
        _load(tmp_path, '[sharding]\nfleet_pubkeys = ["not hex"]\n')


@pytest.mark.parametrize("section, message", [
    ("claim_interval_seconds = 300\nclaim_ttl_seconds = 1", "sharding.claim_ttl_seconds: must be 0"),
    ("min_copies = 99999999999999999999999", "sharding.min_copies"),
    ("min_copies = 65", "sharding.min_copies"),
])
def test_sharding_values_that_could_never_work_are_refused(tmp_path, section, message):
    """A claim that lapses before the next one is published, or more copies than a fleet could confirm: refused at
    load, not left to show as a shard nobody holds."""
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, f"[sharding]\n{section}\n")


def test_a_peer_filter_that_is_not_json_says_so(tmp_path):
    with pytest.raises(ConfigError, match="sync.peers\\[0\\].filter: not a JSON object .* at character 2"):
        _load(tmp_path, '[[sync.peers]]\nurl = "ws://127.0.0.1:9"\nfilter = "{"\n')
