"""`relay import`: where each rejection is (line numbers, `--rejects FILE`) and Ctrl-C (a summary, exit 130)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from tests.helpers import DATA, REAL_EVENTS, Keys
from tests.served import CLI_TIMEOUT, clean_env, relay_cli
from tests.test_cli import REPORT, parse_report


def test_rejections_name_their_lines_and_go_to_the_rejects_file(tmp_path):
    """The summary lists the first line numbers of each reason (blank lines counted); `--rejects` gets one JSON
    object per rejected line with its number, id (when the line has one), reason and text."""
    alice = Keys(0xA11CE)
    good = alice.sign(content="good")
    bad_id = dict(alice.sign(content="original"), content="tampered")
    lines = [json.dumps(good), "", "{not json", json.dumps(bad_id), "[1, 2]", "{not json either"]
    rejects = tmp_path / "rejects.jsonl"
    result = relay_cli("import", "--create", "-", "--db", tmp_path / "r.db", "--rejects", rejects,
                       stdin=("\n".join(lines) + "\n").encode())
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert out[1:] == ["  rejected 2: invalid: malformed JSON", "    at lines 3, 6",
                       "  rejected 1: invalid: event id does not match", "    at line 4",
                       "  rejected 1: invalid: event must be a JSON object", "    at line 5"]
    written = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert written == [
        {"line": 3, "id": None, "reason": "invalid: malformed JSON", "text": "{not json"},
        {"line": 4, "id": bad_id["id"], "reason": "invalid: event id does not match", "text": lines[3]},
        {"line": 5, "id": None, "reason": "invalid: event must be a JSON object", "text": "[1, 2]"},
        {"line": 6, "id": None, "reason": "invalid: malformed JSON", "text": "{not json either"},
    ]


def test_ctrl_c_during_an_import_prints_the_summary_and_exits_130(tmp_path):
    """SIGINT while a large file is being imported: the counts of the lines done, one line saying it was
    interrupted, exit 130, no traceback (there were two KeyboardInterrupt tracebacks and no summary)."""
    source = tmp_path / "big.jsonl"
    source.write_bytes(REAL_EVENTS.read_bytes() * 8)
    db = tmp_path / "big.db"
    proc = subprocess.Popen([sys.executable, "-m", "relay", "import", "--create", str(source), "--db", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    deadline = time.monotonic() + CLI_TIMEOUT
    while not db.with_name("big.db-wal").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    time.sleep(0.5)  # into the import proper
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=CLI_TIMEOUT)
    out, err = out.decode(), err.decode()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    report = parse_report(out)
    assert report.total < 8 * len(REAL_EVENTS.read_bytes().splitlines())
    assert f"relay import: interrupted; the summary counts the {report.total} lines done" in err
    assert REPORT.match(out.splitlines()[0])


EVENTS = DATA / "events" / "lnbits-nostrrelay.jsonl"


def _import(*args, stdin=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "relay", "import", "--create", *map(str, args)], stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())


def test_a_fifo_is_imported_whole(tmp_path):
    """A named FIFO (as `<(cat FILE)` gives) is read once: every event stored (it was counted first, which
    emptied it, and the import read 0 lines)."""
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    proc = _import(fifo, "--db", tmp_path / "r.db", stdin=subprocess.DEVNULL)
    with fifo.open("wb") as writer:  # blocks until the import opens the FIFO
        writer.write(EVENTS.read_bytes())
    out, err = proc.communicate(timeout=CLI_TIMEOUT)
    assert proc.returncode == 0, err
    assert parse_report(out.decode()).stored == len(EVENTS.read_bytes().splitlines()) == 23


def test_rejects_naming_the_input_is_refused_and_the_input_kept(tmp_path):
    """`--rejects` naming the input file (or a hard link to it) exits 2 with one line; the input is intact
    (opening the rejects file emptied it, and the import read 0 lines)."""
    source = tmp_path / "events.jsonl"
    source.write_bytes(EVENTS.read_bytes())
    os.link(source, tmp_path / "link.jsonl")
    for rejects in (source, tmp_path / "link.jsonl"):
        done = relay_cli("import", "--create", source, "--db", tmp_path / "r.db", "--rejects", rejects)
        assert (done.returncode, done.stdout, done.stderr.count("\n")) == (2, "", 1), done.stderr
        assert "is the input" in done.stderr
    assert source.read_bytes() == EVENTS.read_bytes()


def test_rejects_naming_the_input_pipe_is_refused_and_dev_null_is_not(tmp_path):
    """`cat FILE | relay import - --rejects /dev/stdin` exits 2 with one line, at once (opening the pipe for
    writing held its write end: the import never saw the input end); a character device such as /dev/null
    may be both input and rejects."""
    done = relay_cli("import", "--create", "-", "--db", tmp_path / "r.db", "--rejects", "/dev/stdin",
                     stdin=EVENTS.read_bytes())
    assert (done.returncode, done.stdout, done.stderr.count("\n")) == (2, "", 1), done.stderr
    assert "--rejects /dev/stdin is the input" in done.stderr
    with open(os.devnull, "rb") as null:
        assert _import(os.devnull, "--db", tmp_path / "r.db", "--rejects", os.devnull, stdin=null).wait(
            CLI_TIMEOUT) == 0


def test_ctrl_c_on_a_stalled_pipe_imports_what_was_read_and_exits_130(tmp_path):
    """SIGINT while stdin stays open with no more data: exit 130 within seconds, the lines already read
    (fewer than a chunk) stored and counted (it waited for the pipe to close, then imported)."""
    db = tmp_path / "r.db"
    proc = _import("-", "--db", db)
    lines = EVENTS.read_bytes().splitlines(keepends=True)[:5]
    proc.stdin.write(b"".join(lines))
    proc.stdin.flush()
    deadline = time.monotonic() + CLI_TIMEOUT
    while not db.with_name("r.db-wal").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(1)  # the lines are read; the reader waits on the pipe
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=10)
    finally:
        proc.stdin.close()
        proc.kill()
    assert proc.returncode == 130, err
    assert parse_report(out.decode()).stored == 5
    assert "the summary counts the 5 lines done" in err.decode()


def _import_long_line(tmp_path, mebibytes: int) -> tuple[str, int]:
    """Import an event, a line `mebibytes` MiB long, an event, through a pipe: (stdout, peak RSS in KiB).

    The peak counts the test process's own size too (Linux keeps the largest RSS across exec): compare two.
    """
    events = EVENTS.read_bytes().splitlines(keepends=True)
    proc = _import("-", "--db", tmp_path / f"{mebibytes}.db", "--rejects", tmp_path / f"{mebibytes}.jsonl")

    def feed() -> None:
        proc.stdin.write(events[0] + b'{"content": "')
        for _ in range(mebibytes):
            proc.stdin.write(b"x" * 2**20)
        proc.stdin.write(b'"}\n' + events[1])
        proc.stdin.close()

    writer = threading.Thread(target=feed)
    writer.start()
    out = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    writer.join()
    assert os.waitstatus_to_exitcode(status) == 0
    return out, usage.ru_maxrss


def test_a_line_past_max_message_bytes_is_rejected_without_holding_it(tmp_path):
    """A 100 MB line between two events: rejected as "invalid: line longer than N bytes" at its line number
    (an empty `text` in --rejects), the events around it stored, and the import's peak memory does not grow
    with it (it was read whole, ~3x its size at peak)."""
    out, peak = _import_long_line(tmp_path, 100)
    assert out.splitlines()[1:] == ["  rejected 1: invalid: line longer than 1048576 bytes", "    at line 2"]
    assert parse_report(out).stored == 2
    assert [json.loads(line) for line in (tmp_path / "100.jsonl").read_text().splitlines()] == [
        {"line": 2, "id": None, "reason": "invalid: line longer than 1048576 bytes", "text": ""}]
    assert peak - _import_long_line(tmp_path, 0)[1] < 40 * 1024  # KiB: a few blocks of the line at most


def test_checking_processes_and_this_process_agree(tmp_path):
    """`--processes 2` (lines checked in processes of their own) and `--processes 0` (this process's threads) give
    the same report, the same rejects and the same stored events, on real events with bad lines among them: a
    tampered id, a bad signature, malformed JSON, a banned author, an expired event, and a duplicate."""
    alice, mallory = Keys(0xA11CE), Keys(0xBAD)
    real = REAL_EVENTS.read_bytes().splitlines()[:600]
    bad_sig = dict(alice.sign(content="signed"), sig="00" * 64)
    lines = [*real[:300], json.dumps(dict(alice.sign(content="x"), content="tampered")).encode(),
             json.dumps(bad_sig).encode(), b"{not json", json.dumps(mallory.sign(content="banned author")).encode(),
             json.dumps(alice.sign(tags=[["expiration", "1000"]], content="expired")).encode(),
             *real[300:], real[5]]
    outputs = {}
    for processes in (0, 2):
        db, rejects = tmp_path / f"p{processes}.db", tmp_path / f"rejects{processes}.jsonl"
        assert relay_cli("import", "--create", "-", "--db", db, stdin=b"").returncode == 0
        assert relay_cli("ban", "pubkey", mallory.pubkey, "--db", db).returncode == 0
        done = relay_cli("import", "-", "--db", db, "--rejects", rejects, "--processes", processes,
                         stdin=b"\n".join(lines) + b"\n")
        assert done.returncode == 0 and "Traceback" not in done.stderr, done
        exported = relay_cli("export", "--db", db)
        outputs[processes] = (done.stdout, rejects.read_text(), sorted(exported.stdout.splitlines()))
    report = parse_report(outputs[2][0])
    assert report.stored + report.older_version + report.duplicate >= 590 and report.rejected == 5, \
        outputs[2][0]
    assert outputs[2] == outputs[0]


def test_ctrl_c_to_the_process_group_during_an_import_with_checking_processes(tmp_path):
    """Ctrl-C reaches the whole foreground process group, the checking processes too: they leave it to the
    command, which prints its summary and exits 130, and no process prints a traceback."""
    source = tmp_path / "big.jsonl"
    source.write_bytes(REAL_EVENTS.read_bytes() * 8)
    proc = _interrupted_import(source, tmp_path / "big.db", 0.5)
    out, err = proc.communicate(timeout=CLI_TIMEOUT)
    out, err = out.decode(), err.decode()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert REPORT.match(out.splitlines()[0])


def _interrupted_import(source, db, after_seconds: float) -> subprocess.Popen:
    """`relay import --create SOURCE --db DB --processes 2` in a process group of its own, sent SIGINT as a
    terminal's Ctrl-C does (the whole group) `after_seconds` into its writing; its stdout and stderr piped."""
    proc = subprocess.Popen([sys.executable, "-m", "relay", "import", "--create", str(source), "--db", str(db),
                             "--processes", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(),
                            start_new_session=True)
    deadline = time.monotonic() + CLI_TIMEOUT
    while not db.with_name(db.name + "-wal").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    time.sleep(after_seconds)
    os.killpg(proc.pid, signal.SIGINT)
    return proc


def _unique_events(path, n: int) -> None:
    """`n` distinct kind-1 events (no supersession: each line stored is one event held)."""
    keys = Keys(0x5EED)
    path.write_text("".join(json.dumps(keys.sign(content=f"line {i}", created_at=1_700_000_000 + i)) + "\n"
                            for i in range(n)))


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []


def test_ctrl_c_counts_every_line_it_stored(tmp_path):
    """SIGINT to the group mid-import, lines checked ahead in processes: the summary's `stored` is what the
    database holds (chunks on their way were stored but not counted)."""
    source, db = tmp_path / "unique.jsonl", tmp_path / "unique.db"
    _unique_events(source, 80_000)
    proc = _interrupted_import(source, db, 0.3)
    out, err = proc.communicate(timeout=CLI_TIMEOUT)
    assert proc.returncode == 130, (out, err)
    report = parse_report(out.decode())
    held = relay_cli("export", "--db", db).stdout.count("\n")
    assert report.stored == held and report.total < 80_000, (report, held)


def test_checking_processes_die_with_the_import(tmp_path):
    """`kill -9` of an import: its checking processes do not outlive it (they were left blocked on a pipe)."""
    source, db = tmp_path / "unique.jsonl", tmp_path / "unique.db"
    _unique_events(source, 40_000)
    proc = subprocess.Popen([sys.executable, "-m", "relay", "import", "--create", str(source), "--db", str(db),
                             "--processes", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=clean_env(), start_new_session=True)
    deadline = time.monotonic() + CLI_TIMEOUT
    while len(children := _children(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(children) >= 2
    time.sleep(0.5)
    proc.kill()
    proc.wait(timeout=CLI_TIMEOUT)
    deadline = time.monotonic() + 10
    while (alive := [c for c in children if os.path.exists(f"/proc/{c}")]) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in alive:  # (a failure must not leave them running)
        os.kill(pid, signal.SIGKILL)
    assert not alive


def test_an_empty_file_is_not_a_relay_database(tmp_path):
    """`relay verify` on a 0-byte file (an import interrupted at its first instant left one): one line, exit 2."""
    (tmp_path / "zero.db").write_bytes(b"")
    done = relay_cli("verify", "--db", tmp_path / "zero.db")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not a relay database" in done.stderr, done
