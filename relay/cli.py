"""The `relay` command line: serve, import, export.

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
    exp.add_argument("--filter", default="{}", help="a NIP-01 filter as JSON (default: every event)")
    exp.add_argument("--output", "-o", type=Path, help="file to write (default: stdout)")
    return parser


def _config(args: argparse.Namespace) -> Config:
    overrides = {"store": {"path": args.db}}
    if args.command == "serve":
        overrides["server"] = {"host": args.host, "port": args.port}
    return load_config(args.config, os.environ, overrides)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        config = _config(args)
    except ConfigError as exc:
        print(f"relay: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log.level, config.log.format)
    structlog.get_logger("relay").info("config_loaded", file=str(args.config) if args.config else "built-in defaults")
    if args.command == "serve":
        import uvloop

        from relay.server.app import run_relay

        return uvloop.run(run_relay(config))
    if args.command == "import":
        from relay.commands import run_import

        return asyncio.run(run_import(config, args.file))
    from relay.commands import run_export

    return asyncio.run(run_export(config, args.filter, args.output))
