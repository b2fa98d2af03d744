"""`relay sync`: the NIP-77 client against nostr-sdk's LocalRelay, our own relay, and scripted relays.

The library entry point (`sync_once`) and the CLI (`python -m relay sync`, a
subprocess) both run against real relays on loopback: nostr-sdk's LocalRelay
(an independent NIP-77 implementation), a second instance of our relay, and
small scripted relays for the cases a real relay will not produce on demand
(no NIP-77, chosen OK refusals, NIP-42 AUTH required or refused).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections import Counter

import nostr_sdk as sdk
import pytest

from relay.commands.sync import sync_once
from relay.sync.peer import PeerError
from relay.sync.scheduler import sync_options
from relay.sync.session import ERROR, GONE_LOCALLY, MISSING, SETTLED, STORED, SyncReport, classify, push_chunk
from relay.sync.state import read_states
from tests.helpers import Keys
from tests.inprocess import Relay
from tests.served import free_port, relay_cli_async
from tests.sync.conftest import (
    local_config,
    notes,
    publish,
    remote_ids,
    seed,
    speaks_nip77,
    stored,
)
from tests.sync.scripted import ScriptedRelay

NOW = int(time.time())


def split_sets(keys: Keys, size: int = 400) -> tuple[list[dict], list[dict], list[dict]]:
    """(only remote, only local, both): three disjoint sets of notes with interleaved timestamps."""
    events = notes(keys, 3 * size, NOW - 100_000)
    return events[0::3], events[1::3], events[2::3]


# --- LocalRelay (nostr-sdk) ----------------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["down", "up", "both"])
async def test_sync_converges_with_localrelay(tmp_path, local_relay, alice, direction):
    """Against LocalRelay, with small frames (several rounds): exactly the differing ids move in `direction`."""
    url = await local_relay()
    remote_only, local_only, common = split_sets(alice)
    await publish(url, remote_only + common)
    config = local_config(tmp_path)
    await seed(config, local_only + common)

    report = await sync_once(config, url, {}, sync_options(config, direction, frame_size_limit=4096))

    assert report.rounds > 1
    assert (report.have, report.need) == (len(local_only), len(remote_only))
    assert report.fetched == (len(remote_only) if direction != "up" else 0)
    assert report.pushed == (len(local_only) if direction != "down" else 0)
    assert not report.errors and not report.settled
    everything = {e["id"] for e in remote_only + local_only + common}
    here, there = stored(config), await remote_ids(url)
    assert set(here) == (everything if direction != "up" else {e["id"] for e in local_only + common})
    assert there == (everything if direction != "down" else {e["id"] for e in remote_only + common})
    assert {i for i, origin in here.items() if origin == url} == (
        {e["id"] for e in remote_only} if direction != "up" else set())
    again = await sync_once(config, url, {}, sync_options(config, "both"))
    if direction == "both":
        assert (again.have, again.need, again.fetched, again.pushed) == (0, 0, 0, 0)


async def test_fetch_asks_again_when_the_peer_serves_part_of_a_batch(tmp_path, local_relay, alice):
    """LocalRelay serves at most 500 events per REQ: with 1,000 ids per REQ the rest is asked for again, none lost."""
    url = await local_relay()
    remote = notes(alice, 1200, NOW - 5000)
    await publish(url, remote)
    config = local_config(tmp_path, sync={"fetch_batch": 1000})
    report = await sync_once(config, url, {}, sync_options(config, "down"))
    assert (report.need, report.fetched, report.settled) == (1200, 1200, {})
    assert set(stored(config)) == {e["id"] for e in remote}


async def test_sync_cli_with_filter_against_localrelay(tmp_path, local_relay, alice, bob):
    """`relay sync URL --filter` (subprocess): only matching events move, both ways; summary on stdout, exit 0."""
    url = await local_relay()
    remote_notes, local_notes = notes(alice, 30, NOW - 500), notes(bob, 20, NOW - 400)
    remote_other, local_other = notes(alice, 5, NOW - 300, kind=7), notes(bob, 5, NOW - 200, kind=7)
    await publish(url, remote_notes + remote_other)
    config = local_config(tmp_path)
    await seed(config, local_notes + local_other)

    code, out, err = await relay_cli_async("sync", url, "--db", config.store.path, "--filter", '{"kinds":[1]}',
                                     "--frame-size", 4096)

    assert code == 0, err
    assert out.splitlines()[0].startswith(f"sync {url} (both): have 20, need 30, fetched 30, pushed 20, "
                                          "settled 0, errors 0"), out
    assert set(stored(config)) == {e["id"] for e in remote_notes + local_notes + local_other}
    assert await remote_ids(url) == {e["id"] for e in remote_notes + remote_other + local_notes}
    code, out, _ = await relay_cli_async("status", "--db", config.store.path, "--json")
    assert code == 0
    status = json.loads(out)
    [peer] = status["peers"]
    assert (peer["url"], peer["events_in"], peer["events_out"], peer["configured"]) == (url, 30, 20, False)
    assert peer["last_success"] is not None and peer["lease_owner"] is None
    assert status["events"]["by_kind"] == {"1": 50, "7": 5}


async def test_sync_authenticates_to_localrelay_requiring_nip42(tmp_path, local_relay, alice):
    """LocalRelay with NIP-42 for reads and writes: the client answers AUTH with the node key and converges."""
    url = await local_relay(nip42=sdk.LocalRelayBuilderNip42Mode.BOTH)
    config = local_config(tmp_path)
    await seed(config, notes(alice, 10, NOW - 100))
    report = await sync_once(config, url, {}, sync_options(config, "both"))
    assert (report.have, report.pushed, report.errors) == (10, 10, {})
    assert (tmp_path / "local" / "relay.db.key").stat().st_mode & 0o777 == 0o600  # created on first use


async def test_ids_reported_twice_are_fetched_and_pushed_once(tmp_path, alice):
    """With small frames the engine reports some ids in two rounds: each is still fetched once and sent once."""
    events = notes(alice, 4800, NOW - 100_000)
    remote, local = events[:2400], events[2400:]
    config = local_config(tmp_path)
    await seed(config, local)
    async with ScriptedRelay(advertise=remote) as peer:
        report = await sync_once(config, peer.url, {}, sync_options(config, "both", frame_size_limit=4096))
        received = [e["id"] for e in peer.received]
    assert report.reported > report.have + report.need == 4800  # repeats happened...
    assert (report.fetched, report.pushed, report.settled, report.errors) == (2400, 2400, {}, {})  # ...and were dropped
    assert sorted(received) == sorted(e["id"] for e in local)
    assert set(stored(config)) == {e["id"] for e in events}


# --- our own relay as the peer ---------------------------------------------------------------------------


async def test_sync_waits_out_the_peer_rate_limits(tmp_path, alice):
    """A peer on strict rate limits answers part of our REQs and EVENTs with "rate-limited:": the client
    pauses and sends them again, and converges with no error (a default public relay limits us this way)."""
    limits = {"exempt": [], "exempt_loopback": False, "reqs_per_second": 10, "reqs_burst": 1,
              "events_per_second": 500, "events_burst": 5}
    peer_config = local_config(tmp_path, "peer", rate_limits=limits)
    remote_only, local_only, common = split_sets(alice, 120)
    await seed(peer_config, remote_only + common)
    config = local_config(tmp_path, sync={"fetch_batch": 20, "fetch_in_flight": 4, "push_in_flight": 100})
    await seed(config, local_only + common)
    peer = Relay(peer_config)
    await peer.start()
    try:
        # 4 REQs at once against a bucket of 1, then 25 EVENTs in one write against a bucket of 5
        report = await sync_once(config, peer.url, {}, sync_options(config, "both"))
        refused_events = peer.metrics.registry.get_sample_value("relay_events_refused_total",
                                                                 {"reason": "rate-limited"})
    finally:
        await peer.stop()
    assert (report.need, report.have, report.fetched, report.pushed) == (120, 120, 120, 120)
    assert not report.errors and not report.settled
    assert refused_events > 0
    everything = {e["id"] for e in remote_only + local_only + common}
    assert set(stored(config)) == everything == set(stored(peer_config))



async def test_sync_converges_with_our_relay(tmp_path, relay, alice, bob):
    """Against a second instance of our relay: both ways, several rounds, then nothing left to do."""
    assert await speaks_nip77(relay.url)
    remote_only, local_only, common = split_sets(alice, 300)
    replaceable_remote = bob.sign(kind=0, content="newer", created_at=NOW - 10)
    replaceable_local = bob.sign(kind=0, content="older", created_at=NOW - 20)
    await publish(relay.url, remote_only + common + [replaceable_remote])
    config = local_config(tmp_path)
    await seed(config, local_only + common + [replaceable_local])

    report = await sync_once(config, relay.url, {}, sync_options(config, "both", frame_size_limit=4096))

    assert report.rounds > 1
    assert (report.have, report.need) == (len(local_only) + 1, len(remote_only) + 1)
    assert (report.fetched, report.pushed) == (len(remote_only) + 1, len(local_only))
    assert report.settled == {GONE_LOCALLY: 1}  # our older kind 0 was replaced by the fetched newer one
    assert not report.errors
    everything = {e["id"] for e in remote_only + local_only + common} | {replaceable_remote["id"]}
    assert set(stored(config)) == everything == await remote_ids(relay.url)
    again = await sync_once(config, relay.url, {}, sync_options(config, "both"))
    assert (again.have, again.need) == (0, 0)


# --- peers without NIP-77, NOTICE, timeouts ----------------------------------------------------------------


@pytest.mark.parametrize("mode, says", [
    ("notice", "does not support NIP-77 negentropy: it answered NEG-OPEN with NOTICE 'unknown message type NEG-OPEN'"),
    ("neg-err", "refused negentropy sync: NEG-ERR 'blocked: this relay does not sync that'"),
    ("silent", "timed out: no answer"),
    ("unknown-close", "closed the connection"),
])
async def test_peer_without_nip77_fails_with_a_clear_message(tmp_path, alice, mode, says):
    """NOTICE, NEG-ERR, silence or a closed socket in answer to NEG-OPEN: PeerError saying so, and recorded."""
    config = local_config(tmp_path, sync={"timeout_seconds": 1.0})
    await seed(config, notes(alice, 3, NOW - 50))
    async with ScriptedRelay(mode=mode) as peer:
        with pytest.raises(PeerError) as raised:
            await sync_once(config, peer.url, {}, sync_options(config, "both"))
    assert says in str(raised.value)
    if mode in ("silent", "unknown-close"):
        assert "NIP-77" in str(raised.value)
    conn = sqlite3.connect(config.store.path)
    [state] = read_states(conn)
    conn.close()
    assert (state.url, state.last_error, state.last_success, state.lease_owner) == (
        peer.url, str(raised.value), None, None)


async def test_failed_run_reports_how_long_it_ran(tmp_path, alice):
    """A run that fails still reports its elapsed seconds: when the peer never answers NEG-OPEN, and when it
    never completes the WebSocket handshake."""
    config = local_config(tmp_path, sync={"timeout_seconds": 1.0, "connect_timeout_seconds": 1.0})
    await seed(config, notes(alice, 3, NOW - 50))
    report = SyncReport()
    async with ScriptedRelay(mode="silent") as peer:
        with pytest.raises(PeerError):
            await sync_once(config, peer.url, {}, sync_options(config, "both"), report=report)
    assert report.seconds >= 0.9
    mute = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)  # accepts, never answers
    report = SyncReport()
    try:
        with pytest.raises(PeerError):
            await sync_once(config, f"ws://127.0.0.1:{mute.sockets[0].getsockname()[1]}", {},
                            sync_options(config, "both"), report=report)
    finally:
        mute.close()
    assert report.seconds >= 0.9


async def test_cli_exits_nonzero_when_peer_answers_notice(tmp_path, alice):
    """`relay sync` against a relay that answers NOTICE: exit 1, the reason on stderr, the summary of what
    was done before the failure (here nothing) on stdout."""
    config = local_config(tmp_path)
    async with ScriptedRelay(mode="notice") as peer:
        code, out, err = await relay_cli_async("sync", peer.url, "--create", "--db", config.store.path)
    assert code == 1
    [summary] = out.splitlines()
    assert summary.startswith(f"sync {peer.url} (both): have 0, need 0, fetched 0, pushed 0, settled 0, errors 0 (0 ")
    assert f"relay sync: {peer.url} does not support NIP-77 negentropy" in err


async def test_cli_exits_nonzero_when_peer_is_unreachable(tmp_path):
    """Nothing listening: exit 1 with "cannot connect"; a bad URL or filter: exit 2."""
    config = local_config(tmp_path)
    code, _, err = await relay_cli_async("sync", f"ws://127.0.0.1:{free_port()}", "--create", "--db", config.store.path)
    assert code == 1 and "cannot connect to ws://127.0.0.1:" in err
    code, _, err = await relay_cli_async("sync", "http://127.0.0.1:1", "--db", config.store.path)
    assert code == 2 and "not a ws:// or wss:// URL" in err
    code, _, err = await relay_cli_async("sync", "ws://127.0.0.1:1", "--db", config.store.path, "--filter", '{"limit":5}')
    assert code == 2 and "argument --filter: limit has no meaning for sync" in err
    code, _, err = await relay_cli_async("sync", "ws://127.0.0.1:1", "--db", config.store.path,
                                         "--filter", '{"search":"nostr"}')
    assert code == 2 and "argument --filter: search has no meaning for sync" in err


# --- settled refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("accepted, message, outcome", [
    (True, "", "stored"),
    (True, "duplicate: already have this event", "settled"),
    (False, "duplicate: have a newer version", "settled"),
    (False, "blocked: this event was deleted", "settled"),
    (False, "invalid: event has expired", "settled"),
    (False, "blocked: event is expired", "settled"),
    (False, "replaced: have newer event", "settled"),
    (False, "blocked: pubkey not allowed", "refused"),
    (False, "invalid: bad signature", "refused"),
    (False, "invalid: too many tags", "refused"),
    (False, "pow: difficulty 30 is required", "refused"),
    (False, "restricted: not allowed to write", "refused"),
    (False, "rate-limited: slow down", "error"),
    (False, "error: could not save", "error"),
    (False, "auth-required: authenticate first", "error"),
    (False, "", "error"),
])
def test_classify_ok_replies(accepted, message, outcome):
    """Which OK replies count as pushed/stored, settled, refused for good (NIP-01 prefixes no retry changes), or
    errors (what may pass)."""
    assert classify(accepted, message)[0] == outcome


async def test_push_refusals_that_settle_are_not_errors(tmp_path, alice):
    """Pushing: duplicate (OK true or false), deleted, expired and strfry's replaced: settle; exit 0 from the CLI."""
    config = local_config(tmp_path)
    events = notes(alice, 7, NOW - 70)
    await seed(config, events)
    replies = [(True, "duplicate: already have this event"), (False, "duplicate: have a newer version"),
               (False, "blocked: this event was deleted"), (False, "invalid: event has expired"),
               (False, "replaced: have newer event"), (True, ""), (True, "")]
    ok = {e["id"]: reply for e, reply in zip(events, replies)}
    async with ScriptedRelay(ok=ok) as peer:
        report = await sync_once(config, peer.url, {}, sync_options(config, "up"))
        assert (report.have, report.pushed, sum(report.settled.values()), report.errors) == (7, 2, 5, {})
        assert report.settled["duplicate: have a newer version"] == 1
        peer.received.clear()
        code, out, err = await relay_cli_async("sync", peer.url, "--db", config.store.path, "--dir", "up")
        assert code == 0, err
        assert "pushed 2, settled 5, errors 0" in out
        assert "  settled 1: replaced: have newer event" in out.splitlines()
        assert len(peer.received) == 7


async def test_push_refusal_that_is_an_error_fails_the_cli(tmp_path, alice):
    """A refusal that may pass ("error: could not save") is counted as an error: listed with its id, exit 1,
    and `relay status` shows the run's error."""
    config = local_config(tmp_path)
    events = notes(alice, 3, NOW - 70)
    await seed(config, events)
    async with ScriptedRelay(ok={events[0]["id"]: (False, "error: could not save")}) as peer:
        code, out, err = await relay_cli_async("sync", peer.url, "--create", "--db", config.store.path)
    assert code == 1
    assert "pushed 2, settled 0, errors 1" in out
    assert "  error 1: error: could not save" in out.splitlines()
    assert f"    ids {events[0]['id']}" in out.splitlines()
    assert "finished with 1 errors" in err
    code, out, _ = await relay_cli_async("status", "--db", config.store.path, "--json")
    [state] = json.loads(out)["peers"]
    assert state["last_success"] is None and state["last_error"].startswith("1 events not synced for now")
    assert events[0]["id"] in state["last_error"] and state["refused"] == 0


async def test_interrupted_push_counts_every_event_the_peer_acknowledged(tmp_path, alice):
    """A peer that drops the connection right after answering its 75th EVENT, inside the second chunk of 50: the
    run fails, and its report and sync_peers.events_out count every answer it sent, the cut chunk's too (duplicates
    settled, a refusal an error, the rest pushed)."""
    config = local_config(tmp_path)
    events = notes(alice, 120, NOW - 300)
    await seed(config, events)
    ok = {e["id"]: (True, "duplicate: already have this event") for e in events[::10]}
    ok[events[-6]["id"]] = (False, "error: could not save")  # the push goes newest first: this one arrives
    options = sync_options(config, "up")
    assert push_chunk(options.push_in_flight) == 50  # the drop falls inside a chunk
    report = SyncReport()
    async with ScriptedRelay(ok=ok, drop_after=75) as peer:
        with pytest.raises(PeerError, match="closed the connection"):
            await sync_once(config, peer.url, {}, options, report=report)
    assert len(peer.received) == 75
    answered = Counter(classify(*ok.get(e["id"], (True, "")))[0] for e in peer.received)
    assert answered[ERROR] == 1 and answered[SETTLED] > 0
    assert (report.pushed, sum(report.settled.values()), sum(report.errors.values())) == (
        answered[STORED], answered[SETTLED], answered[ERROR])
    conn = sqlite3.connect(config.store.path)
    [state] = read_states(conn)
    conn.close()
    assert state.events_out == report.pushed


async def test_fetch_validates_like_client_events_and_settles_what_cannot_be_stored(tmp_path, alice, bob):
    """Fetched events go through the client checks: expired, deleted, older version, unserved ids settle; a bad
    signature is an error; the good one is stored with origin = the peer."""
    config = local_config(tmp_path)
    good = alice.sign(content="good", created_at=NOW - 60)
    expired = alice.sign(content="gone", created_at=NOW - 59, tags=[["expiration", str(NOW - 30)]])
    deleted = bob.sign(content="deleted", created_at=NOW - 58)
    deletion = bob.sign(kind=5, tags=[["e", deleted["id"]]], created_at=NOW - 57)
    older, newer = alice.sign(kind=0, content="old", created_at=NOW - 56), alice.sign(kind=0, content="new",
                                                                                        created_at=NOW - 40)
    unserved = alice.sign(content="advertised, not served", created_at=NOW - 55)
    forged = dict(alice.sign(content="forged", created_at=NOW - 54), sig=bob.sign(content="x")["sig"])
    await seed(config, [deletion, newer])
    advertise = [good, expired, deleted, older, unserved, forged]
    serve = {e["id"]: e for e in advertise if e is not unserved}
    async with ScriptedRelay(advertise=advertise, serve=serve) as peer:
        report = await sync_once(config, peer.url, {}, sync_options(config, "down"))
    assert (report.need, report.fetched, report.have) == (6, 1, 2)
    assert report.settled == {"invalid: event has expired": 1, "blocked: this event was deleted": 1,
                              "duplicate: have a newer version": 1, MISSING: 1}
    assert report.errors == {"invalid: bad signature": 1}
    assert stored(config) == {good["id"]: peer.url, deletion["id"]: "", newer["id"]: ""}


# --- NIP-42 AUTH ------------------------------------------------------------------------------------------


async def test_auth_required_is_answered_with_the_node_key(tmp_path, alice):
    """A peer that demands AUTH for everything: kind 22242 with its relay URL and challenge, signed by the node key."""
    config = local_config(tmp_path)
    remote, local = notes(alice, 4, NOW - 90), notes(alice, 3, NOW - 80, tag="l")
    await seed(config, local)
    async with ScriptedRelay(advertise=remote, auth="accept") as peer:
        report = await sync_once(config, peer.url, {}, sync_options(config, "both"))
        challenge, event = peer.auth_events[0]
    assert (report.fetched, report.pushed, report.errors) == (4, 3, {})
    key_hex = (tmp_path / "local" / "relay.db.key").read_text().strip()
    assert event["pubkey"] == Keys(bytes.fromhex(key_hex)).pubkey
    assert event["kind"] == 22242
    assert ["relay", peer.url] in event["tags"] and ["challenge", challenge] in event["tags"]


async def test_refused_auth_fails_with_a_clear_message(tmp_path, alice):
    """A peer that refuses our AUTH: exit 1 naming the refusal and the node key."""
    config = local_config(tmp_path)
    await seed(config, notes(alice, 2, NOW - 90))
    async with ScriptedRelay(auth="refuse") as peer:
        code, out, err = await relay_cli_async("sync", peer.url, "--create", "--db", config.store.path)
    assert code == 1
    assert "refused our NIP-42 AUTH as node" in err
    assert "restricted: this node is not on the allow list" in err


async def test_ctrl_c_during_a_sync_prints_the_summary_and_exits_130(tmp_path, alice):
    """SIGINT while the peer has not answered yet: the summary line, "interrupted", exit 130, no traceback (there
    were two KeyboardInterrupt tracebacks and no summary)."""
    import signal
    import sys

    from tests.served import clean_env

    config = local_config(tmp_path)
    await seed(config, notes(alice, 3, NOW - 70))
    async with ScriptedRelay(mode="silent") as peer:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "relay", "sync", peer.url, "--db", config.store.path,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=clean_env())
        async with asyncio.timeout(30):
            while not any(m[0] == "NEG-OPEN" for m in peer.messages):
                await asyncio.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    out, err = out.decode(), err.decode()
    assert proc.returncode == 130, (out, err)
    assert out.startswith(f"sync {peer.url} (both): have 0, need 0, fetched 0, pushed 0"), out
    assert "relay sync: interrupted" in err and "Traceback" not in err


STRFRY_REFUSALS = ["invalid: too many tags", "invalid: unexpected size for fixed-size tag: e",
                   "invalid: unexpected size for fixed-size tag: e", "blocked: pubkey not allowed"]


async def test_events_the_peer_refuses_for_good_are_settled_named_and_shown_alike(tmp_path, alice):
    """strfry refusing events for good ("invalid: too many tags", ...): `relay sync` exits 0 listing each reason
    with its ids, and `relay status` shows the run as a success with those refusals, run after run (every run
    exited 1 with "finished with 4 errors", no ids, and status showed a success)."""
    config = local_config(tmp_path)
    events = notes(alice, 6, NOW - 70)
    await seed(config, events)
    ok = {e["id"]: (False, message) for e, message in zip(events, STRFRY_REFUSALS)}
    async with ScriptedRelay(ok=ok, keep=True) as peer:
        for _ in range(2):
            code, out, err = await relay_cli_async("sync", peer.url, "--db", config.store.path, "--dir", "up")
            assert code == 0, out + err
            assert "errors 0, refused 4" in out.splitlines()[0]
            lines = out.splitlines()
            at = lines.index("  refused 2: invalid: unexpected size for fixed-size tag: e")
            assert set(lines[at + 1].removeprefix("    ids ").split(", ")) == {events[1]["id"], events[2]["id"]}
            assert "  refused 1: invalid: too many tags" in lines and "finished with" not in err
    code, out, _ = await relay_cli_async("status", "--db", config.store.path, "--json")
    [state] = json.loads(out)["peers"]
    assert state["refused"] == 4 and state["last_error"] is None and state["last_success"] is not None
    code, text, _ = await relay_cli_async("status", "--db", config.store.path)
    assert "    refused 4: events the peer refused for good" in text


async def test_a_configured_peer_counts_refused_events_in_metrics_and_errors_as_failed_attempts(tmp_path, alice):
    """A `[[sync.peers]]` peer refusing 4 events for good: `relay_sync_refused_events` 4, no sync error; one that
    answers "error:": a failed attempt in `relay_sync_errors_total` and in status."""

    events = notes(alice, 6, NOW - 70)
    ok = {e["id"]: (False, message) for e, message in zip(events, STRFRY_REFUSALS)}
    ok[events[4]["id"]] = (False, "error: could not save")
    async with ScriptedRelay(ok=ok) as peer:
        config = local_config(tmp_path, sync={"peers": [{"url": peer.url, "direction": "up"}]})
        await seed(config, events)
        node = Relay(config)
        await node.start()
        try:
            page = ""
            async with asyncio.timeout(20):
                while f'relay_sync_refused_events{{peer="{peer.url}"}} 4.0' not in page:
                    await asyncio.sleep(0.1)
                    page = (await node.node.metrics.render()).decode()
            assert f'relay_sync_errors_total{{peer="{peer.url}"}} 1.0' in page
            [state] = await node.store.read_snapshot(read_states)
            assert state.refused == 4 and state.last_error.startswith("1 events not synced for now")
        finally:
            await node.stop()
