"""`relay import`: where each rejection is (line numbers, `--rejects FILE`) and Ctrl-C (a summary, exit 130)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from tests.helpers import REAL_EVENTS, Keys
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
    result = relay_cli("import", "-", "--db", tmp_path / "r.db", "--rejects", rejects,
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
    proc = subprocess.Popen([sys.executable, "-m", "relay", "import", str(source), "--db", str(db)],
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
