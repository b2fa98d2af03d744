"""The image and the two-node docker-compose.yml on a real Docker engine (marker `docker`, left out by default).

Run with `pytest -m docker tests/ops/test_docker_engine.py` where `docker info` answers (`.ci/docker-setup`
gets one).  The module builds the image from the project's Dockerfile (`--network host`; the environment
variable PYTHON_IMAGE, when set, is passed as the build argument of that name: CI's locally built base), then
brings up docker-compose.yml under a project name of its own with that image and free published ports
(NODE_A_PORT, NODE_B_PORT), and removes the project, its volumes and the image tag at the end, failed or not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers import REAL_EVENTS, Client, Keys, read_jsonl
from tests.ops.deployment import COMPOSE_FILE, REPO, node_pubkey, read_compose, served_by
from tests.served import free_port

pytestmark = pytest.mark.docker

BUILD_TIMEOUT = 900  # seconds for `docker build` (a cold build downloads the relay's wheels from PyPI)
COMMAND_TIMEOUT = 180  # seconds for one other docker / compose command
HEALTHY_TIMEOUT = 120.0  # seconds for a container's HEALTHCHECK to report healthy
CATCH_UP_TIMEOUT = 120.0  # seconds for a restarted node-b to serve what node-a took while it was stopped
CAUGHT_UP_EVENTS = 20  # real events published to node-a while node-b is stopped


def docker(*args: str, timeout: float = COMMAND_TIMEOUT, env: dict | None = None) -> str:
    """Run a docker (or compose) command line to completion; its stdout.  Fails the test with stderr on exit != 0."""
    result = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, f"{' '.join(args)}: exit {result.returncode}\n{result.stderr[-4000:]}"
    return result.stdout


def compose_program() -> list[str]:
    """`docker compose` (the v2 plugin) where the CLI has it, else `docker-compose` (1.29, Debian's)."""
    plugin = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=COMMAND_TIMEOUT)
    if plugin.returncode == 0:
        return ["docker", "compose"]
    assert shutil.which("docker-compose"), "neither `docker compose` nor `docker-compose` is installed"
    return ["docker-compose"]


class ComposeProject:
    """docker-compose.yml brought up as one project, every service on the image `image`, ports published on
    free loopback ports."""

    def __init__(self, image: str, tmp_path: Path) -> None:
        self.name = f"relay-test-{uuid.uuid4().hex[:8]}"
        self.ports = {"node-a": free_port(), "node-b": free_port()}
        override = tmp_path / "docker-compose.image.yml"  # `image:` beside `build:`: compose runs it, --no-build
        override.write_text(json.dumps({"services": {service: {"image": image} for service in self.ports}}))
        self.program = [*compose_program(), "-p", self.name, "-f", str(COMPOSE_FILE), "-f", str(override)]
        self.env = {**os.environ, "NODE_A_PORT": str(self.ports["node-a"]), "NODE_B_PORT": str(self.ports["node-b"])}

    def run(self, *args: str) -> str:
        """One compose subcommand on this project; its stdout."""
        return docker(*self.program, *args, env=self.env)

    def url(self, service: str) -> str:
        """The service's WebSocket URL on its published port."""
        return f"ws://127.0.0.1:{self.ports[service]}"

    def health(self, service: str) -> str:
        """The service's container health as the engine reports it: starting, healthy or unhealthy."""
        (container,) = self.run("ps", "-q", service).split()
        return docker("docker", "inspect", "--format", "{{.State.Health.Status}}", container).strip()

    def wait_healthy(self, service: str) -> None:
        """Until the service's HEALTHCHECK passes; fails with the service's log past HEALTHY_TIMEOUT."""
        deadline = time.monotonic() + HEALTHY_TIMEOUT
        while self.health(service) != "healthy":
            assert time.monotonic() < deadline, f"{service} is not healthy:\n{self.logs(service)}"
            time.sleep(1)

    def logs(self, service: str) -> str:
        """The end of the service's log, for failure messages."""
        return self.run("logs", "--no-color", service)[-4000:]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The image built from the Dockerfile and both compose services up and healthy; torn down at the end."""
    assert subprocess.run(["docker", "info"], capture_output=True, timeout=COMMAND_TIMEOUT).returncode == 0, \
        "no Docker engine answers `docker info` (.ci/docker-setup starts one)"
    image = f"relay-test/relay:{uuid.uuid4().hex[:8]}"
    base = ["--build-arg", f"PYTHON_IMAGE={os.environ['PYTHON_IMAGE']}"] if os.environ.get("PYTHON_IMAGE") else []
    docker("docker", "build", "--network", "host", *base, "-t", image, str(REPO), timeout=BUILD_TIMEOUT)
    project = ComposeProject(image, tmp_path_factory.mktemp("compose"))
    try:
        project.run("up", "-d", "--no-build")
        for service in project.ports:
            project.wait_healthy(service)
        yield project
    finally:
        project.run("down", "--volumes", "--timeout", "30")
        docker("docker", "rmi", image)


async def publish(url: str, events: list[dict]) -> None:
    """Publish `events` to the relay at `url`; each must be answered OK true."""
    client = await Client.connect(url)
    try:
        for event in events:
            assert await client.publish(event) == ["OK", event["id"], True, ""]
    finally:
        await client.close()


def test_both_containers_report_healthy(pair):
    """The engine runs both nodes' HEALTHCHECK (GET /health from inside the container) and reports them healthy."""
    assert {service: pair.health(service) for service in pair.ports} == {"node-a": "healthy", "node-b": "healthy"}


def test_relay_key_in_each_container_is_its_compose_secret(pair):
    """`docker compose exec SERVICE relay key` prints the pubkey of the service's compose secret (docs/peers.md, "Fleets")."""
    compose = read_compose()
    for service, spec in compose["services"].items():
        (secret,) = spec["secrets"]
        expected = node_pubkey(REPO / compose["secrets"][secret]["file"])
        assert pair.run("exec", "-T", service, "relay", "key").strip() == expected


async def test_an_event_published_to_node_a_is_served_by_node_b(pair):
    """A signed event published to node-a on its published port is served by node-b over the compose network."""
    event = Keys(0xD0C4E6).sign(kind=1, content="published to node-a in a container")
    await publish(pair.url("node-a"), [event])
    assert await served_by(pair.url("node-b"), event["id"]), pair.logs("node-b")


async def test_a_stopped_node_b_catches_up_when_started(pair):
    """Events published to node-a while node-b is stopped are all served by node-b once it is started again,
    and both containers are healthy again."""
    pair.run("stop", "node-b")
    events = [e for e in read_jsonl(REAL_EVENTS) if e["kind"] == 1][:CAUGHT_UP_EVENTS]
    events.append(Keys(0xD0C4E7).sign(kind=1, content="published to node-a while node-b was stopped"))
    await publish(pair.url("node-a"), events)
    ids = [event["id"] for event in events]
    assert await served_by(pair.url("node-a"), *ids, timeout=0)
    pair.run("start", "node-b")
    pair.wait_healthy("node-b")
    assert await served_by(pair.url("node-b"), *ids, timeout=CATCH_UP_TIMEOUT), pair.logs("node-b")
    assert {service: pair.health(service) for service in pair.ports} == {"node-a": "healthy", "node-b": "healthy"}
