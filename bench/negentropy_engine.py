"""Benchmark of the NIP-77 negentropy engine alone (no I/O), run on demand.

    .venv/bin/python bench/negentropy_engine.py [--sizes 100000 1000000]
        [--diffs 0.01 0.1] [--frame 60000] [--seed 1]

For each size N and difference d, both sides hold N items: B is A with d*N/2
items removed and d*N/2 new ones added, so the symmetric difference is d*N
(d*N/2 "have" and d*N/2 "need" for the initiator A).  Timestamps span one
year; ids are random.  Prints the SortedVector build time, the round trips,
the bytes sent each way (initiator->responder "up", the reverse "down") and
the reconciliation time, then checks have/need against the set differences.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from relay.protocol.negentropy import Negentropy, SortedVector, fingerprint  # noqa: E402

YEAR = 365 * 24 * 3600
NOW = 1_750_000_000


def make_sides(rng: np.random.Generator, size: int, diff: float) -> tuple[tuple, tuple]:
    """(timestamps, ids) for A and B as described in the module docstring."""
    half = int(size * diff / 2)
    ts = rng.integers(NOW - YEAR, NOW, size=size + half, dtype=np.int64).astype(np.uint64)
    ids = rng.integers(0, 256, size=(size + half, 32), dtype=np.uint8)
    dropped = rng.choice(size, size=half, replace=False)
    keep = np.ones(size, bool)
    keep[dropped] = False
    a = (ts[:size], ids[:size])
    b_idx = np.concatenate([np.flatnonzero(keep), np.arange(size, size + half)])
    return a, (ts[b_idx], ids[b_idx])


def build(ts: np.ndarray, ids: np.ndarray) -> tuple[SortedVector, float]:
    start = time.perf_counter()
    vec = SortedVector()
    vec.insert_many(ts, ids)
    vec.seal()
    return vec, time.perf_counter() - start


def reconcile(a: SortedVector, b: SortedVector, frame: int) -> dict:
    initiator, responder = Negentropy(a, frame), Negentropy(b, frame)
    have: set[bytes] = set()
    need: set[bytes] = set()
    rounds = up = down = 0
    start = time.perf_counter()
    msg = initiator.initiate()
    while msg is not None:
        reply = responder.reconcile(msg)
        rounds += 1
        up += len(msg)
        down += len(reply)
        msg, h, n = initiator.reconcile_with_ids(reply)
        have.update(h)
        need.update(n)
    elapsed = time.perf_counter() - start
    return {"rounds": rounds, "up": up, "down": down, "seconds": elapsed, "have": have, "need": need}


def id_set(ids: np.ndarray) -> set[bytes]:
    blob = ids.tobytes()
    return {blob[k : k + 32] for k in range(0, len(blob), 32)}


def bench_fingerprint(rng: np.random.Generator) -> None:
    ids = rng.integers(0, 256, size=(1_000_000, 32), dtype=np.uint8)
    start = time.perf_counter()
    fingerprint(ids)
    print(f"fingerprint() over 1,000,000 ids: {1000 * (time.perf_counter() - start):.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--diffs", type=float, nargs="+", default=[0.01, 0.1])
    parser.add_argument("--frame", type=int, default=60_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    bench_fingerprint(rng)
    print(f"frame size limit {args.frame} bytes")
    header = ("items", "diff", "build s", "rounds", "up bytes", "down bytes", "reconcile s")
    print("{:>9} {:>5} {:>8} {:>6} {:>11} {:>11} {:>11}  ok".format(*header))
    for size in args.sizes:
        for diff in args.diffs:
            (ts_a, ids_a), (ts_b, ids_b) = make_sides(rng, size, diff)
            a, build_a = build(ts_a, ids_a)
            b, _ = build(ts_b, ids_b)
            r = reconcile(a, b, args.frame)
            set_a, set_b = id_set(ids_a), id_set(ids_b)
            ok = r["have"] == set_a - set_b and r["need"] == set_b - set_a
            print(
                f"{size:>9,} {diff:>5.0%} {build_a:>8.2f} {r['rounds']:>6} {r['up']:>11,} {r['down']:>11,}"
                f" {r['seconds']:>11.2f}  {'yes' if ok else 'NO'}"
            )


if __name__ == "__main__":
    main()
