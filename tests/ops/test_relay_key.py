"""`relay key`: prints the node's pubkey for a peer's `[[sync.peers]] pubkey`, creating the key file if absent."""

from __future__ import annotations

import os
import stat

import pytest

import relay.cli
from relay.protocol.event import is_hex64
from tests.ops.deployment import node_pubkey
from tests.served import Served, relay_cli


@pytest.fixture
def key_command(monkeypatch, capsys):
    """`relay key ARGS` in this process, without RELAY_* variables: (exit code, last stdout line, stderr).

    Logging is left unconfigured (configuring it would bind this test's captured stderr for good), so
    structlog's default prints its log lines to stdout, before the pubkey; the last line is the command's.
    """
    monkeypatch.setattr(relay.cli, "configure_logging", lambda *_args: None)
    for name in [n for n in os.environ if n.startswith("RELAY_")]:
        monkeypatch.delenv(name)

    def run(*args) -> tuple[int, str, str]:
        code = relay.cli.main(["key", *map(str, args)])
        out = capsys.readouterr()
        return code, (out.out.splitlines() or [""])[-1], out.err

    return run


def test_key_creates_a_private_key_file_and_prints_its_pubkey(tmp_path, key_command):
    """A missing --file is created (mode 0600, 64 hex); the pubkey printed is that key's, the same on a later run."""
    path = tmp_path / "keys" / "node-c.key"
    first = relay_cli("key", "--file", path)  # the real command line, once
    assert first.returncode == 0, first.stderr
    pubkey = first.stdout.strip()
    assert is_hex64(pubkey) and first.stdout == pubkey + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert pubkey == node_pubkey(path)
    secret = path.read_text()
    assert key_command("--file", path) == (0, pubkey, "")
    assert path.read_text() == secret


def test_key_without_file_uses_the_configured_or_default_key_path(tmp_path, key_command):
    """Without --file: `[sync] secret_key_file` when set, else the database's, `<db>.key` beside it (as `relay
    serve`); a key missing there is an error, and nothing is created (the path may be meant for a container)."""
    configured = tmp_path / "secrets" / "configured.key"
    config = tmp_path / "relay.toml"
    config.write_text(f'[sync]\nsecret_key_file = "{configured}"\n')
    code, out, err = key_command("--config", config)
    assert code == 1 and str(configured) in err and not (tmp_path / "secrets").exists()
    assert key_command("--file", configured)[0] == 0
    code, out, err = key_command("--config", config)
    assert code == 0 and out == node_pubkey(configured), err
    (tmp_path / "db").mkdir()
    assert key_command("--file", tmp_path / "db" / "relay.db.key")[0] == 0
    code, out, err = key_command("--db", tmp_path / "db" / "relay.db")
    assert code == 0 and out == node_pubkey(tmp_path / "db" / "relay.db.key"), err


def test_two_databases_in_one_folder_are_two_nodes_with_two_keys(tmp_path):
    """`relay serve` on a.db and on b.db in one folder: each creates its own key beside its database, so
    `relay key --db` gives two pubkeys (one `sync.key` per folder gave one identity to both)."""
    pubkeys = []
    for name in ("a.db", "b.db"):
        with Served(tmp_path, "--db", tmp_path / name, "--port", 0, "--workers", 0) as served:
            served.started_url()
            assert served.stop() == 0, served.stderr
        key = relay_cli("key", "--db", tmp_path / name)
        assert key.returncode == 0, key.stderr
        pubkeys.append(key.stdout.strip())
    assert is_hex64(pubkeys[0]) and is_hex64(pubkeys[1]) and pubkeys[0] != pubkeys[1]
    assert pubkeys == [node_pubkey(tmp_path / "a.db.key"), node_pubkey(tmp_path / "b.db.key")]
    assert not (tmp_path / "sync.key").exists()


def test_a_legacy_sync_key_goes_to_the_first_database_that_needs_it(tmp_path):
    """A `sync.key` left in the folder by an earlier version keeps its identity: the first database to start
    there takes it over (renamed to `a.db.key`, logged `node_key_taken_over`); a second one gets a new key."""
    legacy = tmp_path / "sync.key"
    assert relay_cli("key", "--file", legacy).returncode == 0
    before = node_pubkey(legacy)
    with Served(tmp_path, "--db", tmp_path / "a.db", "--port", 0, "--workers", 0) as served:
        served.started_url()
        assert served.stop() == 0, served.stderr
    [taken] = [e for e in served.log_events() if e.get("event") == "node_key_taken_over"]
    assert taken["legacy"] == str(legacy) and taken["path"] == str(tmp_path / "a.db.key")
    assert not legacy.exists() and stat.S_IMODE((tmp_path / "a.db.key").stat().st_mode) == 0o600
    first, second = relay_cli("key", "--db", tmp_path / "a.db"), relay_cli("key", "--db", tmp_path / "b.db")
    assert first.returncode == 0 and first.stdout.strip() == before, first.stderr
    assert second.returncode == 1 and "b.db.key" in second.stderr  # none to take over: b.db has no key yet
    with Served(tmp_path, "--db", tmp_path / "b.db", "--port", 0, "--workers", 0) as served:
        served.started_url()
        assert served.stop() == 0, served.stderr
    assert not any(e.get("event") == "node_key_taken_over" for e in served.log_events())
    assert node_pubkey(tmp_path / "b.db.key") != before == node_pubkey(tmp_path / "a.db.key")


def test_key_file_without_a_valid_key_exits_1_naming_it(tmp_path):
    """A key file that does not hold 64 hex characters is left alone: exit 1, its path on stderr, nothing on stdout,
    and no warning that it is readable by others (it is no key); a real key of mode 0644 gets that warning."""
    path = tmp_path / "broken.key"
    path.write_text("not a key\n")
    path.chmod(0o644)
    broken = relay_cli("key", "--file", path)
    assert broken.returncode == 1 and broken.stdout == "" and str(path) in broken.stderr
    assert "node_key_readable_by_others" not in broken.stderr
    assert path.read_text() == "not a key\n"
    real = tmp_path / "real.key"
    assert relay_cli("key", "--file", real).returncode == 0
    real.chmod(0o644)
    readable = relay_cli("key", "--file", real)
    assert readable.returncode == 0 and "node_key_readable_by_others" in readable.stderr
