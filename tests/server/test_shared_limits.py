"""Per-IP limits across worker processes: two real processes share one rate-limit table (relay/server/iptable.py).

The other process is a real Python interpreter holding worker 1's view of the
table; it runs the commands this test writes to its stdin, one per line, and
prints each answer.  Rates are tiny, so no bucket refills during a test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from relay.config import RateLimitConfig
from relay.server.budget import ByteBudget
from relay.server.iptable import IpTable
from relay.server.ratelimit import EVENTS, RateLimits, ip_buckets

IP = "203.0.113.7"
SLOW = 0.01  # tokens per second: none comes back during a test
CONFIG = dict(exempt_loopback=False, events_per_second=0.0, reqs_per_second=0.0, neg_opens_per_second=0.0,
              ip_events_per_second=SLOW, ip_events_burst=5, ip_reqs_per_second=0.0, ip_neg_opens_per_second=0.0,
              ip_connections=3, ip_stored_results_bytes=1000)

_WORKER = textwrap.dedent("""
    import sys
    from relay.config import RateLimitConfig
    from relay.server.iptable import IpTable
    from relay.server.ratelimit import EVENTS, RateLimits, ip_buckets
    config = RateLimitConfig(**eval(sys.argv[2]))
    limits = RateLimits(config, table=IpTable.open(sys.argv[1], 1, ip_buckets(config)))
    rates = []
    for line in sys.stdin:
        verb, ip, *rest = line.split()
        if verb == "connect":
            admitted = limits.admits(ip)
            if admitted:
                rates.append(limits.open(ip))
            answer = admitted
        elif verb == "event":
            answer = rates[-1].allow(EVENTS)
        elif verb == "take":
            answer = rates[-1].stored_results.take(int(rest[0]))
        elif verb == "close":
            limits.close(rates.pop())
            answer = True
        print(answer, flush=True)
""")


class Worker:
    """Worker 1, in a process of its own."""

    def __init__(self, path) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", _WORKER, str(path), repr(CONFIG)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, command: str) -> bool:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip() == "True"

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        self.process.stdin.close()
        self.process.wait()


@pytest.fixture
def shared(tmp_path):
    """(this process's RateLimits as worker 0, worker 1 in another process, the writer's table)."""
    config = RateLimitConfig(**CONFIG)
    path = tmp_path / "limits"
    table = IpTable.create(path, 2, ip_buckets(config))
    limits = RateLimits(config, stored_results=ByteBudget(10_000), table=table)
    worker = Worker(path)
    yield limits, worker, table
    if worker.process.poll() is None:
        worker.stop()
    table.close()


def _connect(limits: RateLimits, ip: str = IP):
    return limits.open(ip) if limits.admits(ip) else None


def test_ip_connections_hold_across_workers(shared):
    """Connection ip_connections + 1 from one IP is refused though no worker alone has that many open."""
    limits, worker, _ = shared
    assert worker.ask(f"connect {IP}") and worker.ask(f"connect {IP}")
    rate = _connect(limits)
    assert rate is not None
    assert not limits.admits(IP)
    assert not worker.ask(f"connect {IP}")
    assert limits.admits("198.51.100.1")  # another IP has its own count
    limits.close(rate)
    assert worker.ask(f"connect {IP}")


def test_the_ip_token_bucket_drains_across_workers(shared):
    """The per-IP EVENT bucket (burst 5) is one bucket, whichever worker takes its tokens."""
    limits, worker, _ = shared
    assert worker.ask(f"connect {IP}")
    rate = _connect(limits)
    assert [worker.ask(f"event {IP}") for _ in range(3)] == [True] * 3
    assert [rate.allow(EVENTS) for _ in range(3)] == [True, True, False]
    assert not worker.ask(f"event {IP}")


def test_the_ip_share_of_unsent_results_holds_across_workers(shared):
    """Bytes of unsent REQ results one worker holds for an IP count against that IP's share in every worker."""
    limits, worker, _ = shared
    assert worker.ask(f"connect {IP}")
    assert worker.ask(f"take {IP} 700")
    rate = _connect(limits)
    assert rate.stored_results.short_of(400) is rate.stored_results
    assert not rate.stored_results.take(400)
    assert rate.stored_results.take(300)
    assert not worker.ask(f"take {IP} 1")


def test_a_dead_workers_connections_are_cleared(shared):
    """A worker killed with its connections open keeps them counted until the writer clears its counts."""
    limits, worker, table = shared
    assert all(worker.ask(f"connect {IP}") for _ in range(3))
    worker.kill()
    assert not limits.admits(IP)
    table.clear_worker(1)
    assert _connect(limits) is not None


def test_an_idle_ip_slot_is_given_to_another_ip(tmp_path):
    """When an IP's group is full, the slot of an IP with nothing open is reused; one of open connections is not."""
    table = IpTable.create(tmp_path / "limits", 1, [(SLOW, 5)] * 3, slots=8)  # one group
    slots = [table.connect(f"10.0.0.{i}") for i in range(8)]
    assert len(set(slots)) == 8
    table.disconnect(slots[3])
    assert table.connect("10.0.1.1") == slots[3]
    assert table.connections("10.0.0.3") == 0 and table.connections("10.0.1.1") == 1
    table.close()


def test_a_worker_opens_only_a_table_for_its_index(tmp_path):
    """Opening a table with a worker index past its worker count, or a file that is no table, is refused."""
    IpTable.create(tmp_path / "limits", 2, [(0.0, 1)] * 3).close()
    with pytest.raises(ValueError):
        IpTable.open(tmp_path / "limits", 2, [(0.0, 1)] * 3)
    (tmp_path / "other").write_bytes(os.urandom(128))
    with pytest.raises(ValueError):
        IpTable.open(tmp_path / "other", 0, [(0.0, 1)] * 3)


def test_a_place_admitted_but_never_opened_is_given_back(shared):
    """`admits` counts the connection for the `open` that follows; admitted again without it, the first place
    is given back rather than counted twice."""
    limits, _, table = shared
    assert limits.admits(IP) and limits.admits(IP)
    assert table.connections(IP) == 1
    rate = limits.open(IP)
    assert table.connections(IP) == 1
    limits.close(rate)
    assert table.connections(IP) == 0
