"""Relays peered in a ring or a full mesh converge on one live set, the one NIP-01/09/40 allow, through SIGKILLs
and partitions; a restarted relay takes over the lease of the process it replaces at once.

The harness is tests/sync/mesh.py and tests/sync/mesh_workload.py; the long form is bench/convergence.py; the
two three-event cases of a deleted newest version are in tests/sync/test_deleted_versions.py.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.helpers import Keys, eventually
from tests.sync.mesh import Mesh
from tests.sync.mesh_workload import BASE, model_failures, run

CONVERGE_TIMEOUT = 30.0  # seconds for the nodes of a seeded run to serve the same events
SYNC_TIMEOUT = 15.0  # seconds for two nodes to settle three events
LEASE_TAKEOVER_SECONDS = 10.0  # far below [sync] lease_seconds (60 s)


def _versions(keys: Keys) -> tuple[dict, dict, dict, dict[str, str]]:
    """v1 (created_at T), v2 (T+2) of one kind-0 coordinate, a deletion D naming v2 by id, and their names by id."""
    v1 = keys.sign(0, json.dumps({"name": "v1"}), [], BASE)
    v2 = keys.sign(0, json.dumps({"name": "v2"}), [], BASE + 2)
    deletion = keys.sign(5, "", [["e", v2["id"]]], BASE + 3)
    return v1, v2, deletion, {v1["id"]: "v1", v2["id"]: "v2", deletion["id"]: "D"}


# --- seeded runs ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("seed", "topology", "nodes"), [(1, "ring", 4), (2, "mesh", 3), (4, "mesh", 5)])
async def test_nodes_converge_on_the_model_through_kills_and_partitions(tmp_path, seed, topology, nodes):
    """A seeded workload (versions with equal created_at, deletions of the newest version and by address, before
    and after their targets, expiring events) sent to random nodes while two are SIGKILLed and one is stopped for a
    while: every node ends serving the same events, the model's, with identical projected tables; verify is clean."""
    report = await run(tmp_path, seed, nodes, topology, CONVERGE_TIMEOUT)
    print(report.summary())
    assert report.failures == [], report.summary() + "\n" + "\n".join(report.failures)
    assert (report.ledger.kills, report.ledger.stops) == (2, 1), report.summary()
    assert len(report.ledger.accepted) >= 40, report.summary()  # the nodes were really written to


def test_the_model_names_a_wrong_version_and_a_missing_newest_one(alice):
    """model_failures: after the newest version is deleted, only none is right (its mark stays; refused as
    deleted or accepted first alike), while after an expiring newest one the older one may be right too; with
    nothing deleted, only the newest is right; a served event never accepted is named."""
    v1, v2, deletion, _ = _versions(alice)
    accepted = {e["id"]: e for e in (v1, v2, deletion)}
    assert model_failures({deletion["id"]: deletion}, accepted, time.time()) == []
    [older] = model_failures({e["id"]: e for e in (v1, deletion)}, accepted, time.time())
    assert f"serves ['{v1['id']}'], older than its deleted versions ['{v2['id']}']" in older
    refused = {v2["id"]: (v2, "blocked: this event was deleted")}
    without_v2 = {e["id"]: e for e in (v1, deletion)}
    assert model_failures(without_v2, without_v2, time.time(), refused) == [older]
    expiring = alice.sign(0, json.dumps({"name": "v2"}), [["expiration", str(int(time.time()) + 3600)]], BASE + 2)
    gone = alice.sign(5, "", [["e", expiring["id"]]], BASE + 3)
    assert model_failures({e["id"]: e for e in (v1, gone)}, {e["id"]: e for e in (v1, expiring, gone)},
                          time.time()) == []
    [wrong] = model_failures({e["id"]: e for e in (v2, deletion)}, accepted, time.time())
    assert f"serves ['{v2['id']}'], not none or one of the candidates ['{v1['id']}']" in wrong
    [missing] = model_failures({v1["id"]: v1}, {e["id"]: e for e in (v1, v2)}, time.time())
    assert f"serves ['{v1['id']}'], not the newest candidate {v2['id']}" in missing
    stranger = alice.sign(1, "never published")
    assert len(model_failures({stranger["id"]: stranger}, {}, time.time())) == 2  # not accepted; not expected


# --- the lease after a SIGKILL ----------------------------------------------------------------------------------


async def test_a_relay_restarted_after_sigkill_syncs_without_waiting_for_its_dead_lease(tmp_path, alice):
    """Node A (one configured peer, B; lease_seconds 60) is SIGKILLed while it syncs, so its lease stays in the
    database; restarted, it reconciles with B within seconds and serves what B got meanwhile."""
    settings = {"sync": {"interval_seconds": 1.0, "lease_seconds": 60.0}}
    async with Mesh(tmp_path, [[1], []], settings) as mesh:
        a = mesh.nodes[0]

        def reconciled() -> int:
            return sum(entry.get("event") == "sync_reconciled" for entry in a.log_events())

        assert await eventually(reconciled, SYNC_TIMEOUT), a.log_events()[-5:]
        assert a.status()["peers"][0]["lease_owner"] is not None
        await mesh.kill(0)
        meanwhile = alice.sign(content="published to B while A was down")
        assert (await mesh.publish(1, meanwhile))[2] is True
        before = reconciled()
        started = time.monotonic()
        mesh.start(0)
        assert await eventually(lambda: reconciled() > before, LEASE_TAKEOVER_SECONDS), \
            [e.get("reason") or e["event"] for e in a.log_events() if e.get("event", "").startswith("sync_")][-2:]
        assert meanwhile["id"] in await mesh.served(0)
        assert time.monotonic() - started < LEASE_TAKEOVER_SECONDS
