"""SIGKILL at random moments while several connections publish: after every restart no acknowledged event
is lost, the live set follows NIP-01/09, and `relay verify` and `PRAGMA integrity_check` pass; with
`relay serve --workers 2` a random worker and the writer are killed in turn (issue 16)
(the harness and its checks: tests/reliability/harness.py; the long form: bench/crash.py)."""

from __future__ import annotations

import random

import pytest

from tests.reliability.harness import Workload, check_relay, run


@pytest.mark.parametrize("workers, kills", [(0, 20), (2, 6)], ids=["one-process", "2-workers"])
async def test_sigkill_at_random_moments_loses_no_acknowledged_event(tmp_path, workers, kills):
    """Kills (some during start-up; with workers, of a worker then of the writer after each start) of a relay
    under concurrent publishing; every check after a kill passes, and both kinds of process were killed."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")  # shown by pytest if `run` raises rather than reports a failure
    report = await run(tmp_path, kills=kills, seed=seed, workers=workers)
    context = f"seed {seed}, {workers} workers: {report.summary()}"
    assert report.failures == [], f"{context}\n" + "\n".join(report.failures)
    assert report.kills == kills, context
    assert report.checks == kills - report.startup_kills + 1, context
    assert report.acked >= 10 * (kills - report.startup_kills), context  # the relay was really written to
    assert "error" not in report.refused and "invalid" not in report.refused, context
    if workers:
        assert report.worker_kills >= 1 and report.kills - report.worker_kills >= 1, context


async def test_the_check_finds_a_lost_and_a_phantom_event(relay, client):
    """The harness's check passes on what was acknowledged, and names an acked event not served and one never sent."""
    workload = Workload(1, real=[])
    keys = workload.keys[0]
    kept, lost, phantom = (keys.sign(1, content) for content in ("kept", "lost", "phantom"))
    assert (await client.publish(kept))[2] is True
    workload.sent[kept["id"]] = workload.acked[kept["id"]] = kept
    assert await check_relay(relay.url, relay.config, workload) == (1, [])

    workload.sent[lost["id"]] = workload.acked[lost["id"]] = lost  # "acknowledged" but never stored
    assert (await client.publish(phantom))[2] is True  # stored but not in the ledger
    served, failures = await check_relay(relay.url, relay.config, workload)
    assert served == 2
    assert len(failures) == 2, failures
    assert failures[0].startswith(f"served 1 events never sent as such, e.g. ['{phantom['id']}']")
    assert failures[1].startswith(f"lost 1 acknowledged events, e.g. [('{lost['id']}', 1)]")


def test_an_identical_event_signed_again_is_sent_with_its_first_signature():
    """Regression (seed 819098967): two "not json" kind-0 events of one author at one created_at have one id and
    two signatures; the second must not replace the first in `sent`, or the stored first copy looks phantom."""
    workload = Workload(1, real=[])
    keys = workload.keys[0]
    first, again = (keys.sign(0, "not json", [], workload.base) for _ in range(2))
    assert first["id"] == again["id"] and first["sig"] != again["sig"]
    assert workload.record(first) is first
    assert workload.record(again) is first
    assert workload.sent[first["id"]]["sig"] == first["sig"]
