"""strfry's write-policy plugin protocol with a real external plugin: a Node.js script written here from strfry's
docs/plugins.md (JSON lines in: type, event, receivedAt, sourceType, sourceInfo; out: id, action, msg)."""

from __future__ import annotations

import shutil
import time

import pytest

from relay.ingest import IMPORT, Source
from relay.ingest.policies import MAX_MESSAGE_CHARS
from relay.policies.plugin import NOT_RUNNING
from tests.helpers import Client, Keys, eventually
from tests.inprocess import Relay
from tests.policies.sample import serving

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")

# What it does is chosen by the event's content, so each test drives it from the client.
PLUGIN_JS = r"""
const rl = require('readline').createInterface({input: process.stdin, output: process.stdout, terminal: false});
let held = null;
const answer = (res) => console.log(JSON.stringify(res));
rl.on('line', (line) => {
    const req = JSON.parse(line);
    if (req.type !== 'new') { console.error('unexpected request type'); return; }
    const id = req.event.id, content = req.event.content;
    if (content === 'reject') answer({id, action: 'reject', msg: 'blocked: not on white-list'});
    else if (content === 'reject-bare') answer({id, action: 'reject'});
    else if (content === 'shadow') answer({id, action: 'shadowReject'});
    else if (content === 'source') answer({id, action: 'reject',
        msg: `blocked: ${req.sourceType} ${req.sourceInfo} ${typeof req.receivedAt} ${req.event.sig.length}`});
    else if (content === 'garbage') console.log('this is not JSON at all');
    else if (content === 'long-msg') answer({id, action: 'reject', msg: 'blocked: ' + 'm'.repeat(5000)});
    else if (content === 'huge-line') answer({id, action: 'reject', msg: 'm'.repeat(5000000)});
    else if (content === 'bad-action') answer({id, action: 'maybe'});
    else if (content === 'hang') {}
    else if (content === 'die') process.exit(3);
    else if (content === 'first') held = {id, action: 'accept'};
    else if (content === 'second') { answer({id, action: 'reject', msg: 'second refused'}); answer(held); }
    else answer({id, action: 'accept'});
});
"""


@pytest.fixture
async def plugin_relay(tmp_path):
    """A started relay whose one policy is the Node.js plugin (clients, peers and import; 0.5 s budget)."""
    script = tmp_path / "plugin.js"
    script.write_text(PLUGIN_JS)
    async with serving(tmp_path, f"""
[[policies]]
name = "node-plugin"
command = ["node", "{script}"]
sources = ["client", "peer", "import"]
timeout_seconds = 0.5
""") as relay:
        yield relay


def stats(relay: Relay) -> dict:
    return relay.node.ingest.policies.stats()["node-plugin"]


async def test_accept_reject_and_shadow_reject_as_strfry_plugins_answer(plugin_relay, alice: Keys):
    """accept stores; reject keeps its message (or gets "blocked: "); shadowReject is OK true, stored nowhere."""
    client = await Client.connect(plugin_relay.url)
    kept, refused, bare, shadow = (alice.sign(content=c) for c in ("hello", "reject", "reject-bare", "shadow"))
    assert (await client.publish(kept))[2:] == [True, ""]
    assert (await client.publish(refused))[2:] == [False, "blocked: not on white-list"]
    assert (await client.publish(bare))[2:] == [False, "blocked: refused by policy"]
    assert (await client.publish(shadow))[2] is True
    assert [e["id"] for e in await client.req("all", {})] == [kept["id"]]


async def test_the_request_names_the_source_as_strfry_does(plugin_relay, alice: Keys):
    """sourceType IP4 with the client's address, Sync with the peer's URL, Import; receivedAt a number."""
    client = await Client.connect(plugin_relay.url)
    assert (await client.publish(alice.sign(content="source")))[3] == "blocked: IP4 127.0.0.1 number 128"
    ingest = plugin_relay.node.ingest
    for source, expected in ((Source.peer("ws://peer.example"), "blocked: Sync ws://peer.example number 128"),
                             (IMPORT, "blocked: Import  number 128")):
        [(outcome, _)] = await ingest.accept_many([alice.sign(content="source")], source)
        assert outcome.message == expected


async def test_answers_out_of_order_are_matched_by_id(plugin_relay, alice: Keys):
    """The plugin answers the second event before the first: each gets its own verdict."""
    client = await Client.connect(plugin_relay.url)
    first, second = alice.sign(content="first"), alice.sign(content="second")
    await client.send(["EVENT", first])
    await client.send(["EVENT", second])
    oks = {reply[1]: reply[2:] for reply in [await client.recv(), await client.recv()]}
    assert oks == {first["id"]: [True, ""], second["id"]: [False, "blocked: second refused"]}


async def test_a_bad_answer_line_refuses_that_event_and_the_plugin_goes_on(plugin_relay, alice: Keys):
    """A line that is not JSON, an unknown action: "error:" for the event, counted; the next one is judged."""
    client = await Client.connect(plugin_relay.url)
    for content in ("garbage", "bad-action"):
        reply = await client.publish(alice.sign(content=content))
        assert reply[2:] == [False, "error: the write policy plugin answered badly"]
    assert (await client.publish(alice.sign(content="fine")))[2] is True
    assert stats(plugin_relay)["bad_lines"] == 2 and stats(plugin_relay).get("restarts") == 0


async def test_a_long_message_is_cut_and_an_overlong_line_refuses_its_event(plugin_relay, alice: Keys):
    """A 5,000-character msg reaches the client cut to 1,000 characters; a 5 MB answer line (past MAX_LINE_BYTES)
    is dropped unkept and refuses the event it names with "error:"; the plugin goes on, not restarted."""
    client = await Client.connect(plugin_relay.url)
    reply = await client.publish(alice.sign(content="long-msg"))
    assert reply[2:] == [False, "blocked: " + "m" * (MAX_MESSAGE_CHARS - 10) + "…"]
    huge = alice.sign(content="huge-line")
    assert (await client.publish(huge))[1:] == [huge["id"], False, "error: the write policy plugin answered badly"]
    assert (await client.publish(alice.sign(content="fine")))[2] is True
    assert stats(plugin_relay)["bad_lines"] == 1 and stats(plugin_relay).get("restarts") == 0


async def test_a_plugin_past_its_time_budget_is_killed_and_restarted(plugin_relay, alice: Keys):
    """No answer within 0.5 s: "error:", the overrun counted, the process killed; the next event starts it again."""
    client = await Client.connect(plugin_relay.url)
    started = time.monotonic()
    assert (await client.publish(alice.sign(content="hang")))[2:] == [False, "error: a write policy took too long"]
    assert 0.5 <= time.monotonic() - started < 3
    assert (await client.publish(alice.sign(content="after")))[2] is True
    assert stats(plugin_relay)["overruns"] == 1 and stats(plugin_relay)["restarts"] == 1


async def test_a_plugin_that_dies_is_restarted_and_meanwhile_refuses_with_error(plugin_relay, alice: Keys):
    """Its event and those that come while it is down get "error:", never accepted unchecked; then it is back."""
    client = await Client.connect(plugin_relay.url)
    assert (await client.publish(alice.sign(content="die")))[2:] == [False, "error: the write policy plugin stopped"]
    down = await client.publish(alice.sign(content="while down"))
    assert down[2:] == [False, NOT_RUNNING]
    assert stats(plugin_relay)["restarts"] == 1

    async def accepted() -> bool:
        return (await client.publish(alice.sign(content=f"back {time.monotonic()}")))[2]

    assert await eventually(accepted, timeout=5)
    stored = {e["content"] for e in await client.req("all", {})}
    assert "while down" not in stored and "die" not in stored


async def test_a_plugin_that_cannot_start_refuses_with_error(tmp_path, alice: Keys):
    """An executable file whose interpreter is missing (found at load, failing when started): the relay serves,
    and every event of the source is refused with "error:"."""
    script = tmp_path / "plugin"
    script.write_text("#!/no/such/interpreter\n")
    script.chmod(0o755)
    async with serving(tmp_path, f'[[policies]]\ncommand = ["{script}"]') as relay:
        client = await Client.connect(relay.url)
        assert (await client.publish(alice.sign(content="x")))[2:] == [False, NOT_RUNNING]
