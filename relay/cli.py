"""The `relay` command line: serve, import, export, sync, status, key, backup, verify, projectors, query.

This module parses the arguments and dispatches; the bodies are in
relay/commands/ (and `relay serve` is relay/node.py's `run`).

Every subcommand takes `--config PATH` and `--db PATH`; flags override
`RELAY_<SECTION>__<KEY>` environment variables, which override the file.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import structlog

from relay.config import Config, ConfigError, load_config
from relay.logging import configure_logging


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, help="TOML configuration file (default: built-in defaults)")
    common.add_argument("--db", help="SQLite database file (default: data/relay.db)")
    parser = argparse.ArgumentParser(prog="relay", description="A Nostr relay on SQLite.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", parents=[common], help="run the relay")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="TCP port (default 7777; 0 picks a free one)")
    imp = commands.add_parser("import", parents=[common], help="validate and store events from a JSONL file")
    imp.add_argument("file", type=Path, help="JSONL file, one event object per line ('-' for stdin)")
    exp = commands.add_parser("export", parents=[common], help="write stored events as JSONL")
    exp.add_argument("--filter", default="{}", help="a NIP-01 filter as JSON; its limit, if any, applies (default: every event)")
    exp.add_argument("--output", "-o", type=Path, help="file to write (default: stdout)")
    sync = commands.add_parser("sync", parents=[common], help="reconcile with another relay over NIP-77, once")
    sync.add_argument("url", help="the peer relay's ws:// or wss:// URL")
    sync.add_argument("--filter", default="{}", help="a NIP-01 filter as JSON, without limit (default: every event)")
    sync.add_argument("--dir", dest="direction", default="both", choices=("down", "up", "both"),
                      help="down: fetch what we lack; up: send what the peer lacks; both (default)")
    sync.add_argument("--frame-size", type=int, help="bytes per negentropy message (default: sync.frame_size_limit)")
    status = commands.add_parser("status", parents=[common], help="database size, events by kind, sync peers")
    status.add_argument("--json", action="store_true", help="print JSON for scripts")
    key = commands.add_parser("key", parents=[common], help="print a node's pubkey (--file: creating that key file if absent)")
    key.add_argument("--file", type=Path, help="the key file (default: sync.secret_key_file, else sync.key beside the db)")
    backup = commands.add_parser("backup", parents=[common], help="write a consistent copy of the database "
                                 "(while the relay serves)")
    backup.add_argument("path", type=Path, help="the copy's file name; must not exist")
    _projector_parsers(commands, common)
    return parser


def _projector_parsers(commands, common: argparse.ArgumentParser) -> None:
    """`verify`, `projectors list | rebuild NAME | refusals`, `query TABLE` (bodies in relay/commands/projectors.py)."""
    commands.add_parser("verify", parents=[common],
                        help="recompute every projected table and negentropy index from the events; exit 1 on any difference")
    proj = commands.add_parser("projectors", parents=[common], help="projected tables: list, rebuild, refusals")
    actions = proj.add_subparsers(dest="action", required=True)
    actions.add_parser("list", parents=[common], help="projectors with kind, revision, state, rows, refusals")
    rebuild = actions.add_parser("rebuild", parents=[common], help="recompute one projector's tables now")
    rebuild.add_argument("name", help="the projector (table) name")
    refusals = actions.add_parser("refusals", parents=[common], help="events stored but not projected, newest first")
    refusals.add_argument("--projector", help="only this projector's refusals")
    refusals.add_argument("--limit", type=int, default=100, help="rows to show (default 100)")
    refusals.add_argument("--json", action="store_true", help="one JSON object per line")
    query = commands.add_parser("query", parents=[common], help="print the rows of a projected table")
    query.add_argument("table", help="a projected table, e.g. profiles")
    query.add_argument("--where", help="an SQL condition, e.g. \"name LIKE 'a%%'\" (read-only connection)")
    query.add_argument("--limit", type=int, help="rows to print at most (default: all)")
    query.add_argument("--json", action="store_true", help="one JSON object per line instead of tab-separated")


def _config(args: argparse.Namespace) -> Config:
    overrides = {"store": {"path": args.db}}
    if args.command == "serve":
        overrides["server"] = {"host": args.host, "port": args.port}
    return load_config(args.config, os.environ, overrides)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (1 also when stdout's reader went away)."""
    try:
        code = _main(argv)
        if not sys.stdout.closed:  # `export` closes it when done
            sys.stdout.flush()
        return code
    except BrokenPipeError:
        # `relay status --json | head`: stop quietly, as other tools do.  stdout is pointed at
        # /dev/null so that Python's own flush at exit cannot fail a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = _config(args)
        if args.command in ("serve", "import", "sync"):  # commands that take events: their policies must load
            from relay.ingest.policies import Policies

            Policies.load(config.policies).close()
    except ConfigError as exc:
        print(f"relay: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log.level, config.log.format)
    # Only the daemon's log says so by default: other commands' output is for the person who ran them.
    log = structlog.get_logger("relay")
    (log.info if args.command == "serve" else log.debug)(
        "config_loaded", file=str(args.config) if args.config else "built-in defaults")
    if args.command == "serve":
        import uvloop

        from relay.node import run

        return uvloop.run(run(config))
    if args.command == "import":
        from relay.commands.transfer import run_import

        return asyncio.run(run_import(config, args.file))
    if args.command == "sync":
        from relay.commands.sync import run_sync

        return asyncio.run(run_sync(config, args.url, args.filter, args.direction, args.frame_size))
    if args.command == "status":
        from relay.commands.status import run_status

        return run_status(config, args.json)
    if args.command == "key":
        from relay.commands.key import run_key
        from relay.keys import key_path

        return run_key(args.file or key_path(config.sync.secret_key_file, config.store.path), args.file is not None)
    if args.command == "backup":
        from relay.commands.backup import run_backup

        return run_backup(config, args.path)
    if args.command in ("verify", "projectors", "query"):
        return _run_projector_command(config, args)
    from relay.commands.transfer import run_export

    return asyncio.run(run_export(config, args.filter, args.output))


def _run_projector_command(config: Config, args: argparse.Namespace) -> int:
    from relay.commands import projectors as pc

    if args.command == "verify":
        return pc.run_verify(config)
    if args.command == "query":
        return pc.run_query(config, args.table, args.where, args.json, args.limit)
    if args.action == "list":
        return pc.run_projectors_list(config)
    if args.action == "rebuild":
        return pc.run_projectors_rebuild(config, args.name)
    return pc.run_projectors_refusals(config, args.projector, args.limit, args.json)
