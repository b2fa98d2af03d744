"""What a new operator following the README runs into: missing databases and folders, imports that store nothing,
reading without policies, `relay bans` for people, environment variables and keys in the wrong place, and paths
that do not exist, each answered in one line with the right exit code."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time

from tests.helpers import Keys
from tests.served import CLI_TIMEOUT, Served, clean_env, relay_cli

ALICE = Keys(0xA11CE)


def _lines(*events: dict) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


def _one_line(result, code: int) -> str:
    assert (result.returncode, result.stderr.count("\n")) == (code, 1), result
    return result.stderr


# --- 1. a database that does not exist --------------------------------------------------------------------

def test_import_refuses_a_missing_database_unless_create(tmp_path):
    """`relay import` from another folder (the default data/relay.db, relative) exits 2 naming the absolute
    path and --create, and creates nothing; with --create it stores into the new database."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    event = ALICE.sign(content="hello")
    refused = relay_cli("import", "-", stdin=_lines(event), cwd=elsewhere)
    err = _one_line(refused, 2)
    assert str(elsewhere / "data" / "relay.db") in err and "--create" in err, err
    assert refused.stdout == "" and not (elsewhere / "data").exists()
    created = relay_cli("import", "-", "--create", stdin=_lines(event), cwd=elsewhere)
    assert created.returncode == 0, created.stderr
    assert (elsewhere / "data" / "relay.db").exists()


def test_serve_refuses_a_missing_folder_for_a_given_database(tmp_path):
    """`relay serve --db DIR/relay.db` with DIR missing exits 2 in one line naming it, and creates no DIR."""
    db = tmp_path / "typo" / "relay.db"
    result = relay_cli("serve", "--db", db, "--port", "0")
    errors = [json.loads(line) for line in result.stderr.splitlines() if '"error"' in line]
    assert result.returncode == 2 and [e["event"] for e in errors] == ["database_unusable"], result
    assert errors[0]["path"] == str(db) and "no such directory" in errors[0]["error"], errors
    assert not (tmp_path / "typo").exists()


def test_serve_with_the_default_database_creates_data_on_a_fresh_clone(tmp_path):
    """The README's quick start: `relay serve` in a folder without data/ creates data/relay.db."""
    with Served(tmp_path, "--port", 0) as served:
        served.started_url()
    assert (tmp_path / "data" / "relay.db").exists()


# --- 3. an import whose every line is rejected --------------------------------------------------------------

def test_an_import_whose_every_line_is_rejected_exits_1_with_a_hint(tmp_path):
    """A JSON array of events (not JSONL): exit 1, and stderr says the input is not JSONL; the same file as
    JSONL stores them, and importing it again (all duplicates) exits 0."""
    db = tmp_path / "r.db"
    events = [ALICE.sign(content=str(i)) for i in range(3)]
    array = relay_cli("import", "-", "--db", db, "--create", stdin=json.dumps(events, indent=1).encode())
    assert array.returncode == 1, array
    assert "the input is not JSONL: one event object per line" in array.stderr
    jsonl = relay_cli("import", "-", "--db", db, stdin=_lines(*events))
    assert jsonl.returncode == 0 and "stored 3" in jsonl.stdout, jsonl
    again = relay_cli("import", "-", "--db", db, stdin=_lines(*events))
    assert again.returncode == 0 and "duplicate 3" in again.stdout, again


# --- 4. a piped import stores as lines arrive (the local writer; through a relay: test_through_running_relay) ---

def test_a_piped_import_stores_lines_before_the_pipe_closes(tmp_path):
    """`producer | relay import -` with no relay serving: lines written to a pipe kept open are in the database
    within a few seconds, before the pipe closes."""
    db = tmp_path / "r.db"
    assert relay_cli("import", "-", "--db", db, "--create", stdin=b"").returncode == 0
    importer = subprocess.Popen([sys.executable, "-m", "relay", "import", "-", "--db", str(db)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    try:
        importer.stdin.write(_lines(*(ALICE.sign(content=f"piped {i}") for i in range(3))))
        importer.stdin.flush()
        deadline, count = time.monotonic() + 10, 0
        while time.monotonic() < deadline and count < 3:
            time.sleep(0.1)
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                count = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        assert count == 3 and importer.poll() is None
    finally:
        out, err = importer.communicate(timeout=CLI_TIMEOUT)  # closes the pipe
    assert importer.returncode == 0 and b"stored 3" in out, (out, err)


# --- 5. reading needs no policy --------------------------------------------------------------------------

def test_record_get_needs_no_policy_module(tmp_path):
    """`relay record get` with a `[[policies]]` module that cannot be imported reads the row (exit 3: none)
    instead of failing to load it; `record put` still refuses (exit 2)."""
    config = tmp_path / "relay.toml"
    config.write_text(f'[store]\npath = "{tmp_path / "r.db"}"\n[[policies]]\ncall = "no_such_module:check"\n')
    assert relay_cli("import", "-", "--create", "--db", tmp_path / "r.db", stdin=b"").returncode == 0
    got = relay_cli("record", "get", "profiles", "--pk", json.dumps({"pubkey": ALICE.pubkey}), "--config", config)
    assert got.returncode == 3 and "no_such_module" not in got.stderr, got
    put = relay_cli("record", "put", "profiles", "--row", '{"name": "a"}', "--config", config)
    assert put.returncode == 2 and "no_such_module" in put.stderr, put


# --- 7. relay bans for people -----------------------------------------------------------------------------

def test_bans_prints_a_header_iso_times_and_words(tmp_path):
    """`relay bans`: a header line, then one row per entry with its time in ISO 8601 UTC and yes/no for
    a pubkey's purge; a kind rule of the configuration has no time."""
    db = tmp_path / "r.db"
    assert relay_cli("import", "-", "--create", "--db", db, stdin=b"").returncode == 0
    assert relay_cli("ban", "pubkey", ALICE.pubkey, "--reason", "spam", "--db", db).returncode == 0
    config = tmp_path / "relay.toml"
    config.write_text("[auth]\ndeny_kinds = [1059]\n")
    result = relay_cli("bans", "--db", db, "--config", config)
    assert result.returncode == 0, result
    header, *rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert header == ["what", "item", "rule", "reason", "at", "purging"]
    pubkey, kind = rows
    assert pubkey[:4] == ["pubkey", ALICE.pubkey, "ban", "spam"] and pubkey[5] == "no"
    assert time.strptime(pubkey[4], "%Y-%m-%dT%H:%M:%SZ")
    assert kind == ["kind", "1059", "deny", "config: [auth] deny_kinds", "", ""]
    typed = json.loads(relay_cli("bans", "--json", "--db", db).stdout)
    assert typed["pubkeys"][0]["purging"] is False and type(typed["pubkeys"][0]["at"]) is int


# --- 8, 9. environment variables and keys in the wrong place ----------------------------------------------

def test_an_environment_variable_not_of_the_settings_form_is_warned_about(tmp_path):
    """RELAY_SERVER_PORT (one underscore): one stderr line naming it, the form, and RELAY_SERVER__PORT; the
    command still runs.  RELAY_CONFIG and RELAY_TEST_WORKERS draw no warning."""
    db = tmp_path / "r.db"
    result = relay_cli("export", "--db", db, env=clean_env(RELAY_SERVER_PORT="7778", RELAY_TEST_WORKERS="0"))
    assert result.returncode == 2  # no database: the command ran
    warning = [line for line in result.stderr.splitlines() if "RELAY_SERVER_PORT" in line]
    assert len(warning) == 1 and "RELAY_<SECTION>__<KEY>" in warning[0] and "RELAY_SERVER__PORT" in warning[0]
    assert "RELAY_TEST_WORKERS" not in result.stderr
    unknown = relay_cli("export", "--db", db, env=clean_env(RELAY_SERVER__TABLES="true"))
    assert unknown.returncode == 2 and "RELAY_SERVER__TABLES" in unknown.stderr and "[http] tables" in unknown.stderr


def test_a_key_in_the_wrong_section_suggests_the_right_one(tmp_path):
    """`[server] tables = true` is an unknown key that names `[http] tables`."""
    config = tmp_path / "relay.toml"
    config.write_text("[server]\ntables = true\n")
    result = relay_cli("status", "--config", config, "--db", tmp_path / "r.db")
    err = _one_line(result, 2)
    assert "server.tables: unknown key" in err and "did you mean [http] tables?" in err, err


# --- 10. paths that do not exist --------------------------------------------------------------------------

def test_missing_paths_are_one_line_naming_them(tmp_path):
    """Each command given a path that does not exist (or whose folder does not) says so in one line naming it
    (`relay CMD: ...: no such file or directory`), exit 2, and creates nothing."""
    db = tmp_path / "r.db"
    assert relay_cli("import", "-", "--create", "--db", db, stdin=b"").returncode == 0
    missing = tmp_path / "missing"
    for command, args, path in (
            ("import", ["import", missing / "events.jsonl"], missing / "events.jsonl"),
            ("import", ["import", "-", "--rejects", missing / "r.jsonl"], missing / "r.jsonl"),
            ("backup", ["backup", missing / "copy.db"], missing / "copy.db"),
            ("export", ["export", "--output", missing / "out.jsonl"], missing / "out.jsonl")):
        result = relay_cli(*args, "--db", db, stdin=b"")
        line = _one_line(result, 2)  # checked where the command line is read (relay/arguments.py)
        assert line.startswith(f"relay {command}: ") and str(missing) in line, line
        assert "no such file or directory" in line.lower() or "no directory" in line, line
    config = relay_cli("status", "--config", missing / "relay.toml")
    assert _one_line(config, 2).endswith(f"{missing / 'relay.toml'}: no such file or directory\n"), config
    assert not missing.exists()


def test_an_output_that_is_the_database_or_beside_it_is_refused(tmp_path):
    """`relay export -o` and `relay import --rejects` naming the database, its -wal or -shm, its lock or key file
    (by another name too: a symbolic link), offline and beside a serving relay: exit 2, one line naming the
    option, and every event still there (export emptied the database, then the relay failed)."""
    db = tmp_path / "relay.db"
    lines = b"".join(json.dumps(Keys(0x51).sign(content=f"n{i}")).encode() + b"\n" for i in range(5))
    assert relay_cli("import", "-", "--create", "--db", db, stdin=lines).returncode == 0
    (tmp_path / "link.db").symlink_to(db)

    def refused_everywhere() -> None:
        for target in (db, tmp_path / "link.db", tmp_path / "relay.db-wal", tmp_path / "relay.db-shm",
                       tmp_path / "relay.db.lock", tmp_path / "relay.db.key"):
            for args, option in ((("export", "-o", target), "--output"),
                                 (("import", "-", "--rejects", target), "--rejects")):
                line = _one_line(relay_cli(*args, "--db", db, stdin=b"not json\n"), 2)
                assert f"{option} {target} is " in line and "would destroy the store" in line, line
        assert relay_cli("export", "--db", db).stdout.count("\n") == 5

    refused_everywhere()
    with Served(tmp_path, "--db", db, "--port", 0, "--workers", 0) as served:
        served.started_url()
        refused_everywhere()
        assert served.stop() == 0, served.stderr
    assert relay_cli("verify", "--db", db).returncode == 0


def test_output_that_cannot_be_written_is_one_line_exit_1(tmp_path):
    """stdout on a full disk (/dev/full), closed (`>&-`), or a reader that goes away after one line (`| head -1`,
    with more output than a pipe holds): exit 1, no traceback; one line naming the command unless the reader left
    (quiet, as other tools)."""
    db = tmp_path / "r.db"
    lines = b"".join(json.dumps(Keys(0x52).sign(content="x" * 2000, created_at=1_700_000_000 + i)).encode() + b"\n"
                     for i in range(200))
    assert relay_cli("import", "-", "--create", "--db", db, stdin=lines).returncode == 0

    def run(args, **how) -> tuple[int, str]:
        proc = subprocess.run([sys.executable, "-m", "relay", *map(str, args), "--db", str(db)], env=clean_env(),
                              stderr=subprocess.PIPE, timeout=CLI_TIMEOUT, **how)
        return proc.returncode, proc.stderr.decode()

    with open("/dev/full", "w") as full:
        for args in (["export"], ["status"], ["bans", "--json"], ["verify"], ["changes", "--since", "0"]):
            code, err = run(args, stdout=full)
            assert code == 1 and "Traceback" not in err, (args, err)
            assert err.strip().splitlines()[-1] == f"relay {args[0]}: cannot write the output: no space left on device"
    code, err = run(["export"], stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(1))
    assert (code, err) == (1, "relay export: cannot write the output: standard output is closed\n")
    export = subprocess.Popen([sys.executable, "-m", "relay", "export", "--db", str(db)], env=clean_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    export.stdout.readline()
    export.stdout.close()
    assert export.wait(CLI_TIMEOUT) == 1
    assert export.stderr.read() == b""


def test_a_file_that_is_not_a_relay_database_is_exit_2_naming_the_command(tmp_path):
    """Text, or an empty file (an import interrupted at its first instant): every reading command exits 2 with
    one line naming itself (status and backup exited 1; verify, changes, record get said `relay:`), and nothing
    is written; `relay sync` too for text (it created a node key beside it first; an empty file it fills)."""
    for content in (b"not SQLite, just text " * 10, b""):
        db = tmp_path / "not.db"
        db.write_bytes(content)
        for args in (["status"], ["backup", tmp_path / "copy.db"], ["verify"], ["projectors", "list"],
                     ["changes", "--since", "0"], ["record", "get", "profiles", "--pk", '{"pubkey": "' + "a" * 64 + '"}'],
                     *([["sync", "ws://127.0.0.1:9"]] if content else [])):
            line = _one_line(relay_cli(*args, "--db", db), 2)
            assert line.startswith(f"relay {' '.join(map(str, args[:2])) if args[0] == 'record' else args[0]}: "), line
        assert db.read_bytes() == content and not (tmp_path / "copy.db").exists()
        assert not (tmp_path / "not.db.key").exists()


def test_rebuild_refuses_a_file_that_is_not_a_relay_database(tmp_path):
    """`relay projectors rebuild` on text, an empty file or another program's SQLite database: one line, exit 2,
    the file untouched (a traceback, or the other program's database migrated)."""
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE events (x)")
    text, empty = tmp_path / "text.db", tmp_path / "empty.db"
    text.write_bytes(b"not SQLite, just text " * 10)
    empty.write_bytes(b"")
    for db in (text, empty, other):
        before = db.read_bytes()
        line = _one_line(relay_cli("projectors", "rebuild", "profiles", "--db", db), 2)
        assert line.startswith("relay projectors: database ") and str(db) in line, line
        assert db.read_bytes() == before


def test_sync_and_rebuild_refuse_a_missing_database(tmp_path):
    """A mistyped --db is refused (exit 2, one line naming it) by `relay sync` (unless --create), `relay
    projectors rebuild` and `relay status` (which exited 1), as by `relay import`: it became a new database that
    no relay reads."""
    missing = tmp_path / "typo.db"
    for args in (("sync", "ws://127.0.0.1:9"), ("projectors", "rebuild", "follows"), ("status",)):
        line = _one_line(relay_cli(*args, "--db", missing), 2)
        assert str(missing) in line and "no such database" in line, line
        assert not missing.exists()
    assert relay_cli("sync", "ws://127.0.0.1:9", "--create", "--db", missing).returncode == 1  # cannot connect
    assert missing.exists()


def test_version_prints_the_installed_package_s(tmp_path):
    """`relay --version`: `relay <version>` (pyproject.toml's, as NIP-11's `version`), exit 0."""
    from importlib.metadata import version

    result = relay_cli("--version")
    assert (result.returncode, result.stdout) == (0, f"relay {version('relay')}\n"), result
