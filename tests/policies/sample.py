"""Write policies for the tests (named by `call = "tests.policies.sample:..."`), a config and a relay with them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from relay.config import Config, load_config
from relay.policies import ACCEPT, SHADOW_REJECT, Verdict, reject
from tests.inprocess import Relay

SEEN: list[tuple] = []
"""(source name, ip, pubkeys, origin) of each event `remember_source` saw."""


def by_content(event, source):
    """What the event's content says: reject, reject-prefixed, reject-long (a 5,000-character message), shadow,
    raise, garbage, slow; else accept."""
    content = event.content
    if content == "reject-long":
        return Verdict("reject", "blocked: " + "m" * 5000)  # built directly, as reject() builds it
    if content == "reject":
        return reject("no thanks")
    if content == "reject-prefixed":
        return reject("pow: do more work")
    if content == "shadow":
        return SHADOW_REJECT
    if content == "raise":
        raise RuntimeError("a bug in the policy")
    if content == "garbage":
        return "yes please"
    if content == "slow":
        time.sleep(0.3)
    return ACCEPT


async def async_by_content(event, source):
    """Async: "hang" sleeps past any budget, "async-reject" is refused; else accept."""
    if event.content == "hang":
        await asyncio.sleep(30)
    if event.content == "async-reject":
        return reject("blocked: async says no")
    return ACCEPT


def remember_source(event, source):
    """Accept, remembering what the source says (in `SEEN`)."""
    SEEN.append((source.name, source.ip, frozenset(source.pubkeys), source.origin))
    return ACCEPT


def refuse_all(event, source):
    """Refuse every event."""
    return reject("not from here")


def policies_config(tmp_path: Path, policies: str, extra: str = "") -> Config:
    """A Config read from a TOML file in `tmp_path`: a store there, port 0, loopback not rate limited, then
    `extra` (sections) and `policies` ([[policies]] tables)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "relay.toml"
    path.write_text(f"""
[server]
port = 0
[store]
path = "{tmp_path / 'relay.db'}"
[rate_limits]
exempt = ["127.0.0.0/8", "::1"]
{extra}
{policies}
""")
    return load_config(path)


@asynccontextmanager
async def serving(tmp_path: Path, policies: str, extra: str = "") -> AsyncIterator[Relay]:
    """A started relay of `policies_config(tmp_path, policies, extra)`, stopped on leaving."""
    relay = Relay(policies_config(tmp_path, policies, extra))
    await relay.start()
    try:
        yield relay
    finally:
        await relay.stop()
