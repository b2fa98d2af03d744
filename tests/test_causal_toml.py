"""Causal projectors declared in TOML ([[causal_projectors]]) through `relay serve`, `status`, `projectors list`
and `verify`, as real subprocesses; the apply function lives in a test module (tests/causal_app.py)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

from relay.config import load_config
from tests.causal_app import TOML
from tests.helpers import Client, Keys
from tests.served import Served, clean_env, free_port, relay_cli
from tests.store.projectors.common import dumps

REPO = Path(__file__).resolve().parents[1]
KIND = 4242


def _env() -> dict:
    return clean_env(PYTHONPATH=str(REPO))  # `tests.causal_app` importable wherever the relay runs


def _ops() -> list[dict]:
    """Operations of two authors' logs: a chain, a fork at seq 2 (with a branch on it), and a backdated operation
    at seq 2 too, which is held whatever its id."""
    now = int(time.time()) - 1000
    out = []
    for keys in (Keys(0xA11CE), Keys(0xB0B)):
        for log in ("doc", "notes"):
            prev, chain = None, []
            for seq in range(4):
                tags = [["log", log], ["seq", str(seq)]] + ([["prev", prev]] if prev else [])
                op = keys.sign(KIND, json.dumps({"key": f"k{seq % 2}", "value": f"{log}{seq}"}), tags, now + seq)
                chain.append(op)
                prev = op["id"]
            fork = keys.sign(KIND, json.dumps({"key": "k1", "value": "fork"}),
                             [["log", log], ["seq", "2"], ["prev", chain[1]["id"]]], now + 2)
            on_fork = keys.sign(KIND, json.dumps({"key": "k0", "value": "after fork"}),
                                [["log", log], ["seq", "3"], ["prev", fork["id"]]], now + 3)
            backdated = keys.sign(KIND, json.dumps({"key": "k0", "value": "late"}),
                                  [["log", log], ["seq", "2"], ["prev", chain[1]["id"]]], now - 5)
            out += chain + [fork, on_fork, backdated]
    return out


async def _publish(url: str, events: list[dict]) -> None:
    client = await Client.connect(url)
    try:
        for event in events:
            reply = await client.publish(event)
            assert reply[2] is True, reply
    finally:
        await client.close()


def test_toml_causal_projector_converges_on_two_served_nodes_and_is_covered_by_the_cli(tmp_path):
    """Ops in two shuffled orders to two `relay serve`s: equal tables; status, projectors list and verify agree."""
    config_file = tmp_path / "relay.toml"
    config_file.write_text(TOML.format(revision=1), encoding="utf-8")
    ops = _ops()
    dbs = []
    for name, seed in (("a", 1), ("b", 2)):
        db, port = tmp_path / f"{name}.db", free_port()
        order = ops[:]
        random.Random(seed).shuffle(order)
        with Served(tmp_path, "--config", config_file, "--db", db, "--port", port, env=_env()) as served:
            served.wait_health(port)
            asyncio.run(_publish(f"ws://127.0.0.1:{port}", order))
            assert served.stop() == 0
        dbs.append(db)
    specs = [s for s in load_config(config_file).projectors if s.name == "docs"]
    tables = dumps(dbs[0], specs)
    assert tables == dumps(dbs[1], specs)
    assert tables["doc_history"].count(b"\n") == 2 * 2 * 4  # each log's chain of 4, whichever branch won
    for db in dbs:
        verify = relay_cli("verify", "--config", config_file, "--db", db, env=_env())
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert "docs.doc_values: ok" in verify.stdout and "docs.causal_ops: ok" in verify.stdout
        listing = relay_cli("projectors", "list", "--config", config_file, "--db", db, env=_env())
        assert listing.returncode == 0, listing.stderr
        docs = next(line.split() for line in listing.stdout.splitlines() if line.startswith("docs "))
        assert docs[1:4] == [str(KIND), "1", "current"] and docs[-1] == "doc_values,doc_history"
        status = relay_cli("status", "--json", "--config", config_file, "--db", db, env=_env())
        assert status.returncode == 0, status.stderr
        entry = next(p for p in json.loads(status.stdout)["projectors"] if p["name"] == "docs")
        assert entry["state"] == "current" and entry["tables"] == ["doc_values", "doc_history"]
        refusals = relay_cli("projectors", "refusals", "--projector", "docs", "--config", config_file, "--db", db,
                             env=_env()).stdout
        assert refusals.count("held: backdated") == 4 and refusals.count("lost the fork") == 4


def test_a_causal_projector_that_cannot_load_stops_serve_naming_the_key(tmp_path):
    """An apply that cannot be imported, or an unknown key: `relay serve` exits 2 naming the key."""
    config_file = tmp_path / "relay.toml"
    for text, named in ((TOML.format(revision=1).replace("tests.causal_app:apply", "tests.no_such:apply"),
                         "causal_projectors[0].apply: cannot load 'tests.no_such:apply'"),
                        (TOML.format(revision=1) + "colour = 1\n", "causal_projectors[0].tables[1].colour: unknown key"),
                        (TOML.format(revision=1).replace('type = "TEXT"', 'type = "BLOB"', 1),
                         "causal_projectors[0].tables[0].columns[0].type: must be one of")):
        config_file.write_text(text, encoding="utf-8")
        proc = relay_cli("serve", "--config", config_file, "--db", tmp_path / "r.db", "--port", free_port(),
                         env=_env())
        assert proc.returncode == 2 and named in proc.stderr, proc.stderr
