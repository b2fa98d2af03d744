"""`relay serve` as a real subprocess for tests and benchmarks: start, wait for it, stop or SIGKILL it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

START_TIMEOUT = 15  # seconds for `relay serve` to answer /health


TEST_WORKERS = os.environ.get("RELAY_TEST_WORKERS", "0")
"""`server.workers` of every relay a test starts as a subprocess: 0 (one process) unless RELAY_TEST_WORKERS says."""


def healthy(body: bytes) -> bool:
    """True for the body of a 200 `GET /health` in the mode the tests run in (docs/operating.md, "Processes"): `ok` with
    workers = 0; with TEST_WORKERS > 0, the answering worker's `{"writer": "ok", "workers": N, "worker": i}`."""
    count = int(TEST_WORKERS)
    if count == 0:
        return body == b"ok\n"
    answer = json.loads(body)
    return answer["writer"] == "ok" and answer["workers"] == count and answer["worker"] in range(count)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any RELAY_* variable, with `server.workers` pinned to TEST_WORKERS,
    plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env["RELAY_SERVER__WORKERS"] = TEST_WORKERS
    env.update(extra)
    return env


CLI_TIMEOUT = 60  # seconds for one `python -m relay` subcommand run by a test


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def relay_cli(*args, env: dict | None = None, cwd: Path | None = None, stdin: bytes | None = None):
    """Run `python -m relay ARGS` to completion (bounded); returns the CompletedProcess (text output)."""
    proc = subprocess.run([sys.executable, "-m", "relay", *map(str, args)], input=stdin, capture_output=True,
                          env=env or clean_env(), cwd=cwd, timeout=CLI_TIMEOUT)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode())


async def relay_cli_async(*args, env: dict | None = None) -> tuple[int, str, str]:
    """`relay_cli` without blocking the event loop (for a relay served in this process): (exit code, stdout,
    stderr); the process is killed past CLI_TIMEOUT.  `env` is added to `clean_env()`."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "relay", *map(str, args),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                env=clean_env(**(env or {})))
    try:
        out, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode, out.decode(), err.decode()


def http_get(port: int, path: str = "/", headers: dict | None = None, timeout: float = 2.0):
    """(status, headers, body) of a GET on 127.0.0.1:port."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.status, response.headers, response.read()


async def nip11(relay) -> dict:
    """The NIP-11 document of an in-process `Relay` (fetched off the event loop)."""
    status, _, body = await asyncio.to_thread(http_get, relay.port, "/", {"Accept": "application/nostr+json"}, 5.0)
    assert status == 200
    return json.loads(body)


def answers_health(port: int) -> bool:
    try:
        return http_get(port, "/health", timeout=1.0)[0] == 200
    except (OSError, urllib.error.URLError):
        return False


class Served:
    """`python -m relay serve ARGS` as a subprocess, logs to files; always terminated on exit."""

    def __init__(self, tmp_path: Path, *args, env: dict | None = None, new_session: bool = False,
                 stdout: IO | int = subprocess.DEVNULL) -> None:
        self.tmp_path = tmp_path
        self.args = [sys.executable, "-m", "relay", "serve", *map(str, args)]
        self.env = env or clean_env()
        self.new_session = new_session  # a process group of its own (to signal the whole group)
        self.stdout = stdout  # where its stdout goes (a file: to read what it printed)
        self.proc: subprocess.Popen | None = None
        self.stderr_path = tmp_path / f"serve-{time.monotonic_ns()}.stderr"

    def __enter__(self) -> Served:
        self._stderr = self.stderr_path.open("wb")
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=self.stdout,
                                     stderr=self._stderr, env=self.env, cwd=self.tmp_path,
                                     start_new_session=self.new_session)
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
        finally:
            self._stderr.close()

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def log_events(self) -> list[dict]:
        """The JSON log lines written so far (logs are JSON when stderr is not a terminal)."""
        out = []
        for line in self.stderr.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def started_url(self) -> str:
        """ws://host:port from the `relay_started` log line, waiting for it (bounded)."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for entry in self.log_events():
                if entry.get("event") == "relay_started":
                    return entry["url"]
            assert self.proc.poll() is None, f"relay exited with {self.proc.returncode}:\n{self.stderr}"
            time.sleep(0.05)
        raise AssertionError(f"no relay_started log line within {START_TIMEOUT}s:\n{self.stderr}")

    def wait_health(self, port: int) -> None:
        """Poll GET /health on `port` until it answers 200 (bounded); fail early if the process died."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"relay exited with {self.proc.returncode}:\n{self.stderr}"
            if answers_health(port):
                return
            time.sleep(0.05)
        raise AssertionError(f"/health on port {port} did not answer within {START_TIMEOUT}s:\n{self.stderr}")

    def stop(self) -> int:
        """SIGTERM, then the exit code (bounded wait)."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=15)


    def kill(self) -> None:
        """SIGKILL (a crash: no shutdown code runs), then reap the process (bounded wait)."""
        self.proc.kill()
        self.proc.wait(timeout=15)

    def children(self) -> list[int]:
        """Pids of the running relay's child processes (its workers with `--workers N`; Linux /proc)."""
        pid = self.proc.pid
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]

    def group(self) -> list[int]:
        """Pids of the live (not zombie) processes left in this relay's process group, the relay's own
        included: its workers outlive it if they miss its death.  Needs `new_session=True` (Linux /proc)."""
        assert self.new_session, "a process group of its own is needed to find what is left of it"
        live = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                state, _, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
            except OSError:
                continue  # it exited while we looked
            if int(pgrp) == self.proc.pid and state != "Z":
                live.append(int(stat.parent.name))
        return live
