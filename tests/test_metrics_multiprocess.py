"""/metrics of a relay with worker processes: prometheus-client's multiprocess mode (relay/metrics.py).

Each process here is a real Python interpreter that joins one metrics
directory, builds its `Metrics`, counts, refreshes its scrape-time values and
waits; the test renders the directory as the answering worker would.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from relay.metrics import CONNECTIONS, DATABASE_BYTES, SCRAPED, Metrics, mark_process_dead, render_multiprocess

_PROCESS = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from relay.metrics import Metrics, join_multiprocess
    from relay.server.app import ServerStats
    from relay.store.store import Store

    directory, role, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    join_multiprocess(directory)  # before Metrics(): prometheus-client was imported without the variable

    class Server:
        def stats(self):
            return ServerStats(connections=n, subscriptions=2 * n, negentropy_sessions=0, negentropy_items_held=0,
                               slow_readers=1, keepalive_timeouts=0, connections_refused=0)

    async def main():
        metrics = Metrics(directory, writer=role == "writer")
        if role == "writer":
            store = await Store.open(directory.parent / "relay.db")
            metrics.watch(store, None, None)
            metrics.events_stored.inc(n)
        else:
            metrics.watch(None, Server(), None)
            for _ in range(n):
                metrics.events_received.inc()
        await metrics.refresh()
        await metrics.refresh()  # counters grow by their increase only
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.read)
        if role == "writer":
            await store.close()

    asyncio.run(main())
""")


def _samples(text: bytes) -> dict[tuple[str, tuple], float]:
    found = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _names(text: bytes) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text.decode())}


@pytest.fixture
def processes(tmp_path):
    """Start processes (role, n) sharing one fresh metrics directory; yields (directory, start)."""
    directory = tmp_path / "metrics"
    directory.mkdir()
    started: list[subprocess.Popen] = []

    def start(role: str, n: int) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", _PROCESS, str(directory), role, str(n)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert process.stdout.readline().strip() == "ready"
        started.append(process)
        return process

    yield directory, start
    for process in started:
        if process.poll() is None:
            process.stdin.close()
            process.wait()


def test_the_page_sums_every_process_under_todays_names(processes):
    """Two workers and a writer: counters and livesum gauges are summed, the writer's values appear, and every
    name a one-process relay shows for these parts is there."""
    directory, start = processes
    start("worker", 2)
    start("worker", 3)
    start("writer", 4)
    page = render_multiprocess(directory)
    samples = _samples(page)
    assert samples[("relay_events_received_total", ())] == 5
    assert samples[("relay_events_stored_total", ())] == 4
    assert samples[("relay_connections", ())] == 5
    assert samples[("relay_subscriptions", ())] == 10
    assert samples[("relay_slow_readers_disconnected_total", ())] == 2  # 1 each, though refreshed twice
    assert samples[("relay_database_bytes", (("file", "db"),))] > 0
    single = _names(generate_latest(Metrics().registry))  # today's names of the metrics every process counts
    scraped = {spec.name for spec in SCRAPED if not spec.writer} | {DATABASE_BYTES.name}
    assert single | scraped <= _names(page)


def test_a_dead_workers_live_gauges_leave_the_sum(processes):
    """When a worker dies and is marked dead, its connections leave relay_connections; its counts stay."""
    directory, start = processes
    start("worker", 2)
    dead = start("worker", 3)
    dead.send_signal(signal.SIGKILL)
    dead.wait()
    assert _samples(render_multiprocess(directory))[("relay_connections", ())] == 5  # not yet marked
    mark_process_dead(dead.pid, directory)
    samples = _samples(render_multiprocess(directory))
    assert samples[(CONNECTIONS.name, ())] == 2
    assert samples[("relay_events_received_total", ())] == 5


def test_a_fresh_start_forgets_the_last_runs_files(tmp_path):
    """start_multiprocess empties the directory of a previous run (its counters would be added otherwise)."""
    old = tmp_path / "metrics"
    old.mkdir()
    (old / "counter_1.db").write_bytes(b"old")
    code = ("import sys; from pathlib import Path; from relay.metrics import start_multiprocess;"
            "print(start_multiprocess(Path(sys.argv[1])))")
    made = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert made.stdout.strip() == str(old) and list(old.iterdir()) == []
