"""`relay key`: print the node's pubkey, creating its key file only when asked to."""

from __future__ import annotations

import sys
from pathlib import Path

from relay.keys import NodeKeyError, load_or_create


def run_key(path: Path, create: bool) -> int:
    """`relay key`: print the node's pubkey (64 hex, x-only, as `[[sync.peers]] pubkey` wants it) to stdout.

    With `create` (an explicit `--file`), creates the key file at `path`
    (mode 0600) when absent, with its missing folders (`--file keys/node-c.key`);
    without it, a missing file is an error: the path a config names may be meant
    for a container, and a new key there would not be that node's.  Exit code 0,
    or 1 with the reason on stderr.
    """
    if not create and not path.exists():
        print(f"relay: no node key at {path} (a node creates it at its first start; "
              f"relay key --file PATH creates one)", file=sys.stderr)
        return 1
    try:
        print(load_or_create(path).pubkey)
    except NodeKeyError as exc:
        print(f"relay: {exc}", file=sys.stderr)
        return 1
    return 0
