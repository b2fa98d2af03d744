"""The Docker image and compose file, without a Docker engine: linters, and what the files promise.

hadolint lints the Dockerfile; check-jsonschema checks docker-compose.yml
against the Compose specification's JSON schema bundled in the package
(no network: every HTTP request is routed to a closed port).  The image's
health check runs for real against a relay.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import tomllib

import dockerfile

from relay.config import load_config
from tests.ops.deployment import COMPOSE_FILE, DOCKERFILE, REPO, read_compose, read_image, run_tool, tool
from tests.served import free_port


def hadolint(path) -> list[dict]:
    """hadolint's findings for the Dockerfile at `path` (JSON format, every severity counts)."""
    result = run_tool(tool("hadolint"), "--format", "json", "--failure-threshold", "style", path)
    findings = json.loads(result.stdout)
    assert (result.returncode == 0) == (findings == []), result
    return findings


def compose_schema_check(path) -> tuple[int, str]:
    """check-jsonschema against the bundled compose-spec schema: (exit code, output)."""
    result = run_tool(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", path)
    return result.returncode, result.stdout + result.stderr


def test_dockerfile_passes_hadolint():
    """hadolint finds nothing in the Dockerfile, not even style or info notes."""
    assert hadolint(DOCKERFILE) == []


def test_hadolint_reports_a_latest_base_and_a_root_user(tmp_path):
    """The linter really runs its rules: `:latest` (DL3007) and ending as root (DL3002) are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text('FROM python:latest\nUSER root\nCMD ["relay"]\n')
    assert {f["code"] for f in hadolint(bad)} >= {"DL3007", "DL3002"}


def test_compose_file_matches_the_compose_spec_offline():
    """docker-compose.yml validates against the Compose specification, with the network unreachable."""
    code, output = compose_schema_check(COMPOSE_FILE)
    assert code == 0, output
    assert "validation done" in output


def test_compose_schema_check_rejects_a_misspelt_key(tmp_path):
    """A service key the spec does not know (`prots`) fails the check, naming it."""
    bad = tmp_path / "docker-compose.yml"
    bad.write_text(COMPOSE_FILE.read_text().replace("ports:", "prots:", 1))
    code, output = compose_schema_check(bad)
    assert code == 1 and "prots" in output, output


def test_image_serves_as_non_root_on_all_interfaces_with_the_database_on_the_data_volume():
    """Final stage: a python slim base that satisfies requires-python, a numeric non-root USER, /data as
    volume and store, 0.0.0.0, port 7777, `relay serve`; its RELAY_* variables are valid settings."""
    image = read_image()
    match = re.fullmatch(r"python:3\.(\d+)-slim(-\w+)?", image.base)
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert match and requires == ">=3.11" and int(match.group(1)) >= 11, (image.base, requires)
    uid = image.user.partition(":")[0]
    assert uid.isdigit() and int(uid) != 0, image.user
    assert image.volumes == ("/data",)
    assert image.exposed == ("7777",)
    assert image.entrypoint == ("relay",) and image.cmd == ("serve",)
    config = load_config(None, {k: v for k, v in image.env.items() if k.startswith("RELAY_")})
    assert config.server.host == "0.0.0.0"
    assert config.store.path.startswith("/data/")
    assert config.log.format == "json"
    assert image.env["PATH"].startswith("/opt/relay/bin:")


def test_compose_services_use_the_image_health_check():
    """Every compose service checks health with exactly the Dockerfile's HEALTHCHECK command."""
    image = read_image()
    services = read_compose()["services"]
    assert set(services) == {"node-a", "node-b"}
    for service in services.values():
        assert service["healthcheck"]["test"] == ["CMD", *image.healthcheck]


async def _health_check(port: int) -> int:
    """Exit code of the image's HEALTHCHECK command run here, with RELAY_SERVER__PORT=port."""
    program, *args = read_image().healthcheck
    assert program == "python"
    proc = await asyncio.create_subprocess_exec(sys.executable, *args, env={"RELAY_SERVER__PORT": str(port)},
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    return await asyncio.wait_for(proc.wait(), 30)


async def test_health_check_passes_on_a_serving_relay_and_fails_on_a_closed_port(relay):
    """The HEALTHCHECK command exits 0 against a relay's /health and non-zero when nothing listens."""
    assert await _health_check(relay.port) == 0
    assert await _health_check(free_port()) != 0


def test_dockerignore_keeps_only_what_the_build_copies():
    """The build context is an allow-list: exactly the build stage's COPY sources are let back in."""
    lines = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert lines[0] == "*"
    allowed = sorted(line[1:].rstrip("/") for line in lines if line.startswith("!"))
    assert allowed == ["README.md", "pyproject.toml", "relay"]
    copies = [c for c in dockerfile.parse_file(str(DOCKERFILE)) if c.cmd == "COPY" and not c.flags]
    assert sorted(src for c in copies for src in c.value[:-1]) == allowed
