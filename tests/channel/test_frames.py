"""The local channel's framing (relay/channel/frames.py) and `server.workers` = "auto" (relay/supervisor.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time

import orjson
import pytest

from relay.channel import frames
from relay.ingest import Outcome, Source
from relay.protocol.event import EventLimits, parse_event
from relay.supervisor import AUTO_MAX_WORKERS, worker_count
from tests.helpers import REAL_EVENTS, read_jsonl


def _reader(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def test_frames_read_back_in_order_then_none_at_the_end():
    """Frames written back to back are read one by one; a clean end of stream reads None."""
    reader = _reader(frames.encode({"type": "heartbeat"}) + frames.encode({"type": "commit", "n": 1}))
    assert await frames.read_frame(reader) == {"type": "heartbeat"}
    assert await frames.read_frame(reader) == {"type": "commit", "n": 1}
    assert await frames.read_frame(reader) is None


@pytest.mark.parametrize("data", [
    (frames.MAX_FRAME_BYTES + 1).to_bytes(4, "big"),  # a length past the bound: not read into memory
    (3).to_bytes(4, "big") + b"{x}",                   # not JSON
    (2).to_bytes(4, "big") + b"[]",                    # not an object
])
async def test_what_is_not_a_frame_is_a_channel_error(data):
    """A bad length or body raises ChannelError (the connection is then dropped)."""
    with pytest.raises(frames.ChannelError):
        await frames.read_frame(_reader(data))


async def test_a_stream_ending_inside_a_frame_is_an_incomplete_read():
    """A frame cut short raises IncompleteReadError, not a silent end."""
    with pytest.raises(asyncio.IncompleteReadError):
        await frames.read_frame(_reader(frames.encode({"type": "heartbeat"})[:-1]))


def test_sources_and_outcomes_cross_the_channel_unchanged():
    """What the writer's stage reads of a Source, and every field of an Outcome, survive the trip."""
    source = Source.client(ip="192.0.2.1", pubkeys=frozenset({"a" * 64}), peer="wss://peer.example")
    event = parse_event(read_jsonl(REAL_EVENTS)[0], EventLimits(max_created_at_future_seconds=10**10), time.time())
    request, _, back = frames.decode_submit(_through_a_frame(frames.encode_submit(3, event, source)))
    assert (request, back.name, back.origin, back.ip, back.pubkeys, back.fans_out_ephemeral) == (
        3, "peer", "wss://peer.example", "192.0.2.1", frozenset({"a" * 64}), True)
    outcome = Outcome(False, "blocked", "no", settles=True)
    request, back = frames.decode_outcome(_through_a_frame(frames.encode_outcome(7, outcome)))
    assert request == 7 and back == outcome and back.settles


async def test_items_of_one_loop_iteration_leave_as_one_frame():
    """Items added in one event-loop iteration are sent as one frame, in order; the next iteration's in another."""
    sent: list[bytes] = []
    batch = frames.ItemFrames("submit", sent.append)
    for i in range(3):
        batch.add([i])
    await asyncio.sleep(0)
    batch.add([3])
    batch.flush()
    assert [orjson.loads(s[4:]) for s in sent] == [{"type": "submit", "items": [[0], [1], [2]]},
                                                   {"type": "submit", "items": [[3]]}]


def test_auto_workers_are_the_usable_cpus_at_most_eight():
    """"auto" counts this process's CPUs (affinity; a cgroup quota can only lower it), between 1 and 8; a number
    is taken as it is."""
    assert 1 <= worker_count("auto") <= min(len(os.sched_getaffinity(0)), AUTO_MAX_WORKERS)
    assert worker_count(0) == 0 and worker_count(3) == 3


@pytest.mark.parametrize("cpu_max, cpus", [("150000 100000\n", 2), ("50000 100000\n", 1), ("max 100000\n", None)])
def test_a_cgroup_quota_is_counted_in_cpus_rounded_up(tmp_path, monkeypatch, cpu_max, cpus):
    """cgroup v2 `cpu.max` "QUOTA PERIOD": QUOTA/PERIOD CPUs, rounded up; "max": no quota."""
    import relay.supervisor as supervisor

    (tmp_path / "cpu.max").write_text(cpu_max)
    monkeypatch.setattr(supervisor, "_CGROUP_CPU_MAX", tmp_path / "cpu.max")
    assert supervisor._cgroup_cpus() == cpus
    if cpus is not None:
        assert worker_count("auto") <= cpus


def _through_a_frame(item: list) -> list:
    """`item` as the other end reads it: in a frame, encoded and decoded."""
    return orjson.loads(frames.encode({"type": "submit", "items": [item]})[4:])["items"][0]


def test_a_submit_frame_carries_every_real_event_byte_for_byte():
    """An event embedded in a frame (`orjson.Fragment` of its canonical JSON) is decoded with the frame and
    serialized back to the very bytes the worker verified, with every field, for every real event (unicode,
    escapes, big tags, d tags, expirations)."""
    limits = EventLimits(max_created_at_future_seconds=10**10, max_tags=10**6, max_content_bytes=10**8)
    source = Source.client(ip="192.0.2.1")
    for line in read_jsonl(REAL_EVENTS):
        event = parse_event(line, limits, time.time())
        _, back, _ = frames.decode_submit(_through_a_frame(frames.encode_submit(1, event, source)))
        assert dataclasses.astuple(back) == dataclasses.astuple(event)
