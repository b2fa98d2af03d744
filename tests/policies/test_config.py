"""`[[policies]]` tables and `[[sync.peers]] nip70_events`: what the file may say, and the examples in
config/relay.toml."""

from __future__ import annotations

import re
import sys
import time

import pytest

from relay.config import ConfigError, PolicyConfig, load_config
from relay.ingest.policies import Policies
from tests.test_config import RELAY_TOML


def load(tmp_path, text: str):
    path = tmp_path / "relay.toml"
    path.write_text(text)
    return load_config(path)


def test_defaults_and_file_order(tmp_path):
    config = load(tmp_path, '[[policies]]\ncall = "a.b:c"\n[[policies]]\ncommand = ["node", "p.js"]\n'
                            'sources = ["peer", "import"]\ntimeout_seconds = 2\nname = "plugin"\n')
    assert config.policies == (PolicyConfig("a.b:c", call="a.b:c"),
                               PolicyConfig("plugin", command=("node", "p.js"), sources=("peer", "import"),
                                            timeout_seconds=2.0))
    assert load(tmp_path, "").policies == ()


@pytest.mark.parametrize("table, named", [
    ('call = "a.b:c"\ncommand = ["x"]', "policies[0]: give either call or command"),
    ("timeout_seconds = 1", "policies[0]: give either call or command"),
    ('call = "nocolon"', "policies[0].call"),
    ('call = "a.b:"', "policies[0].call"),
    ("command = []", "policies[0]: give either"),
    ('command = ["x", 1]', "policies[0].command"),
    ('command = ["x"]\noptions = { a = 1 }', "policies[0].options"),
    ('call = "a:b"\nsources = ["clients"]', "policies[0].sources"),
    ('call = "a:b"\nsources = []', "policies[0].sources"),
    ('call = "a:b"\ntimeout_seconds = 0', "policies[0].timeout_seconds"),
    ('call = "a:b"\ntimeout_seconds = nan', "policies[0].timeout_seconds"),
    ('call = "a:b"\nname = ""', "policies[0].name"),
    ('call = "a:b"\nwhen = "always"', "policies[0].when: unknown key"),
])
def test_bad_tables_are_refused_naming_the_key(tmp_path, table, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        load(tmp_path, f"[[policies]]\n{table}\n")


def test_nip70_events_is_a_boolean_of_a_peer(tmp_path):
    config = load(tmp_path, '[[sync.peers]]\nurl = "ws://a.example"\nnip70_events = true\n')
    assert config.sync.peers[0].nip70_events is True
    with pytest.raises(ConfigError, match=re.escape("sync.peers[0].nip70_events")):
        load(tmp_path, '[[sync.peers]]\nurl = "ws://a.example"\nnip70_events = "yes"\n')


def test_the_commented_examples_in_relay_toml_load(tmp_path):
    """Each `# [[policies]]` example of config/relay.toml, uncommented, is a valid table whose policy loads."""
    lines = RELAY_TOML.read_text().split("# --- Write policies")[1].splitlines()
    example = re.compile(r"# (\[\[policies\]\]|call|options|command|sources)")
    examples = "\n".join(line[2:] for line in lines if example.match(line))
    (tmp_path / "deny.txt").write_text("")
    (tmp_path / "whitelist.js").write_text("")
    (tmp_path / "whitelist.js").chmod(0o755)  # a plugin's program must be executable when the policies load
    examples = examples.replace("/etc/relay/deny.txt", str(tmp_path / "deny.txt")).replace(
        "/usr/local/bin/whitelist.js", str(tmp_path / "whitelist.js"))
    config = load(tmp_path, examples)
    assert [p.call or p.command[0] for p in config.policies] == [
        "relay.policies.builtin:pubkey_list", "relay.policies.builtin:max_size", "relay.policies.builtin:min_pow",
        "relay.policies.builtin:author_rate", str(tmp_path / "whitelist.js")]
    Policies.load(config.policies).close()


async def test_the_guide_example_policy_works_as_written(tmp_path, monkeypatch, alice):
    """docs/moderation.md "Policies": the module and its [[policies]] table, copied as they are, load and judge."""
    from relay.ingest import Source
    from relay.protocol.event import EventLimits, parse_event

    guide = (RELAY_TOML.parents[1] / "docs" / "moderation.md").read_text()
    module = guide.split("```python\n# myrelay_policies.py", 1)[1].split("```", 1)[0].partition("\n")[2]
    table = guide.split("```toml\n[[policies]]\ncall = \"myrelay_policies:no_spam\"", 1)[1].split("```", 1)[0]
    (tmp_path / "myrelay_policies.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = load(tmp_path, '[[policies]]\ncall = "myrelay_policies:no_spam"' + table)
    policies = Policies.load(config.policies)
    verdicts = []
    for content in ("hello", "Buy followers now", "x" * 3000):
        event = parse_event(alice.sign(content=content), EventLimits(), time.time())
        policies.judge(event, Source.client(), policies.chain(Source.client()), verdicts.append)
    assert [v.action for v in verdicts] == ["accept", "shadowReject", "reject"]
    assert verdicts[2].message == "blocked: long notes need NIP-42 AUTH"
    sys.modules.pop("myrelay_policies")  # the next test that writes one imports it afresh
