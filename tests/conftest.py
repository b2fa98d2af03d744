"""Shared fixtures: a real relay on an ephemeral loopback port with a real SQLite file."""

from __future__ import annotations

import pytest

from relay.config import load_config
from tests.helpers import Client, Keys
from tests.inprocess import Relay
from tests.served import TEST_WORKERS


def make_config(tmp_path, toml: str = "", **sections):
    """A Config on `tmp_path/relay.db`, port 0, with `sections` overriding (section -> {key: value}); with
    `toml`, read from that text first (written to `tmp_path/relay.toml`: arrays of tables such as [[shards]]).

    Loopback clients are exempt from rate limits (tests publish thousands of events from 127.0.0.1).
    """
    overrides = {"store": {"path": str(tmp_path / "relay.db")}, "server": {"port": 0},
                 "rate_limits": {"exempt": ["127.0.0.0/8", "::1"]}}
    for section, values in sections.items():
        overrides.setdefault(section, {}).update(values)
    path = None
    if toml:
        tmp_path.mkdir(parents=True, exist_ok=True)
        (path := tmp_path / "relay.toml").write_text(toml)
    return load_config(path, {}, overrides)


@pytest.fixture
async def relay(tmp_path):
    """A started in-process relay; stopped after the test."""
    server = Relay(make_config(tmp_path))
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def start(tmp_path):
    """Start relays with config sections overridden (`start(negentropy={...})`, each in `tmp_path/name`);
    all stopped after the test."""
    started: list[Relay] = []

    async def start_relay(name: str = "r", **sections) -> Relay:
        server = Relay(make_config(tmp_path / name, **sections))
        await server.start()
        started.append(server)
        return server

    yield start_relay
    for server in started:
        await server.stop()


@pytest.fixture
async def client(relay):
    """A raw WebSocket client connected to `relay`."""
    c = await Client.connect(relay.url)
    yield c
    await c.close()


@pytest.fixture
def alice() -> Keys:
    return Keys(0xA11CE)


@pytest.fixture
def bob() -> Keys:
    return Keys(0xB0B)


def pytest_collection_modifyitems(config, items):
    """With RELAY_TEST_WORKERS > 0, deselect the tests marked `single_process` (they read the server's
    in-process state, which then lives in the worker processes); the normal pass runs them all."""
    if int(TEST_WORKERS) == 0:
        return
    marked = [item for item in items if item.get_closest_marker("single_process") is not None]
    if marked:
        config.hook.pytest_deselected(items=marked)
        items[:] = [item for item in items if item.get_closest_marker("single_process") is None]
