"""`LineReader` (relay/commands/linereader.py) on a real pipe: lines split across reads, bounded by the limit."""

from __future__ import annotations

import os
import random
import threading

from relay.commands.linereader import LineReader


async def test_lines_across_reads_come_whole_and_those_past_the_limit_as_too_long():
    """Lines written in pieces of random sizes: each comes back as written (without its newline), one of exactly
    `limit` bytes included; one byte more, or many kilobytes more, gives `too_long` in its place; a last line
    without a newline counts; `consumed` is every byte."""
    limit = 1024
    lines = [b"", b"a" * limit, b"b" * (limit + 1), b"c", b"d" * 200_000, b"", b"e" * 10, b"f" * (limit + 1)]
    data = b"\n".join(lines)  # the last line has no newline
    read_end, write_end = os.pipe()
    rng = random.Random(7)

    def write() -> None:
        at = 0
        while at < len(data):
            size = rng.randint(1, 3000)
            os.write(write_end, data[at:at + size])
            at += size
        os.close(write_end)

    writer = threading.Thread(target=write)
    writer.start()
    reader = LineReader(read_end, limit)
    got = [line async for line in reader.lines()]
    writer.join()
    os.close(read_end)
    assert got == [line if len(line) <= limit else reader.too_long for line in lines]
    assert reader.too_long.message == "invalid: line longer than 1024 bytes"
    assert reader.consumed == len(data)
