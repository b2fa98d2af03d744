"""Several `relay serve` processes peered with each other: start, publish, SIGKILL, partition, compare.

How this works
--------------
`RelayProcess` is one node: a config file (`peer_toml`: its own SQLite file,
fast sync timings, `[[sync.peers]]` tables), run with `tests.served.Served`
on a fixed 127.0.0.1 port, so it restarts on the same database and URL.
`Mesh` starts one node per entry of a topology (`ring`, `full_mesh`: node
i's peers, direction "both"), keeps one client connection per running node,
and stops every process it started when its `async with` ends, whatever
happened.  `table_dumps` and `expired_events` read a node's database
read-only, `verify` runs `relay verify` on it.

The seeded workload that is played on a mesh, and the model its converged
state is checked against, are in tests/sync/mesh_workload.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import sqlite3
from itertools import count
from pathlib import Path

from relay.config import load_config
from relay.commands.projectors import run_verify
from relay.store.projectors.tables import quote
from tests.helpers import Client
from tests.served import START_TIMEOUT, Served, free_port, relay_cli

# Fast sync for tests: reconnect within a second, a lease that a killed process leaves for seconds only.
TEST_SYNC = {"interval_seconds": 60.0, "timeout_seconds": 5.0, "connect_timeout_seconds": 2.0,
             "backoff_initial_seconds": 0.2, "backoff_max_seconds": 1.0, "lease_seconds": 3.0}


def peer_toml(db_path: Path, peers: list[str], filter_obj: dict | None = None, settings: dict | None = None) -> str:
    """A relay config: its database, fast sync timings for tests, and `peers` as [[sync.peers]] tables.

    `settings` maps a section to scalar keys that override these (e.g. {"sync": {"interval_seconds": 1.0}}).
    """
    sections: dict[str, dict] = {"store": {"path": str(db_path)}, "log": {"format": "json"}, "sync": dict(TEST_SYNC)}
    for section, values in (settings or {}).items():
        sections.setdefault(section, {}).update(values)
    # A JSON string, number or boolean is written the same way in TOML.
    text = "".join(f"[{section}]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in values.items())
                   for section, values in sections.items())
    for url in peers:
        text += f'[[sync.peers]]\nurl = "{url}"\n'
        if filter_obj is not None:
            text += f"filter = '{json.dumps(filter_obj)}'\n"
    return text


class RelayProcess:
    """`python -m relay serve --config PATH --port PORT` in `tmp_path/name`, JSON logs kept across restarts."""

    def __init__(self, tmp_path: Path, name: str, port: int, peers: list[str], filter_obj: dict | None = None,
                 settings: dict | None = None):
        self.dir = tmp_path / name
        self.dir.mkdir(exist_ok=True)
        self.db = self.dir / "relay.db"
        self.config_path = self.dir / "relay.toml"
        self.config_path.write_text(peer_toml(self.db, peers, filter_obj, settings))
        self.config = load_config(self.config_path)
        self.port = port
        self.url = f"ws://127.0.0.1:{port}"
        self.served: Served | None = None  # the running process, if any
        self._runs: list[Served] = []  # every process started, for their logs

    @property
    def running(self) -> bool:
        """True from `launch` until `stop` or `kill`."""
        return self.served is not None

    def launch(self) -> None:
        """Start the process without waiting for it (`wait_started` does)."""
        assert self.served is None, f"{self.url} is running"
        self.served = Served(self.dir, "--config", self.config_path, "--port", self.port).__enter__()
        self._runs.append(self.served)

    def wait_started(self) -> RelayProcess:
        """Wait until /health answers (bounded by tests.served.START_TIMEOUT); fails if the process exited."""
        self.served.wait_health(self.port)
        return self

    def start(self) -> RelayProcess:
        """Start the process on its database and port, and wait until it serves."""
        self.launch()
        return self.wait_started()

    def stop(self) -> int:
        """SIGTERM and its exit code (0 when not running); SIGKILL if it does not exit in time."""
        if self.served is None:
            return 0
        served, self.served = self.served, None
        try:
            return served.stop()
        finally:
            served.__exit__(None, None, None)

    def kill(self) -> None:
        """SIGKILL (a crash: no shutdown code runs); the database stays for a restart."""
        served, self.served = self.served, None
        try:
            served.kill()
        finally:
            served.__exit__(None, None, None)

    def log_events(self) -> list[dict]:
        """The JSON log lines of every run of this node, in order."""
        return [entry for run in self._runs for entry in run.log_events()]

    def status(self) -> dict:
        """`relay status --json` on this node's config."""
        out = relay_cli("status", "--json", "--config", self.config_path)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)


def ring(nodes: int) -> list[list[int]]:
    """Node i peers with node i+1, the last with the first: with direction "both", events travel around."""
    return [[(i + 1) % nodes] for i in range(nodes)]


def full_mesh(nodes: int) -> list[list[int]]:
    """Every node peers with every other one (so each pair syncs twice, once from each side)."""
    return [[j for j in range(nodes) if j != i] for i in range(nodes)]


TOPOLOGIES = {"ring": ring, "mesh": full_mesh}


class Mesh:
    """Relay processes on 127.0.0.1, node i peered with the nodes `topology[i]` names; `async with` starts them
    all and stops every process started, whatever happens."""

    def __init__(self, workdir: Path, topology: list[list[int]], settings: dict | None = None):
        ports = [free_port() for _ in topology]
        self.nodes = [RelayProcess(workdir, f"node{i}", ports[i], [f"ws://127.0.0.1:{ports[j]}" for j in peers],
                                   settings=settings) for i, peers in enumerate(topology)]
        self._clients: dict[int, Client] = {}
        self._sub_ids = count()

    async def __aenter__(self) -> Mesh:
        try:
            for node in self.nodes:  # all at once: their imports overlap
                node.launch()
            for node in self.nodes:
                node.wait_started()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the clients and stop (SIGTERM) every node still running; each one is tried."""
        for i in list(self._clients):
            await self._drop_client(i)
        failures = []
        for node in self.nodes:
            try:
                node.stop()
            except Exception as exc:  # stop the others first; then say so
                failures.append(exc)
        if failures:
            raise failures[0]

    async def _client(self, i: int) -> Client:
        if i not in self._clients:
            self._clients[i] = await Client.connect(self.nodes[i].url, open_timeout=START_TIMEOUT)
        return self._clients[i]

    async def _drop_client(self, i: int) -> None:
        client = self._clients.pop(i, None)
        if client is not None:
            await client.close()

    async def publish(self, i: int, event: dict) -> list:
        """Send `event` to node i and return its OK reply."""
        return await (await self._client(i)).publish(event)

    async def served(self, i: int) -> dict[str, dict]:
        """Id -> event of everything node i serves for a REQ `{}` (the config's default limit applies)."""
        client, sub_id = await self._client(i), f"all{next(self._sub_ids)}"  # never a live event of an older REQ
        try:
            return {e["id"]: e for e in await client.req(sub_id, {})}
        finally:
            await client.send(["CLOSE", sub_id])

    async def served_all(self) -> list[dict[str, dict]]:
        """`served` of every node, in node order."""
        return [await self.served(i) for i in range(len(self.nodes))]

    async def kill(self, i: int) -> None:
        """SIGKILL node i, which stays down until `start(i)`."""
        await self._drop_client(i)
        self.nodes[i].kill()

    async def stop(self, i: int) -> None:
        """SIGTERM node i (its shutdown runs), which stays down until `start(i)`."""
        await self._drop_client(i)
        assert self.nodes[i].stop() == 0

    def start(self, i: int) -> None:
        """Restart node i on its database and port, and wait until it serves."""
        self.nodes[i].start()


def _read_only(db_path: Path) -> sqlite3.Connection:
    # mode=ro: a reader beside `relay serve` (WAL), or after it, never writes
    return sqlite3.connect(db_path.resolve().as_uri() + "?mode=ro", uri=True)


def table_dumps(db_path: Path, tables: list[str]) -> dict[str, list[tuple]]:
    """Every row of each of `tables`, all columns, ordered by all columns; and "events": each stored event's
    columns that do not depend on the node (not seq, not origin), by id."""
    with contextlib.closing(_read_only(db_path)) as conn:
        dumps = {"events": conn.execute("SELECT id, pubkey, created_at, kind, d_tag, expiration, raw FROM events"
                                        " ORDER BY id").fetchall()}
        for table in tables:
            columns = len(conn.execute(f"SELECT * FROM {quote(table)} LIMIT 0").description)
            order = ", ".join(str(n) for n in range(1, columns + 1))
            dumps[table] = conn.execute(f"SELECT * FROM {quote(table)} ORDER BY {order}").fetchall()
        return dumps


def expired_events(db_path: Path, now: float) -> list[str]:
    """Ids (hex) of the events stored with a NIP-40 expiration at or before `now` (unix seconds)."""
    with contextlib.closing(_read_only(db_path)) as conn:
        return [row[0].lower() for row in conn.execute(
            "SELECT hex(id) FROM events WHERE expiration <= ?", (int(now),))]


def projected_tables(node: RelayProcess) -> list[str]:
    """The tables of the node's configured projectors (the four built-in ones by default)."""
    return [spec.name for spec in node.config.projectors]


def verify(node: RelayProcess) -> tuple[int, str]:
    """`relay verify` on the node's database: (exit code, what it printed)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_verify(node.config)
    return code, out.getvalue()
