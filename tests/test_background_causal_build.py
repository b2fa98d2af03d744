"""A causal projector ([[causal_projectors]] in TOML) built while `relay serve` serves
(relay/store/projectors/causal_build.py): after a SIGKILL mid-build the restarted relay resumes from the checkpoint;
while it builds, `relay status` says `building (n of N)` and `relay verify` and `relay query` exit 3; at the end
`relay verify` replays every log and agrees."""

from __future__ import annotations

import hashlib
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest

from tests.causal_app import TOML
from tests.served import Served, clean_env, free_port, relay_cli
from tests.test_background_build import _progress, _wait, stored_without_projectors

LOGS, LENGTH = 100, 100
OPS = LOGS * LENGTH
"""Operations of kind 4242: LOGS chains (one author each) of LENGTH operations, stored seq by seq across logs."""
REPO = Path(__file__).resolve().parents[1]


def _operations() -> list[dict]:
    # Stored straight through the store's writer, which checks ids but not signatures (ingest does).
    out, prev = [], {}
    for seq in range(LENGTH):
        for n in range(LOGS):
            pubkey = f"{n + 1:064x}"
            tags = [["log", "doc"], ["seq", str(seq)]] + ([["prev", prev[n]]] if seq else [])
            content = json.dumps({"key": f"k{seq % 3}", "value": f"v{seq}"})
            body = [0, pubkey, 1_700_000_000 + seq, 4242, tags, content]
            prev[n] = hashlib.sha256(orjson.dumps(body)).hexdigest()
            out.append({"id": prev[n], "pubkey": pubkey, "created_at": body[2], "kind": 4242, "tags": tags,
                        "content": content, "sig": "00" * 64})
    return out


@pytest.fixture(scope="module")
def ops_store(tmp_path_factory) -> Path:
    """A database of OPS operations and no projector (written once per module)."""
    return stored_without_projectors(tmp_path_factory.mktemp("ops"), _operations())


def _config(tmp_path: Path, batch: int, port: int) -> Path:
    """A config adding the `docs` causal projector (tests/causal_app.py), built `batch` events a step."""
    config = tmp_path / "relay.toml"
    config.write_text(f'[server]\nport = {port}\n[store]\npath = "{tmp_path / "relay.db"}"\n'
                      f"projector_build_batch = {batch}\n" + TOML.format(revision=1), encoding="utf-8")
    return config


def test_a_causal_build_killed_mid_way_resumes_and_is_refused_to_readers_until_done(tmp_path, ops_store):
    """SIGKILL after some steps; the restarted relay (smaller steps) reads only the events after the checkpoint,
    and the CLI says the projector is being built until it is done."""
    shutil.copy(ops_store, tmp_path / "relay.db")
    env, port = clean_env(PYTHONPATH=str(REPO)), free_port()  # `tests.causal_app` importable by the relay
    with Served(tmp_path, "--config", _config(tmp_path, 20, port), env=env) as served:
        served.wait_health(port)
        _wait(lambda: (_progress(tmp_path, "docs") or {}).get("done", 0) >= 1000)
        served.kill()
    done = _progress(tmp_path, "docs")["done"]
    assert 1000 <= done < OPS
    config = _config(tmp_path, 1, port)  # the batch is not part of the spec: the build resumes, seconds long
    with Served(tmp_path, "--config", config, env=env) as served:
        served.wait_health(port)
        with ThreadPoolExecutor(3) as pool:  # at once: the build goes on meanwhile
            status, verify, query = pool.map(lambda args: relay_cli(*args, "--config", config, env=env), [
                ("status", "--json"), ("verify",), ("query", "doc_values")])
        _wait(lambda: _progress(tmp_path, "docs") is None)
        logs = {entry["event"]: entry for entry in served.log_events() if entry.get("projector") == "docs"}
    state = next(p for p in json.loads(status.stdout)["projectors"] if p["name"] == "docs")["state"]
    assert state.startswith("building (") and state.endswith(f" of {OPS})"), state
    assert verify.returncode == 3 and "docs: building (" in verify.stdout, verify.stdout + verify.stderr
    assert query.returncode == 3 and "doc_values is being built" in query.stderr, query.stderr
    assert "projector_build_started" not in logs  # not from the start again
    assert logs["projector_build_resumed"]["events_done"] == done
    assert logs["projector_build_finished"]["events_read"] == OPS - done
    verify = relay_cli("verify", "--config", config, env=env)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "docs.doc_values: ok" in verify.stdout and "docs.causal_ops: ok" in verify.stdout
    assert f"docs.doc_history: ok, {OPS} rows" in verify.stdout
