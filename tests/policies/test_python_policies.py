"""Python write policies on a real relay: verdicts, prefixes, shadow-reject, async, time budget, failures."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from relay.config import ConfigError
from relay.ingest import IMPORT
from relay.ingest.policies import MAX_MESSAGE_CHARS
from tests.helpers import Client, Keys
from tests.inprocess import Relay
from tests.policies import sample
from tests.policies.sample import policies_config, serving
from tests.served import relay_cli
from tests.server.test_auth import authenticate, connect

CHAIN = """
[[policies]]
call = "tests.policies.sample:by_content"
timeout_seconds = 0.1
[[policies]]
call = "tests.policies.sample:async_by_content"
timeout_seconds = 0.2
"""


@pytest.fixture
async def chained(tmp_path):
    """A started relay whose [[policies]] are CHAIN."""
    async with serving(tmp_path, CHAIN) as relay:
        yield relay


def stats(relay: Relay, name: str) -> dict:
    return relay.node.ingest.policies.stats()[name]


async def test_verdicts_reach_the_client_with_a_nip01_prefix(chained, alice: Keys, bob: Keys):
    """Accept is stored; a reject gets "blocked: " unless it has a NIP-01 prefix; async policies answer too."""
    relay = chained
    client = await Client.connect(relay.url)
    ok, no, pow_, async_no = (alice.sign(content=c) for c in ("fine", "reject", "reject-prefixed", "async-reject"))
    assert (await client.publish(ok))[2:] == [True, ""]
    assert (await client.publish(no))[2:] == [False, "blocked: no thanks"]
    assert (await client.publish(pow_))[2:] == [False, "pow: do more work"]
    assert (await client.publish(async_no))[2:] == [False, "blocked: async says no"]
    assert [e["id"] for e in await client.req("all", {})] == [ok["id"]]
    assert stats(relay, "tests.policies.sample:by_content")["rejected"] == 2


async def test_a_long_reject_message_is_cut_to_1000_characters(chained, alice: Keys):
    """A policy's 5,000-character message reaches the client as its first 999 characters and "…"."""
    client = await Client.connect(chained.url)
    reply = await client.publish(alice.sign(content="reject-long"))
    assert reply[2:] == [False, "blocked: " + "m" * (MAX_MESSAGE_CHARS - 10) + "…"]
    assert len(reply[3]) == MAX_MESSAGE_CHARS


async def test_shadow_reject_answers_ok_true_stores_nothing_and_tells_no_one(chained, alice: Keys):
    """OK true, yet a REQ finds nothing and a live subscriber on another connection gets nothing."""
    relay = chained
    watcher, publisher = await Client.connect(relay.url), await Client.connect(relay.url)
    assert await watcher.req("live", {"kinds": [1]}) == []
    shadow, after = alice.sign(content="shadow"), alice.sign(content="after")
    assert (await publisher.publish(shadow))[2] is True
    assert (await publisher.publish(after))[2] is True
    live = await watcher.recv()
    assert live[0] == "EVENT" and live[2]["id"] == after["id"]  # the shadow-rejected one never came
    assert [e["id"] for e in await publisher.req("all", {})] == [after["id"]]
    assert stats(relay, "tests.policies.sample:by_content")["shadow_rejected"] == 1


async def test_a_policy_past_its_time_budget_refuses_with_error_and_is_counted(chained, alice: Keys):
    """A synchronous policy that took 0.3 s of its 0.1 s, an async one that never answers: "error:", counted."""
    relay = chained
    client = await Client.connect(relay.url)
    assert (await client.publish(alice.sign(content="slow")))[2:] == [False, "error: a write policy took too long"]
    assert (await client.publish(alice.sign(content="hang")))[2:] == [False, "error: a write policy took too long"]
    assert stats(relay, "tests.policies.sample:by_content")["overruns"] == 1
    assert stats(relay, "tests.policies.sample:async_by_content")["overruns"] == 1
    assert (await client.publish(alice.sign(content="fine")))[2] is True  # the connection goes on
    page = (await relay.node.metrics.render()).decode()
    assert 'relay_policy_outcomes_total{outcome="overruns",policy="tests.policies.sample:by_content"} 1.0' in page


async def test_a_policy_that_raises_or_answers_garbage_refuses_that_event_only(chained, alice: Keys):
    """"error:" for that event, logged with the policy's name; the connection and the relay go on."""
    relay = chained
    client = await Client.connect(relay.url)
    with capture_logs() as logs:
        for content in ("raise", "garbage"):
            assert (await client.publish(alice.sign(content=content)))[2:] == [False, "error: a write policy failed"]
    assert (await client.publish(alice.sign(content="fine")))[2] is True
    assert stats(relay, "tests.policies.sample:by_content")["failed"] == 2
    failed = [e for e in logs if e["event"] == "policy_failed"]
    assert [e["policy"] for e in failed] == ["tests.policies.sample:by_content"] * 2
    assert "a bug in the policy" in failed[0]["error"] and "yes please" in failed[1]["error"]


async def test_a_policy_sees_the_clients_ip_and_authenticated_pubkeys(tmp_path, alice: Keys, bob: Keys):
    """`source.ip` is the client's address; `source.pubkeys` grows with each NIP-42 AUTH."""
    sample.SEEN.clear()
    async with serving(tmp_path, '[[policies]]\ncall = "tests.policies.sample:remember_source"') as relay:
        client = await connect(relay)
        await client.publish(alice.sign(content="before"))
        assert (await authenticate(client, bob, relay.url))[2] is True
        await client.publish(alice.sign(content="after"))
    assert sample.SEEN == [("client", "127.0.0.1", frozenset(), ""),
                           ("client", "127.0.0.1", frozenset({bob.pubkey}), "")]


@pytest.mark.parametrize("sources, refused", [("", False), ('\nsources = ["client", "import"]', True)])
async def test_sources_default_to_clients_and_import_is_judged_when_listed(tmp_path, alice: Keys, sources, refused):
    """A policy without `sources` leaves `relay import` alone; with sources = ["import"] it judges it."""
    async with serving(tmp_path, f'[[policies]]\ncall = "tests.policies.sample:refuse_all"{sources}') as relay:
        [(outcome, _)] = await relay.node.ingest.accept_many([alice.sign(content="via import")], IMPORT)
    assert (outcome.message == "blocked: not from here") is refused and outcome.accepted is not refused


@pytest.mark.parametrize("policy, named", [
    ('call = "no_such_module_here:check"', ("no_such_module_here:check", "ModuleNotFoundError")),
    ('command = ["/no/such/plugin", "--flag"]', ("cannot run '/no/such/plugin'", "no such executable file")),
    ('command = ["no-such-plugin-on-path"]', ("cannot run 'no-such-plugin-on-path'", "looked up on PATH")),
    ('command = ["{tmp}/not-executable"]', ("cannot run", "no such executable file"))])
def test_a_policy_that_cannot_be_loaded_stops_the_start_with_exit_2_naming_it(tmp_path, policy, named):
    """A module that fails to import, a plugin program not found or not executable: `relay serve`, `relay import`
    and `relay sync` exit 2 naming it; nothing is served, no plugin waits for the first event."""
    (tmp_path / "not-executable").write_text("#!/bin/sh\n")  # mode 644
    (tmp_path / "nothing.jsonl").write_text("")
    config = tmp_path / "relay.toml"
    config.write_text(f'[store]\npath = "{tmp_path / "r.db"}"\n[server]\nport = 0\n'
                      f'[[policies]]\n{policy.format(tmp=tmp_path)}\n')
    for args in (("serve",), ("import", tmp_path / "nothing.jsonl"),
                 ("sync", "ws://127.0.0.1:9")):
        done = relay_cli(args[0], "--config", config, *args[1:])
        assert done.returncode == 2, done
        assert all(text in done.stderr for text in named), done.stderr


async def test_a_bad_factory_option_or_a_missing_function_stops_the_node(tmp_path):
    """The node does not start (ConfigError naming the policy) and leaves nothing running: no server, the
    store's writer stopped."""
    for policies, named in (('[[policies]]\ncall = "relay.policies.builtin:min_pow"\noptions = { bits = 999 }',
                             "relay.policies.builtin:min_pow: cannot load: ValueError"),
                            ('[[policies]]\ncall = "tests.policies.sample:no_such_function"',
                             "no_such_function: cannot load: AttributeError")):
        relay = Relay(policies_config(tmp_path, policies))
        with pytest.raises(ConfigError, match=named):
            await relay.start()
        assert relay.node.server is None and relay.node.store.writer_task.done()
