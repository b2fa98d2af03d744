"""docker-compose.yml's two nodes run as local processes, wired exactly as the compose file wires them.

For each service: the image's entry point (`relay`, here `python -m relay`)
with the service's command, the image's environment, the config file the
service mounts, and its compose secret (the node key).  Mapped for a machine
without Docker: service host names to 127.0.0.1, container ports to free
loopback ports, the named volume at /data to a temporary directory,
bind mounts and secrets to their files in the repository; peer URLs and
container paths are rewritten in a temporary copy of each config file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from relay.config import load_config
from tests.helpers import Client, Keys
from tests.ops.deployment import PROPAGATION_TIMEOUT, REPO, node_pubkey, read_compose, read_image, served_by
from tests.served import Served, free_port


@dataclass
class LocalService:
    """One compose service mapped onto this machine."""

    name: str
    container_port: int
    port: int  # the free loopback port standing for the container port
    mounts: dict[str, Path] = field(default_factory=dict)  # container path -> path here

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def local_path(self, container_path: str) -> str:
        """`container_path` under a mount, as the path here; other strings unchanged."""
        for target, source in self.mounts.items():
            if container_path == target or container_path.startswith(target + "/"):
                return str(source) + container_path[len(target):]
        return container_path


def map_services(compose: dict, tmp_path: Path) -> dict[str, LocalService]:
    """Every compose service with a free port, and its volumes (named: a fresh directory) and secrets."""
    services = {}
    for name, spec in compose["services"].items():
        (published,) = spec["ports"]  # "HOST:CONTAINER"
        service = LocalService(name, int(published.split(":")[-1]), free_port())
        for volume in spec["volumes"]:
            source, target = volume.split(":")[:2]
            if source.startswith((".", "/")):
                service.mounts[target] = REPO / source
            else:
                assert source in compose["volumes"], f"{name}: volume {source} is not declared"
                service.mounts[target] = tmp_path / source
                service.mounts[target].mkdir()
        for secret in spec.get("secrets", []):
            service.mounts[f"/run/secrets/{secret}"] = REPO / compose["secrets"][secret]["file"]
        assert all(p.exists() for p in service.mounts.values()), service.mounts
        services[name] = service
    return services


def local_config(service: LocalService, services: dict[str, LocalService], container_path: str,
                 tmp_path: Path) -> Path:
    """A copy of the config file mounted at `container_path`, with peer URLs and container paths made local."""
    text = Path(service.local_path(container_path)).read_text(encoding="utf-8")
    for other in services.values():
        text = text.replace(f'"ws://{other.name}:{other.container_port}"', f'"{other.url}"')
    for target in sorted(service.mounts, key=len, reverse=True):
        text = text.replace(f'"{target}', f'"{service.local_path(target)}')
    copy = tmp_path / f"{service.name}.toml"
    copy.write_text(text, encoding="utf-8")
    return copy


def serve_args(service: LocalService, services: dict[str, LocalService], command: list[str],
               tmp_path: Path) -> list[str]:
    """The service's `relay serve` arguments (after "serve") with files made local."""
    assert command[0] == "serve", command
    args = []
    for previous, arg in zip(command, command[1:]):
        args.append(str(local_config(service, services, arg, tmp_path)) if previous == "--config"
                    else service.local_path(arg))
    return args


def service_env(service: LocalService, image_env: dict[str, str], spec: dict,
                services: dict[str, LocalService], tmp_path: Path) -> dict[str, str]:
    """The image's RELAY_* environment and the service's own, paths made local (RELAY_CONFIG: a local copy of
    the file), listening on loopback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    relay_env = {k: v for k, v in image_env.items() if k.startswith("RELAY_")}
    relay_env.update(spec.get("environment", {}))
    env.update({k: service.local_path(v) for k, v in relay_env.items()})
    if "RELAY_CONFIG" in relay_env:
        env["RELAY_CONFIG"] = str(local_config(service, services, relay_env["RELAY_CONFIG"], tmp_path))
    assert env["RELAY_SERVER__HOST"] == "0.0.0.0"
    env["RELAY_SERVER__HOST"] = "127.0.0.1"  # the container's every interface; loopback only here
    env["RELAY_SERVER__PORT"] = str(service.port)
    return env


def reconciled_with(served: Served, peer_url: str, timeout: float = PROPAGATION_TIMEOUT) -> bool:
    """Whether the process logs a NIP-77 reconciliation with `peer_url` (its own [[sync.peers]]) within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e.get("event") == "sync_reconciled" and e.get("peer") == peer_url for e in served.log_events()):
            return True
        time.sleep(0.2)
    return False


def test_example_nodes_name_each_other_as_peers(tmp_path):
    """Each node's config lists the other (service name, container port, and the pubkey of the other's
    compose secret) as its one peer, and reads its own key from its own secret."""
    compose = read_compose()
    services = map_services(compose, tmp_path)
    assert len(services) == 2
    for name, spec in compose["services"].items():
        (other,) = set(services) - {name}
        service = services[name]
        config = load_config(Path(service.local_path(spec["environment"]["RELAY_CONFIG"])))
        (own_secret,) = spec["secrets"]
        (other_secret,) = compose["services"][other]["secrets"]
        assert config.sync.secret_key_file == f"/run/secrets/{own_secret}"
        (peer,) = config.sync.peers
        assert peer.url == f"ws://{other}:{services[other].container_port}"
        assert peer.direction == "both"
        assert peer.pubkey == node_pubkey(REPO / compose["secrets"][other_secret]["file"])


async def test_two_nodes_from_the_compose_file_sync_both_ways(tmp_path):
    """Both services run as `relay serve` processes as composed; an event published on either node is served
    by the other, each node runs with its own key and its own volume, and the compose health check passes."""
    compose, image = read_compose(), read_image()
    assert image.entrypoint == ("relay",)
    services = map_services(compose, tmp_path)
    with ExitStack() as stack:
        running = {}
        for name, spec in compose["services"].items():
            service = services[name]
            env = service_env(service, image.env, spec, services, tmp_path)
            workdir = tmp_path / f"{name}-run"
            workdir.mkdir()
            running[name] = stack.enter_context(
                Served(workdir, *serve_args(service, services, spec["command"], tmp_path), env=env))
        for name, spec in compose["services"].items():
            running[name].wait_health(services[name].port)
            _, program, *args = spec["healthcheck"]["test"]  # ["CMD", "python", ...]
            assert program == "python"
            check = subprocess.run([sys.executable, *args], env=running[name].env, capture_output=True, timeout=30)
            assert check.returncode == 0, check.stderr

        author = Keys(0xD0C4E5)
        a, b = services["node-a"], services["node-b"]
        for source, target, content in ((a, b, "published on node-a"), (b, a, "published on node-b")):
            event = author.sign(kind=1, content=content)
            client = await Client.connect(source.url)
            try:
                assert await client.publish(event) == ["OK", event["id"], True, ""]
            finally:
                await client.close()
            assert await served_by(target.url, event["id"]), running[target.name].stderr[-3000:]

        for name, spec in compose["services"].items():
            (secret,) = spec["secrets"]
            started = [e for e in running[name].log_events() if e.get("event") == "sync_started"]
            assert [e["node_pubkey"] for e in started] == [node_pubkey(REPO / compose["secrets"][secret]["file"])]
            (other,) = set(services) - {name}
            assert reconciled_with(running[name], services[other].url), running[name].stderr[-3000:]
            store = Path(running[name].env["RELAY_STORE__PATH"])  # the image's /data/relay.db, in this node's volume
            assert store.exists() and store.parent == services[name].mounts["/data"]


def test_relay_key_in_a_composed_container_finds_the_node_key_its_config_names(tmp_path):
    """`docker compose exec node-a relay key` (no flags, the service's environment): the pubkey of the key file
    the mounted config names, its compose secret (it looked for /data/relay.db.key and found none)."""
    compose, image = read_compose(), read_image()
    services = map_services(compose, tmp_path)
    for name, spec in compose["services"].items():
        env = service_env(services[name], image.env, spec, services, tmp_path)
        key = subprocess.run([sys.executable, "-m", "relay", "key"], env=env, capture_output=True, text=True,
                             timeout=60)
        (secret,) = spec["secrets"]
        assert key.returncode == 0, key.stderr
        assert key.stdout.strip() == node_pubkey(REPO / compose["secrets"][secret]["file"])
