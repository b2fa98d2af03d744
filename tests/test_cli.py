"""The `relay` command line, run as real subprocesses (`python -m relay`): import, export, serve, configuration."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import re
import socket
import subprocess
import time
import tomllib
from collections import Counter
from pathlib import Path

import pytest
from coincurve import PublicKeyXOnly

from relay.config import Config, load_config
from tests.helpers import REAL_EVENTS, Client, Keys, read_jsonl
from tests.model import expected_live, first_tag
from tests.served import (
    Served,
    answers_health,
    clean_env,
    free_port,
    http_get,
    relay_cli,
)

REPO = Path(__file__).resolve().parents[1]
REPO_CONFIG = REPO / "config" / "relay.toml"
REPORT = re.compile(r"^read (\d+): stored (\d+), duplicate (\d+), older version \(not stored\) (\d+), "
                    r"ephemeral \(not stored\) (\d+), rejected (\d+)$")
REASON = re.compile(r"^  rejected (\d+): (.+)$")


# --- helpers -------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Report:
    total: int
    stored: int
    duplicate: int
    older_version: int
    ephemeral: int
    rejected: int
    reasons: Counter


def parse_report(stdout: str) -> Report:
    """The `relay import` report: the summary line and one line per rejection reason (then its line numbers)."""
    lines = stdout.splitlines()
    match = REPORT.match(lines[0])
    assert match, stdout
    reasons = Counter()
    for line in lines[1:]:
        if line.startswith("    at line"):  # the first line numbers of the reason above
            continue
        reason = REASON.match(line)
        assert reason, f"unexpected report line {line!r}"
        reasons[reason.group(2)] += int(reason.group(1))
    return Report(*map(int, match.groups()), reasons)


def check_event(event: dict) -> None:
    """Assert `event` is a valid NIP-01 event: exactly the 7 fields, id = sha256 of the preimage, BIP-340 sig."""
    assert set(event) == {"id", "pubkey", "created_at", "kind", "tags", "content", "sig"}
    preimage = json.dumps([0, event["pubkey"], event["created_at"], event["kind"], event["tags"], event["content"]],
                          separators=(",", ":"), ensure_ascii=False).encode()
    assert hashlib.sha256(preimage).hexdigest() == event["id"]
    assert PublicKeyXOnly(bytes.fromhex(event["pubkey"])).verify(bytes.fromhex(event["sig"]), bytes.fromhex(event["id"]))


def export_ids(db: Path, *args) -> list[str]:
    result = relay_cli("export", "--db", db, *args)
    assert result.returncode == 0, result.stderr
    return [json.loads(line)["id"] for line in result.stdout.splitlines()]


# --- import / export of the real events ----------------------------------------------------------------


@pytest.fixture(scope="module")
def real_events() -> list[dict]:
    return read_jsonl(REAL_EVENTS)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """REAL_EVENTS imported twice into one fresh db: (db, first run, second run)."""
    db = tmp_path_factory.mktemp("imported") / "relay.db"
    first = relay_cli("import", "--create", REAL_EVENTS, "--db", db)
    second = relay_cli("import", "--create", REAL_EVENTS, "--db", db)
    return db, first, second


@pytest.fixture(scope="module")
def exported(imported) -> list[str]:
    """Every stdout line of `relay export --db` on the imported db."""
    db, _, _ = imported
    result = relay_cli("export", "--db", db)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_import_prints_the_report_and_exits_0(imported, real_events):
    """The first import exits 0 and reports stored/duplicate/older version/ephemeral/rejected adding up to the lines,
    with reasons."""
    _, first, _ = imported
    assert first.returncode == 0, first.stderr
    report = parse_report(first.stdout)
    assert report.total == len(real_events)
    assert report.stored + report.duplicate + report.older_version + report.ephemeral + report.rejected == report.total
    assert sum(report.reasons.values()) == report.rejected
    assert report.duplicate == 0  # the file holds each id once
    assert report.ephemeral == sum(1 for e in real_events if 20000 <= e["kind"] < 30000 and e["kind"] != 22242)
    assert report.reasons["invalid: kind 22242 is sent with AUTH, not EVENT (NIP-42)"] == \
        sum(1 for e in real_events if e["kind"] == 22242)
    now = time.time()
    expired = sum(1 for e in real_events
                  if (x := first_tag(e, "expiration")) and x.isdigit() and len(x) <= 18 and int(x) <= now)
    assert report.reasons["invalid: event has expired"] == expired
    assert all(reason.split(":")[0] in ("invalid", "blocked") for reason in report.reasons), report.reasons
    assert report.stored > 0.9 * report.total


def test_second_import_finds_every_stored_event_a_duplicate(imported, exported):
    """Importing the same file again stores nothing: every live event is a duplicate, the rest refused as before or now."""
    _, first_run, second_run = imported
    assert second_run.returncode == 0, second_run.stderr
    first, second = parse_report(first_run.stdout), parse_report(second_run.stdout)
    assert second.total == first.total
    assert second.stored == 0
    assert second.duplicate == len(exported)
    assert second.ephemeral == first.ephemeral
    # Events stored the first time but later superseded or deleted are now older versions or refused;
    # nothing else changes.
    assert (second.duplicate + second.older_version + second.rejected
            == first.stored + first.duplicate + first.older_version + first.rejected)
    assert second.older_version >= first.older_version
    for reason, count in first.reasons.items():
        assert second.reasons[reason] >= count, reason


def test_export_writes_exactly_the_live_events(exported, real_events):
    """`relay export` writes one line per live event: the ids predicted by a NIP-01/09/40 model of the file, each once."""
    ids = [json.loads(line)["id"] for line in exported]
    assert len(ids) == len(set(ids))
    assert set(ids) == set(expected_live(real_events, time.time()))


def test_export_lines_are_valid_events_equal_to_the_input(exported, real_events):
    """Each exported line is a valid signed event, equal to its input line, newest first."""
    by_id = {e["id"]: e for e in real_events}
    events = [json.loads(line) for line in exported]
    for event in events:
        check_event(event)
        assert event == by_id[event["id"]]
    created = [e["created_at"] for e in events]
    assert created == sorted(created, reverse=True)


def test_export_filter_selects_only_kind_0(imported, exported):
    """`--filter '{"kinds":[0]}'` exports exactly the live kind 0 events."""
    db, _, _ = imported
    result = relay_cli("export", "--db", db, "--filter", '{"kinds":[0]}')
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert events and all(e["kind"] == 0 for e in events)
    expected = {json.loads(line)["id"] for line in exported if json.loads(line)["kind"] == 0}
    assert {e["id"] for e in events} == expected


def test_export_to_output_file_with_author_filter(imported, exported, tmp_path):
    """`--output FILE` with an authors filter writes that author's live events to the file and nothing to stdout."""
    db, _, _ = imported
    all_events = [json.loads(line) for line in exported]
    author = Counter(e["pubkey"] for e in all_events).most_common(1)[0][0]
    out = tmp_path / "author.jsonl"
    result = relay_cli("export", "--db", db, "--filter", json.dumps({"authors": [author]}), "--output", out)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert [e["id"] for e in read_jsonl(out)] == [e["id"] for e in all_events if e["pubkey"] == author]


def test_export_search_filter_exports_matches_and_is_refused_with_search_disabled(imported, exported):
    """`--filter '{"search": ...}'` exports only events of indexed kinds holding the word; with `[search]
    enabled = false` there is no index, so the filter is refused (exit 2), not a traceback."""
    db, _, _ = imported
    word = "bitcoin"
    result = relay_cli("export", "--db", db, "--filter", json.dumps({"search": word, "kinds": [1]}))
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert events and all(e["kind"] == 1 and word in e["content"].lower() for e in events)
    disabled = relay_cli("export", "--db", db, "--filter", json.dumps({"search": word}),
                         env=clean_env(RELAY_SEARCH__ENABLED="false"))
    assert disabled.returncode == 2 and "bad --filter: invalid: search is disabled" in disabled.stderr
    assert disabled.stdout == ""


@pytest.mark.parametrize("bad", ["not json", '{"kinds":"x"}'])
def test_export_bad_filter_exits_2(tmp_path, bad):
    """A malformed `--filter` stops export with exit code 2, a message naming --filter, writing nothing."""
    db = tmp_path / "x.db"
    result = relay_cli("export", "--db", db, "--filter", bad)
    assert result.returncode == 2
    assert "argument --filter: " in result.stderr
    assert result.stdout == ""
    assert not db.exists()


def test_import_counts_each_outcome_with_its_reason(tmp_path):
    """A crafted stdin import: stored, duplicate, ephemeral and five refusals, each with its NIP-01 reason."""
    alice = Keys(0xA11CE)
    now = int(time.time())
    good = alice.sign(content="good")
    bad_sig = alice.sign(content="bad sig")
    bad_sig["sig"] = good["sig"]
    bad_id = dict(alice.sign(content="original"), content="tampered")
    lines = [
        json.dumps(good),
        json.dumps(good),
        "",
        json.dumps(alice.sign(kind=20001, content="ephemeral")),
        json.dumps(bad_sig),
        json.dumps(bad_id),
        "{not json",
        json.dumps(alice.sign(content="future", created_at=now + 3600)),
        json.dumps(alice.sign(content="expired", tags=[["expiration", str(now - 60)]])),
    ]
    db = tmp_path / "crafted.db"
    result = relay_cli("import", "--create", "-", "--db", db, stdin=("\n".join(lines) + "\n").encode())
    assert result.returncode == 0, result.stderr
    report = parse_report(result.stdout)
    assert (report.total, report.stored, report.duplicate, report.older_version, report.ephemeral,
            report.rejected) == (8, 1, 1, 0, 1, 5)
    assert report.reasons == Counter({
        "invalid: bad signature": 1,
        "invalid: event id does not match": 1,
        "invalid: malformed JSON": 1,
        "invalid: created_at is too far in the future": 1,
        "invalid: event has expired": 1,
    })
    assert export_ids(db) == [good["id"]]


def test_import_counts_an_older_version_apart_from_rejections(tmp_path):
    """A replaceable or addressable line older than the version the relay holds ("duplicate: have a newer
    version") counts as an older version, not a rejection; a version stored, then superseded by a later line
    of the same file, counts as stored."""
    alice = Keys(0xA11CE)
    now = int(time.time())
    profile_old, profile_new = (alice.sign(kind=0, content=c, created_at=now - age) for c, age in (("a", 20), ("b", 10)))
    article_new, article_old = (alice.sign(kind=30023, tags=[["d", "x"]], content=c, created_at=now - age)
                                for c, age in (("v2", 10), ("v1", 20)))
    db = tmp_path / "versions.db"
    lines = (profile_old, profile_new, article_new, article_old)
    result = relay_cli("import", "--create", "-", "--db", db, stdin="".join(json.dumps(e) + "\n" for e in lines).encode())
    assert result.returncode == 0, result.stderr
    report = parse_report(result.stdout)
    assert (report.total, report.stored, report.duplicate, report.older_version, report.ephemeral,
            report.rejected) == (4, 3, 0, 1, 0, 0)
    assert report.reasons == Counter()
    assert sorted(export_ids(db)) == sorted([profile_new["id"], article_new["id"]])


def test_import_keeps_out_the_kinds_the_relay_does_not_accept(tmp_path):
    """`[auth] deny_kinds` (and `allow_kinds`) hold for imported lines as for a client's EVENT: "blocked:"."""
    alice = Keys(0xA11CE)
    note, reaction, profile = (alice.sign(kind=k, content=str(k)) for k in (1, 7, 0))
    config = tmp_path / "relay.toml"
    config.write_text("[auth]\nallow_kinds = [0, 1, 7]\ndeny_kinds = [7]\n")
    db = tmp_path / "kinds.db"
    result = relay_cli("import", "--create", "-", "--config", config, "--db", db,
                       stdin="".join(json.dumps(e) + "\n" for e in (note, reaction, profile,
                                                                    alice.sign(kind=3, content="3"))).encode())
    assert result.returncode == 0, result.stderr
    report = parse_report(result.stdout)
    assert (report.total, report.stored, report.rejected) == (4, 2, 2)
    assert report.reasons == Counter({"blocked: kind 7 is not accepted here": 1,
                                      "blocked: kind 3 is not accepted here": 1})
    assert sorted(export_ids(db)) == sorted([note["id"], profile["id"]])


def test_import_of_a_missing_file_exits_2(tmp_path):
    """`relay import` of a file that does not exist exits 2 naming the file."""
    result = relay_cli("import", "--create", tmp_path / "nope.jsonl", "--db", tmp_path / "x.db")
    assert result.returncode == 2
    assert "nope.jsonl" in result.stdout + result.stderr


def test_only_serve_logs_the_configuration_it_loaded(tmp_path):
    """Other commands' stderr is for the person who ran them: no `config_loaded` log line (serve logs it)."""
    result = relay_cli("export", "--db", tmp_path / "absent.db")
    assert result.returncode == 2
    assert result.stderr.strip() == (f"relay export: database {tmp_path / 'absent.db'}: no such database (give the "
                                     "database the relay serves with --db or --config)")
    with Served(tmp_path, "--db", tmp_path / "served.db", "--port", 0) as served:
        served.started_url()
        assert any(entry.get("event") == "config_loaded" for entry in served.log_events())


def test_db_path_from_environment(tmp_path):
    """Without `--db`, RELAY_STORE__PATH chooses the database for import and export."""
    db = tmp_path / "env.db"
    event = Keys(0xB0B).sign(content="via env")
    env = clean_env(RELAY_STORE__PATH=str(db))
    result = relay_cli("import", "--create", "-", stdin=json.dumps(event).encode(), env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert parse_report(result.stdout).stored == 1
    assert db.exists()
    assert export_ids(db) == [event["id"]]


# --- serve ----------------------------------------------------------------------------------------------


CUSTOM_CONFIG = """\
[info]
name = "cli-test-relay"
description = "started by tests/test_cli.py"
contact = "mailto:test@example.invalid"

[limits]
max_message_bytes = 1200000
max_subscriptions = 7
max_filters = 5
default_limit = 100
max_limit = 300
max_event_tags = 321
max_content_bytes = 4096
max_created_at_future_seconds = 60
"""


async def _publish_and_query(url: str, events: list[dict]) -> tuple[list[list], list[dict]]:
    """Publish `events` over a WebSocket, then REQ them by id: (OK replies, stored events)."""
    client = await Client.connect(url, open_timeout=5)
    try:
        oks = [await client.publish(e) for e in events]
        stored = await client.req("q", {"ids": [e["id"] for e in events]})
    finally:
        await client.close()
    return oks, stored


def test_serve_nip11_publish_sigterm_and_persist(tmp_path):
    """`relay serve`: /health, NIP-11 (CORS, nips, limits from --config), publish, SIGTERM exit 0, event kept across restart."""
    config = tmp_path / "relay.toml"
    config.write_text(CUSTOM_CONFIG)
    db = tmp_path / "served.db"
    port = free_port()
    event = Keys(0xA11CE).sign(content="persist me")
    too_long = Keys(0xA11CE).sign(content="x" * 5000)
    with Served(tmp_path, "--config", config, "--db", db, "--port", port) as served:
        served.wait_health(port)
        status, headers, body = http_get(port, "/", {"Accept": "application/nostr+json"})
        assert status == 200
        assert headers["Content-Type"] == "application/nostr+json"
        assert headers["Access-Control-Allow-Origin"] == "*"
        doc = json.loads(body)
        assert doc["name"] == "cli-test-relay"
        assert doc["description"] == "started by tests/test_cli.py"
        assert doc["contact"] == "mailto:test@example.invalid"
        assert {1, 11}.issubset(doc["supported_nips"])
        limits = load_config(config).limits
        assert {k: doc["limitation"][k] for k in (
            "max_message_length", "max_subscriptions", "max_filters", "max_limit", "default_limit",
            "max_event_tags", "max_content_length", "created_at_upper_limit")} == {
            "max_message_length": limits.max_message_bytes, "max_subscriptions": limits.max_subscriptions,
            "max_filters": limits.max_filters, "max_limit": limits.max_limit,
            "default_limit": limits.default_limit, "max_event_tags": limits.max_event_tags,
            "max_content_length": limits.max_content_bytes,
            "created_at_upper_limit": limits.max_created_at_future_seconds,
        } == {"max_message_length": 1200000, "max_subscriptions": 7, "max_filters": 5, "max_limit": 300,
              "default_limit": 100, "max_event_tags": 321, "max_content_length": 4096,
              "created_at_upper_limit": 60}
        oks, stored = asyncio.run(_publish_and_query(f"ws://127.0.0.1:{port}", [event, too_long]))
        assert oks[0] == ["OK", event["id"], True, ""]
        assert oks[1][2] is False and oks[1][3].startswith("invalid:")  # max_content_bytes from the file applies
        assert stored == [event]
        assert served.stop() == 0
        assert any(e.get("event") == "relay_stopped" for e in served.log_events())
    assert export_ids(db) == [event["id"]]
    port = free_port()
    with Served(tmp_path, "--db", db, "--port", port) as restarted:
        restarted.wait_health(port)
        client_events = asyncio.run(_req_all(f"ws://127.0.0.1:{port}"))
        assert [e["id"] for e in client_events] == [event["id"]]
        assert restarted.stop() == 0


async def _req_all(url: str) -> list[dict]:
    client = await Client.connect(url, open_timeout=5)
    try:
        return await client.req("all", {})
    finally:
        await client.close()


def test_serve_port_0_picks_a_free_port(tmp_path):
    """`relay serve --port 0` listens on some free port, announced in the `relay_started` log line, and answers /health."""
    with Served(tmp_path, "--db", tmp_path / "p0.db", "--port", 0) as served:
        url = served.started_url()
        match = re.fullmatch(r"ws://127\.0\.0\.1:(\d+)", url)
        assert match, url
        port = int(match.group(1))
        assert port != 0
        served.wait_health(port)
        assert served.stop() == 0


def test_serve_on_a_busy_port_exits_promptly_with_an_error(tmp_path):
    """`relay serve --port P` while P is taken exits non-zero within seconds, naming the problem (it must not hang)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with Served(tmp_path, "--db", tmp_path / "busy.db", "--port", port) as served:
            try:
                code = served.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pytest.fail(f"relay serve on busy port {port} still running after 10 s:\n{served.stderr[-1500:]}")
            assert code != 0
            assert "in use" in served.stderr


# --- configuration --------------------------------------------------------------------------------------


def _main_in_process(argv: list, env: dict, monkeypatch, capsys) -> tuple[int, str]:
    """`relay.cli.main(argv)` in this process with exactly the RELAY_* variables of `env`: (exit code, stderr).

    Only for configurations that must be refused: a tripwire on `configure_logging` (the first step after
    the configuration is accepted) fails the test instead of letting it serve forever or reconfigure
    this process's logging.
    """
    import relay.cli
    from relay.cli import main

    def accepted(*_args, **_kwargs):
        raise AssertionError(f"configuration was accepted: {argv} {env}")

    monkeypatch.setattr(relay.cli, "configure_logging", accepted)
    for name in [n for n in os.environ if n.startswith("RELAY_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("toml, env, named", [
    ("[server]\nnope = 1\n", {}, "server.nope"),
    ('[server]\nport = "x"\n', {}, "server.port"),
    ("", {"RELAY_LIMITS__NOPE": "1"}, "limits.nope"),
], ids=["unknown-key-in-file", "port-str-in-file", "RELAY_LIMITS__NOPE"])
def test_bad_configuration_stops_serve_subprocess(tmp_path, toml, env, named):
    """`relay serve` (subprocess) with an unknown key, a bad value or an unknown env key exits 2 naming it, before listening."""
    config = tmp_path / "bad.toml"
    config.write_text(toml)
    db = tmp_path / "x.db"
    result = relay_cli("serve", "--config", config, "--db", db, "--port", free_port(), env=clean_env(**env))
    assert result.returncode == 2
    assert result.stderr.startswith("relay: configuration error:")
    assert named in result.stderr
    assert "relay_started" not in result.stderr
    assert not db.exists()


@pytest.mark.parametrize("toml, named", [
    ("[server]\nnope = 1\n", "server.nope: unknown key"),
    ("[limits]\nmax_limits = 10\n", "limits.max_limits: unknown key"),
    ("[bogus]\nx = 1\n", "bogus: unknown section"),
    ("server = 1\n", "server: must be a table"),
    ('[server]\nport = "x"\n', "server.port"),
    ("[server]\nport = 70000\n", "server.port"),
    ("[server]\nport = -1\n", "server.port"),
    ('[store]\nsynchronous = "sometimes"\n', "store.synchronous"),
    ('[log]\nlevel = "loud"\n', "log.level"),
    ("[limits]\ndefault_limit = 10\nmax_limit = 5\n", "limits.default_limit"),
    ("[limits]\nmax_subscriptions = 1.5\n", "limits.max_subscriptions"),
    ("[limits]\nmax_subscriptions = true\n", "limits.max_subscriptions"),
    ("[server\nport = 1\n", "bad.toml"),
], ids=["server.nope", "limits.max_limits", "section-bogus", "section-not-table", "port-str", "port-too-big",
        "port-negative", "synchronous-choice", "log-level", "default>max", "float-for-int", "bool-for-int",
        "toml-syntax"])
@pytest.mark.parametrize("command", ["serve", "import", "export"])
def test_bad_config_file_exits_2_naming_the_key(tmp_path, monkeypatch, capsys, toml, named, command):
    """Every subcommand refuses a `--config` with an unknown key/section or a bad value: exit 2, message naming it."""
    config = tmp_path / "bad.toml"
    config.write_text(toml)
    extra = {"serve": ["--port", free_port()], "import": [REAL_EVENTS], "export": []}[command]
    code, err = _main_in_process([command, "--config", config, "--db", tmp_path / "x.db", *extra], {},
                                 monkeypatch, capsys)
    assert code == 2
    assert err.startswith("relay: configuration error:")
    assert named in err
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize("name, value, named", [
    ("RELAY_LIMITS__NOPE", "1", "limits.nope"),
    ("RELAY_NOPE__PORT", "1", "RELAY_NOPE__PORT"),
    ("RELAY_SERVER__PORT", "x", "server.port"),
    ("RELAY_SERVER__PORT", "70000", "server.port"),
    ("RELAY_LIMITS__MAX_LIMIT", "-3", "limits.max_limit"),
    ("RELAY_STORE__SYNCHRONOUS", "sometimes", "store.synchronous"),
])
def test_bad_environment_variable_exits_2_naming_it(tmp_path, monkeypatch, capsys, name, value, named):
    """An unknown RELAY_<SECTION>__<KEY> variable, or a bad value in one, exits 2 naming it."""
    code, err = _main_in_process(["serve", "--db", tmp_path / "x.db", "--port", free_port()], {name: value},
                                 monkeypatch, capsys)
    assert code == 2
    assert err.startswith("relay: configuration error:")
    assert named in err


def test_bad_flag_value_exits_2(tmp_path):
    """`--port 70000` (a flag) is refused where the command line is read: exit 2, one line naming --port and
    the range (as `server.port` is in a file or the environment)."""
    done = relay_cli("serve", "--db", tmp_path / "x.db", "--port", 70000)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done
    assert "argument --port: a TCP port is a whole number 0..65535" in done.stderr


def test_environment_overrides_file_and_flag_overrides_environment(tmp_path):
    """Port precedence, observed by who answers /health: file < RELAY_SERVER__PORT < --port."""
    file_port, env_port, flag_port = free_port(), free_port(), free_port()
    assert len({file_port, env_port, flag_port}) == 3
    config = tmp_path / "relay.toml"
    config.write_text(f"[server]\nport = {file_port}\n")
    env = clean_env(RELAY_SERVER__PORT=str(env_port))
    db = tmp_path / "prec.db"
    with Served(tmp_path, "--config", config, "--db", db, env=env) as served:
        served.wait_health(env_port)
        assert served.started_url() == f"ws://127.0.0.1:{env_port}"
        assert not answers_health(file_port)
        assert served.stop() == 0
    with Served(tmp_path, "--config", config, "--db", db, "--port", flag_port, env=env) as served:
        served.wait_health(flag_port)
        assert served.started_url() == f"ws://127.0.0.1:{flag_port}"
        assert not answers_health(env_port)
        assert not answers_health(file_port)
        assert served.stop() == 0


def test_file_port_used_without_env_or_flag(tmp_path):
    """With only `--config`, the file's port is the one that answers /health."""
    port = free_port()
    config = tmp_path / "relay.toml"
    config.write_text(f"[server]\nport = {port}\n")
    with Served(tmp_path, "--config", config, "--db", tmp_path / "f.db") as served:
        served.wait_health(port)
        assert served.started_url() == f"ws://127.0.0.1:{port}"
        assert served.stop() == 0


def test_shipped_config_equals_builtin_defaults():
    """config/relay.toml parses and is exactly the built-in defaults."""
    assert load_config(REPO_CONFIG) == Config()
    assert load_config(REPO_CONFIG, {}, None) == load_config(None)


def test_shipped_config_lists_every_key():
    """Every key of every dataclass section of Config appears in config/relay.toml, and no key it does not have."""
    data = tomllib.loads(REPO_CONFIG.read_text(encoding="utf-8"))
    sections = [f for f in dataclasses.fields(Config)
                if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory)]
    assert {"server", "info", "limits", "store", "log"} <= {f.name for f in sections}
    for section in sections:
        assert section.name in data, f"[{section.name}] missing from {REPO_CONFIG}"
        expected = {f.name for f in dataclasses.fields(section.default_factory)}
        assert set(data[section.name]) == expected, section.name


def test_serve_with_peers_and_an_unreadable_node_key_exits_2_naming_it(tmp_path):
    """`relay serve` with [[sync.peers]] and a key file holding no key: exit 2, logged with the file's path; no
    traceback (found by a walkthrough: it died with NodeKeyError and exit 1)."""
    key = tmp_path / "node.key"
    key.write_text("not a key\n")
    config = tmp_path / "peers.toml"
    config.write_text(f'[sync]\nsecret_key_file = "{key}"\n[[sync.peers]]\nurl = "ws://127.0.0.1:9"\n')
    result = relay_cli("serve", "--config", config, "--db", tmp_path / "k.db", "--port", 0)
    assert result.returncode == 2, result.stderr
    assert "node_key_unavailable" in result.stderr and str(key) in result.stderr
    assert "Traceback" not in result.stderr
    # checked before anything opens or listens (it was logged after relay_started)
    assert "relay_started" not in result.stderr and not (tmp_path / "k.db").exists()


@pytest.mark.parametrize("argv", [
    ["record", "--db", "GROUP.db", "--config", "GROUP.toml", "get", "profiles", "--pk", "{}"],
    ["record", "--db", "GROUP.db", "--config", "GROUP.toml", "put", "profiles", "--row", "{}"],
    ["projectors", "--db", "GROUP.db", "--config", "GROUP.toml", "list"],
])
def test_options_given_before_a_group_action_are_kept(argv):
    """`relay record --db X put ...` once wrote to data/relay.db: the action's parser reset --db and --config."""
    from relay.cli import _parser

    args = _parser().parse_args(argv)
    assert (args.db, str(args.config)) == ("GROUP.db", "GROUP.toml")
    after = _parser().parse_args([*argv[:1], *argv[5:], "--db", "ACTION.db"])
    assert after.db == "ACTION.db"
