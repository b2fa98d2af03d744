"""What `relay serve` says at start about mistakes an operator makes: a port in use, a write rule nobody can
meet, a bad `[server] paths`; and `RELAY_CONFIG` as the default `--config`."""

from __future__ import annotations

import errno
import json
import os
import socket

import pytest

from relay.config import ConfigError, load_config
from tests.served import clean_env, relay_cli


def test_a_port_in_use_says_how_to_choose_another(tmp_path):
    """Exit 1 with `listen_failed` naming the port and the two ways to choose another (--port,
    RELAY_SERVER__PORT); no traceback.  The same line with worker processes (`--workers 2`, whose writer
    reserves the port) and in one process (`--workers 0`)."""
    with socket.socket() as taken:  # (no SO_REUSEPORT: a program that is not a relay)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        results = [relay_cli("serve", "--db", tmp_path / f"{workers}.db", "--port", port, "--workers", workers)
                   for workers in (0, 2)]
    lines = []
    for result in results:
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        [failed] = [e for e in map(json.loads, result.stderr.splitlines()) if e["event"] == "listen_failed"]
        assert failed["port"] == port and "--port" in failed["hint"] and "RELAY_SERVER__PORT" in failed["hint"]
        assert failed["error"] == f"[Errno {errno.EADDRINUSE}] {os.strerror(errno.EADDRINUSE)}"
        lines.append({k: v for k, v in failed.items() if k != "timestamp"})
    assert lines[0] == lines[1]


def test_listed_writers_with_nobody_listed_refuse_to_start(tmp_path):
    """`write = "listed"` with no write_pubkeys (and no peers, whose events arrive by sync): exit 2 naming
    auth.write, before listening; with a pubkey, or with a peer to mirror, it loads."""
    config = tmp_path / "relay.toml"
    config.write_text('[auth]\nwrite = "listed"\n')
    result = relay_cli("serve", "--config", config, "--db", tmp_path / "x.db", "--port", 0)
    assert result.returncode == 2 and "relay_started" not in result.stderr
    assert result.stderr.startswith('relay: configuration error: auth.write: "listed" with no auth.write_pubkeys')
    assert load_config(None, {}, {"auth": {"write": "listed", "write_pubkeys": ["a" * 64]}}).auth.write == "listed"
    mirror = tmp_path / "mirror.toml"
    mirror.write_text('[auth]\nwrite = "listed"\n[[sync.peers]]\nurl = "ws://127.0.0.1:9"\ndirection = "down"\n')
    assert load_config(mirror).sync.peers


@pytest.mark.parametrize("paths", [[], ["nostr"], ["/a?b"], "/", [1]])
def test_server_paths_must_be_absolute_paths(paths):
    """`[server] paths`: a non-empty array of paths beginning with "/", without query."""
    with pytest.raises(ConfigError, match="server.paths"):
        load_config(None, {}, {"server": {"paths": paths}})


def test_relay_config_names_the_file_when_no_config_flag_is_given(tmp_path):
    """`RELAY_CONFIG=FILE relay key` reads FILE (a container's: `docker compose exec node-a relay key`);
    `--config` still wins."""
    key = tmp_path / "node.key"
    assert relay_cli("key", "--file", key).returncode == 0
    config = tmp_path / "relay.toml"
    config.write_text(f'[sync]\nsecret_key_file = "{key}"\n')
    with_env = relay_cli("key", env=clean_env(RELAY_CONFIG=str(config)))
    assert with_env.returncode == 0 and with_env.stdout.strip() == relay_cli("key", "--file", key).stdout.strip()
    empty = tmp_path / "empty.toml"
    empty.write_text(f'[store]\npath = "{tmp_path / "elsewhere" / "relay.db"}"\n')
    flag = relay_cli("key", "--config", empty, env=clean_env(RELAY_CONFIG=str(config)))
    assert flag.returncode == 1 and "elsewhere" in flag.stderr

