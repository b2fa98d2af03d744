"""The `[[policies]]` chain: each event of a listed source goes through the write policies in order.

How this works: `Policies.load(configs)` imports each `call` (or, for a
`command`, checks that its program can be executed and starts nothing yet:
relay/policies/plugin.py starts it at the first event) and keeps, per
source name, the policies that list it.  `judge(event, source, done)` runs
them after the signature check, in file order, until one
does not accept; `done(verdict)` gets the first verdict that is not ACCEPT,
or ACCEPT.  A policy that returns at once costs a call; the first awaitable
moves the rest of the chain into a task.  A policy that raises, answers
something other than a `Verdict` or overruns `timeout_seconds` refuses the
event with "error:" and is logged with its name; a message longer than
`MAX_MESSAGE_CHARS` is cut there (ending in "…"); overruns are counted, and
a plugin that overran is killed (`Plugin.overran`).  Nothing a policy does
reaches the connection or the relay beyond that one event's answer.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import shutil
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog

from relay.config import POLICY_SOURCES, ConfigError, PolicyConfig
from relay.ingest.source import Source
from relay.policies import ACCEPT, ACTIONS, Verdict, reject
from relay.policies.plugin import Plugin
from relay.protocol.event import Event

log = structlog.get_logger(__name__)

FAILED = reject("error: a write policy failed")
TOO_SLOW = reject("error: a write policy took too long")
Judged = Callable[[Verdict], None]
MAX_MESSAGE_CHARS = 1000
"""A policy's reject message is cut to this many characters, the last one "…" (it is sent in an OK frame)."""


@dataclass(frozen=True, slots=True)
class Policy:
    """One loaded write policy: `check(event, source)` answers a Verdict, or an awaitable of one."""

    name: str
    check: Callable[[Event, Source], Verdict | Awaitable[Verdict]]
    sources: tuple[str, ...]
    timeout_seconds: float
    plugin: Plugin | None = None


def load(config: PolicyConfig) -> Policy:
    """The policy of one `[[policies]]` table.

    Raises:
        ConfigError: the module cannot be imported, has no such callable, or its factory refused the options;
            a command's program is not found (on PATH, for a bare name) or is not an executable file.
    """
    if config.command:
        program = config.command[0]
        # Checked now, not at the first event: a typo must stop the start, not refuse every event later.
        if shutil.which(program) is None:
            raise ConfigError(f"policies: {config.name}: cannot run {program!r}: "
                              "no such executable file (a bare name is looked up on PATH)")
        plugin = Plugin(config.name, list(config.command))
        return Policy(config.name, plugin, config.sources, config.timeout_seconds, plugin)
    module_name, _, function_name = config.call.partition(":")
    named = config.call if config.name == config.call else f"{config.name} ({config.call})"
    try:
        check = getattr(importlib.import_module(module_name), function_name)
        if config.options:
            check = check(**config.options)
    except Exception as exc:  # whatever the module's import or the factory raises stops the start, named
        raise ConfigError(f"policies: {named}: cannot load: {exc!r}") from None
    if not callable(check):
        raise ConfigError(f"policies: {named}: not callable")
    return Policy(config.name, check, config.sources, config.timeout_seconds)


class Policies:
    """The write policies of a relay, per source name; `judge` runs them.  `stats()` counts, by policy name,
    `rejected`, `shadow_rejected`, `failed` and `overruns` (and each plugin's `restarts` and `bad_lines`)."""

    def __init__(self, policies: Sequence[Policy] = ()) -> None:
        self.policies = tuple(policies)
        self._by_source = {name: tuple(p for p in policies if name in p.sources) for name in POLICY_SOURCES}
        self.counts: dict[str, Counter] = {p.name: Counter() for p in policies}
        self._tasks: set[asyncio.Task] = set()

    @classmethod
    def load(cls, configs: Sequence[PolicyConfig]) -> Policies:
        """The chain of `[[policies]]`, in file order; raises ConfigError (see `load`)."""
        return cls([load(c) for c in configs])

    def chain(self, source: Source) -> tuple[Policy, ...]:
        """The policies that `source`'s events go through (empty: none)."""
        return self._by_source.get(source.name, ())

    def judge(self, event: Event, source: Source, chain: tuple[Policy, ...], done: Judged) -> None:
        """Run `chain` on `event`; `done(verdict)` once, on the loop (at once when no policy awaits)."""
        for i, policy in enumerate(chain):
            started = time.perf_counter()
            try:
                verdict = policy.check(event, source)
                if inspect.isawaitable(verdict):
                    task = asyncio.ensure_future(self._judge_rest(event, source, chain, i, verdict, done))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                    return
                verdict = self._checked(policy, verdict, time.perf_counter() - started, event)
            except Exception as exc:  # the one place a policy's failure is caught: that event is refused
                verdict = self._failed(policy, exc, event)
            if verdict.action != "accept":
                done(verdict)
                return
        done(ACCEPT)

    async def _judge_rest(self, event: Event, source: Source, chain: tuple[Policy, ...], i: int,
                          pending: Awaitable[Verdict], done: Judged) -> None:
        verdict = await self._wait(chain[i], pending, event)
        if verdict.action != "accept":
            done(verdict)
        else:  # the rest of the chain, as `judge` runs any chain
            self.judge(event, source, chain[i + 1:], done)

    async def _wait(self, policy: Policy, pending: Awaitable[Verdict], event: Event) -> Verdict:
        try:
            answer = await asyncio.wait_for(pending, policy.timeout_seconds)
        except TimeoutError:
            return self._overrun(policy, event)
        except Exception as exc:
            return self._failed(policy, exc, event)
        try:
            return self._checked(policy, answer, 0.0, event)
        except TypeError as exc:
            return self._failed(policy, exc, event)

    def _checked(self, policy: Policy, verdict: object, seconds: float, event: Event) -> Verdict:
        """`verdict` once it is one (a refusal's message cut to MAX_MESSAGE_CHARS, naming `policy`); raises
        TypeError otherwise.  A
        synchronous policy cannot be stopped: past its budget, its verdict is dropped and the event refused."""
        if type(verdict) is not Verdict or verdict.action not in ACTIONS:
            raise TypeError(f"a policy must return a relay.policies.Verdict, got {verdict!r:.200}")
        if seconds > policy.timeout_seconds:
            return self._overrun(policy, event)
        if verdict.action == "accept":
            return verdict
        self.counts[policy.name]["rejected" if verdict.action == "reject" else "shadow_rejected"] += 1
        message = verdict.message
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[:MAX_MESSAGE_CHARS - 1] + "…"
        return Verdict(verdict.action, message, policy.name)

    def _overrun(self, policy: Policy, event: Event) -> Verdict:
        self.counts[policy.name]["overruns"] += 1
        log.warning("policy_overran", policy=policy.name, event_id=event.id, timeout_seconds=policy.timeout_seconds)
        if policy.plugin is not None:
            policy.plugin.overran()
        return TOO_SLOW

    def _failed(self, policy: Policy, exc: Exception, event: Event) -> Verdict:
        self.counts[policy.name]["failed"] += 1
        log.error("policy_failed", policy=policy.name, event_id=event.id, error=repr(exc), exc_info=exc)
        return FAILED

    def stats(self) -> dict[str, dict[str, int]]:
        """Counts by policy name (see the class docstring)."""
        stats = {name: dict(counts) for name, counts in self.counts.items()}
        for policy in self.policies:
            if policy.plugin is not None:
                stats[policy.name].update(restarts=policy.plugin.restarts, bad_lines=policy.plugin.bad_lines)
        return stats

    def close(self) -> None:
        """Kill the plugin processes; the events waiting for them are refused with "error:"."""
        for policy in self.policies:
            if policy.plugin is not None:
                policy.plugin.close()

    async def wait_closed(self) -> None:
        """After `close()`: wait until the plugin processes have exited."""
        for policy in self.policies:
            if policy.plugin is not None:
                await policy.plugin.wait_closed()
