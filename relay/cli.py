"""The `relay` command line: serve, import, export, sync, status, changes, key, backup, verify, projectors, query,
ban, unban, bans, record, shards.

This module parses the arguments and dispatches; the bodies are in
relay/commands/ (and `relay serve` is relay/assembly.py's `run`).

Every subcommand takes `--config PATH` (default: the file `RELAY_CONFIG`
names, if set) and `--db PATH`; flags override `RELAY_<SECTION>__<KEY>`
environment variables, which override the file.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import sys

import structlog

from relay import arguments as types
from relay.commands import check_database_path
from relay.config import Config, ConfigError, env_warnings, load_config
from relay.logging import configure_logging
from relay.protocol.information import software_version
from relay.store.location import DatabaseUnusable, os_reason
from relay.store.store import JobFailed, StoreFailed


CONFIG_ENV = "RELAY_CONFIG"
"""The environment variable naming the configuration file when `--config` is not given (a container's)."""


def _common(defaults: bool) -> argparse.ArgumentParser:
    """`--config` and `--db`; without `defaults` (an action's parser under `record` or `projectors`) an option
    left out there keeps what the group's parser read (`relay record --db X put ...`), as argparse would
    otherwise overwrite it with the default."""
    common = argparse.ArgumentParser(add_help=False)
    unset = {} if defaults else {"default": argparse.SUPPRESS}
    common.add_argument("--config", type=types.path, **({"default": os.environ.get(CONFIG_ENV) or None} | unset),
                        help=f"TOML configuration file (default: ${CONFIG_ENV} if set, else built-in defaults)")
    common.add_argument("--db", type=types.database, **unset, help="SQLite database file (default: data/relay.db)")
    return common


class _OneLineParser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors are one line on stderr (exit 2), pointing at `--help`."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    common = _common(defaults=True)
    parser = _OneLineParser(prog="relay", description="A Nostr relay on SQLite.")
    parser.add_argument("--version", action="version", version=f"relay {software_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", parents=[common], help="run the relay")
    serve.set_defaults(run=_serve)
    serve.add_argument("--host", type=types.host, help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=types.port_number, help="TCP port (default 7777; 0 picks a free one)")
    serve.add_argument("--workers", type=types.text, help='worker processes ("auto", the default: one per CPU, at most 8; 0: one process)')
    imp = commands.add_parser("import", parents=[common], help="validate and store events from a JSONL file")
    imp.set_defaults(run=_import)
    imp.add_argument("file", type=types.input_file, help="JSONL file, one event object per line ('-' for stdin)")
    imp.add_argument("--rejects", type=types.output_file, help="write each rejected line to this file as JSON lines "
                     '({"line", "id", "reason", "text"})')
    imp.add_argument("--create", action="store_true", help="start a new database if there is none (else exit 2)")
    imp.add_argument("--processes", type=types.whole_number("a number of processes", 256), metavar="N",
                     help="processes checking the lines' signatures (default: one per CPU; 0: threads of this one)")
    exp = commands.add_parser("export", parents=[common], help="write stored events as JSONL")
    exp.set_defaults(run=_export)
    exp.add_argument("--filter", type=types.nip01_filter, default="{}", help="a NIP-01 filter as JSON; its limit, if any, applies (default: every event)")
    exp.add_argument("--output", "-o", type=types.output_file, help="file to write (default: stdout)")
    sync = commands.add_parser("sync", parents=[common], help="reconcile with another relay over NIP-77, once")
    sync.set_defaults(run=_sync)
    sync.add_argument("url", type=types.ws_url, help="the peer relay's ws:// or wss:// URL")
    sync.add_argument("--filter", type=types.sync_filter, default="{}", help="a NIP-01 filter as JSON, without limit (default: every event)")
    sync.add_argument("--create", action="store_true", help="start a new database if there is none (else exit 2)")
    sync.add_argument("--dir", dest="direction", default="both", choices=("down", "up", "both"),
                      help="down: fetch what we lack; up: send what the peer lacks; both (default)")
    sync.add_argument("--frame-size", type=types.frame_size, help="bytes per negentropy message (default: sync.frame_size_limit)")
    status = commands.add_parser("status", parents=[common], help="database size, events by kind, sync peers")
    status.set_defaults(run=_status)
    status.add_argument("--json", action="store_true", help="print JSON for scripts")
    shards = commands.add_parser("shards", parents=[common], help="the fleet's coverage claims (kind 30803) stored here")
    shards.set_defaults(run=_shards)
    shards.add_argument("--json", action="store_true", help="print JSON for scripts")
    changes = commands.add_parser("changes", parents=[common], help="print the change feed (every insertion and "
                                  "removal, in commit order) as JSON lines")
    changes.set_defaults(run=_changes)
    changes.add_argument("--since", type=types.feed_cursor, metavar="CURSOR",
                         help="print the changes after this cursor (default: the oldest kept; now: what comes next)")
    changes.add_argument("--follow", action="store_true", help="keep printing new changes until interrupted")
    only = changes.add_mutually_exclusive_group()
    only.add_argument("--kinds", type=types.kinds, metavar="K,...", help="only changes of these event kinds")
    only.add_argument("--table", type=types.text, metavar="NAME", help="the rows of this projected table inserted, replaced and "
                      "removed instead (one of [store] row_change_tables)")
    key = commands.add_parser("key", parents=[common], help="print a node's pubkey (--file: creating that key file if absent)")
    key.set_defaults(run=_key)
    key.add_argument("--file", type=types.key_file, help="the key file (default: sync.secret_key_file, else <db>.key beside the db)")
    backup = commands.add_parser("backup", parents=[common], help="write a consistent copy of the database "
                                 "(while the relay serves)")
    backup.set_defaults(run=_backup)
    backup.add_argument("path", type=types.output_file, help="the copy's file name; must not exist")
    _projector_parsers(commands, common)
    _ban_parsers(commands, common)
    _record_parsers(commands, common)
    return parser


def _record_parsers(commands, common: argparse.ArgumentParser) -> None:
    """`record put | delete | get` (body in relay/commands/records.py)."""
    record = commands.add_parser("record", parents=[common], help="write, delete or read a row of a declared "
                                 "projector (a row is signed into an event)")
    record.set_defaults(run=_record)
    actions = record.add_subparsers(dest="action", required=True)
    inner = _common(defaults=False)
    put = actions.add_parser("put", parents=[inner], help="sign the row into an event and store it")
    put.add_argument("table", type=types.text, help="a declared projector's table, e.g. profiles")
    put.add_argument("--row", type=types.json_row, required=True, help="the row as a JSON object (a list of them for a "
                     "table with one row per tag, e.g. follows: the whole set)")
    put.add_argument("--key", type=types.path, help="sign with the secret key in this file (default: the node key)")
    put.add_argument("--created-at", type=types.unix_seconds, help="the event's created_at (default: reserved per coordinate)")
    put.add_argument("--no-wait", dest="wait", action="store_false",
                     help="exit 3 (rate-limited) instead of waiting when writes to one row come too fast")
    delete = actions.add_parser("delete", parents=[inner], help="delete the row's event (NIP-09)")
    delete.add_argument("table", type=types.text, help="a declared projector's table")
    delete.add_argument("--pk", type=types.json_object, required=True, help="the event's key columns as a JSON object")
    delete.add_argument("--key", type=types.path, help="sign with the secret key in this file (default: the node key)")
    delete.add_argument("--reason", type=types.text, default="", help="the deletion's content")
    get = actions.add_parser("get", parents=[inner], help="print the row whose key is --pk as JSON")
    get.add_argument("table", type=types.text, help="a declared projector's table")
    get.add_argument("--pk", type=types.json_object, required=True, help="the key columns as a JSON object")




def _ban_parsers(commands, common: argparse.ArgumentParser) -> None:
    """`ban event|pubkey|ip`, `unban event|pubkey|ip`, `bans` (bodies in relay/commands/bans.py)."""
    ban = commands.add_parser("ban", parents=[common], help="ban an event (removed now) or a pubkey, or block an "
                              "IP (NIP-86's banevent, banpubkey, blockip); a running relay applies it within "
                              "admin.refresh_seconds")
    ban.set_defaults(run=_ban)
    ban.add_argument("what", choices=("event", "pubkey", "ip"))
    ban.add_argument("item", action=_BanItem, help="the event id or pubkey (64 hex, or note1... / npub1...), or "
                     "the IP address or network")
    ban.add_argument("--reason", type=types.text, default="", help="why (shown by `relay bans` and NIP-86's lists)")
    ban.add_argument("--purge", action="store_true", help="pubkey: remove its stored events too, in batches")
    unban = commands.add_parser("unban", parents=[common], help="lift a ban on an event or pubkey, or unblock an IP")
    unban.set_defaults(run=_unban)
    unban.add_argument("what", choices=("event", "pubkey", "ip"))
    unban.add_argument("item", action=_BanItem, help="the event id or pubkey (64 hex, or note1... / npub1...), "
                       "or the IP address or network")
    bans = commands.add_parser("bans", parents=[common], help="banned pubkeys and events, blocked IPs, kind rules")
    bans.set_defaults(run=_bans)
    bans.add_argument("--json", action="store_true", help="print JSON for scripts")



class _BanItem(argparse.Action):
    """`ban|unban WHAT ITEM`: ITEM of the type WHAT names (relay.arguments.BAN_ITEMS); argparse has read WHAT, the
    positional before it, by then."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        try:
            setattr(namespace, self.dest, types.BAN_ITEMS[namespace.what](value))
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None


def _projector_parsers(commands, common: argparse.ArgumentParser) -> None:
    """`verify`, `projectors list | rebuild NAME | refusals`, `query TABLE` (bodies in relay/commands/projectors.py)."""
    commands.add_parser("verify", parents=[common], help="recompute every projected table and negentropy index from "
                        "the events; exit 1 on any difference").set_defaults(run=_verify)
    proj = commands.add_parser("projectors", parents=[common], help="projected tables: list, rebuild, refusals")
    actions = proj.add_subparsers(dest="action", required=True)
    inner = _common(defaults=False)
    actions.add_parser("list", parents=[inner], help="projectors with kind, revision, state, rows, refusals"
                       ).set_defaults(run=_projectors_list)
    rebuild = actions.add_parser("rebuild", parents=[inner], help="recompute one projector's tables now")
    rebuild.set_defaults(run=_projectors_rebuild)
    rebuild.add_argument("name", type=types.text, help="the projector (table) name")
    refusals = actions.add_parser("refusals", parents=[inner], help="events stored but not projected, newest first")
    refusals.set_defaults(run=_projectors_refusals)
    refusals.add_argument("--projector", type=types.text, help="only this projector's refusals")
    refusals.add_argument("--limit", type=types.row_limit, default=100, help="rows to show (default 100)")
    refusals.add_argument("--json", action="store_true", help="one JSON object per line")
    query = commands.add_parser("query", parents=[common], help="print the rows of a projected table")
    query.add_argument("table", type=types.text, help="a projected table, e.g. profiles")
    query.add_argument("--where", type=types.sql, help="an SQL condition, e.g. \"name LIKE 'a%%'\" (read-only connection)")
    query.add_argument("--limit", type=types.row_limit, help="rows to print at most (default: all)")
    query.add_argument("--pk", type=types.json_object, help="the row whose key is this JSON object, e.g. "
                       "'{\"pubkey\": \"ab...\"}' (a declared projector's table)")
    query.add_argument("--param", action="append", type=types.param, default=[], metavar="COL=VALUE",
                       help="rows whose key or indexed column COL equals VALUE (repeatable; bound, not SQL)")
    query.add_argument("--order-by", type=types.text, metavar="COL", help="order by this key or indexed column, then the key")
    query.add_argument("--after", type=types.query_cursor, metavar="CURSOR", help="the page after this cursor (printed on stderr by the "
                       "previous page when --limit cut it)")
    shape = query.add_mutually_exclusive_group()
    shape.add_argument("--json", dest="output", action="store_const", const="json",
                       help="one JSON object per line instead of tab-separated")
    shape.add_argument("--csv", dest="output", action="store_const", const="csv", help="CSV (RFC 4180) with a header")
    query.set_defaults(output="tsv", run=_query)






def _keyset(args: argparse.Namespace):
    """`relay query`'s bound-parameter options as a KeysetQuery (None: none given)."""
    from relay.commands.projectors import KeysetQuery

    if args.pk is None and not args.param and args.order_by is None and args.after is None:
        return None
    return KeysetQuery(args.pk, dict(args.param), args.order_by, args.after)


def _config(args: argparse.Namespace) -> Config:
    overrides = {"store": {"path": args.db}}
    if args.command == "serve":
        overrides["server"] = {"host": args.host, "port": args.port, "workers": args.workers}
    for warning in env_warnings(os.environ):  # (RELAY_SERVER_PORT: one underscore, silently ignored otherwise)
        print(f"relay: warning: {warning}", file=sys.stderr)
    return load_config(args.config, os.environ, overrides)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code: 2 for a usage error (argparse exits), else the command's,
    and 1 when the output cannot be written: quietly when stdout's reader went away (`relay export | head`),
    with one line on stderr otherwise (a full disk, stdout closed: `>&-`)."""
    args = _parser().parse_args(argv)
    try:
        if sys.stdout is None and args.command != "serve":  # started with stdout closed; serve writes none
            raise OSError(errno.EBADF, "standard output is closed")
        code = _main(args)
        if not sys.stdout.closed:  # `export` closes it when done
            sys.stdout.flush()
        return code
    except BrokenPipeError:
        # `relay status --json | head`: stop quietly, as other tools do.
        _stdout_to_devnull()
        return 1
    except OSError as exc:
        if args.command == "serve":  # the daemon says what failed in its log (assembly.py); stdout is none of it
            raise
        _stdout_to_devnull()
        where = exc.filename or "cannot write the output"
        print(f"relay {args.command}: {where}: {os_reason(exc)}", file=sys.stderr)
        return 1


def _stdout_to_devnull() -> None:
    """Point file descriptor 1 at /dev/null, so that Python's own flush of what stdout still buffers, at
    exit, cannot fail a second time (with a traceback); only when stdout is the process's own (not a caller's
    redirection, as in tests)."""
    if sys.stdout is None or sys.stdout is sys.__stdout__:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)


def _main(args: argparse.Namespace) -> int:
    try:
        return _dispatch(args)
    except DatabaseUnusable as exc:  # one line naming the path, as for a bad configuration
        print(f"relay {args.command}: database {exc}", file=sys.stderr)
        return 2
    except (JobFailed, StoreFailed) as exc:  # the writer refused this command's change (logged there)
        print(f"relay {args.command}: the relay could not apply it: {exc}", file=sys.stderr)
        return 1


def _dispatch(args: argparse.Namespace) -> int:
    try:
        config = _config(args)
        if args.command in ("serve", "import", "sync", "record") and getattr(args, "action", "") != "get":
            # the commands that take events (`record get` only reads): their policies must load
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
    return args.run(config, args)


# The commands' handlers (argparse's `run` default of each sub-command): the loaded configuration and the
# parsed arguments in, the exit code out; each imports its body when run, so `relay status` loads no server.

def _serve(config: Config, args: argparse.Namespace) -> int:
    import uvloop

    try:
        check_database_path(config, create=True)  # a mistyped --db is not a new folder (the default's data/ is)
    except DatabaseUnusable as exc:  # in the daemon's log, as assembly.py says a path it cannot use
        structlog.get_logger("relay").error("database_unusable", path=exc.path, error=exc.reason)
        return 2

    from relay.supervisor import serve

    return uvloop.run(serve(config))


def _import(config: Config, args: argparse.Namespace) -> int:
    from relay.commands.transfer import run_import

    return asyncio.run(run_import(config, args.file, args.rejects, args.create, args.processes))


def _export(config: Config, args: argparse.Namespace) -> int:
    from relay.commands.transfer import run_export

    return asyncio.run(run_export(config, args.filter, args.output))


def _sync(config: Config, args: argparse.Namespace) -> int:
    from relay.commands.sync import run_sync

    return asyncio.run(run_sync(config, args.url, args.filter, args.direction, args.frame_size, args.create))


def _shards(config: Config, args: argparse.Namespace) -> int:
    from relay.commands.shards import run_shards

    return run_shards(config, args.json)


def _status(config: Config, args: argparse.Namespace) -> int:
    from relay.commands.status import run_status

    return run_status(config, args.json)


def _changes(config: Config, args: argparse.Namespace) -> int:
    from relay.commands.changes import run_changes

    return run_changes(config, args.since, args.follow, args.kinds, args.table)


def _key(config: Config, args: argparse.Namespace) -> int:
    from relay.commands.key import run_key
    from relay.keys import key_path

    return run_key(args.file or key_path(config.sync.secret_key_file, config.store.path), args.file is not None)


def _backup(config: Config, args: argparse.Namespace) -> int:
    from relay.commands.backup import run_backup

    return run_backup(config, args.path)


def _record(config: Config, args: argparse.Namespace) -> int:
    from relay.commands.records import run_record

    data = args.row if args.action == "put" else args.pk
    return asyncio.run(run_record(config, args.action, args.table, data, getattr(args, "key", None),
                                  getattr(args, "created_at", None), getattr(args, "wait", True),
                                  getattr(args, "reason", "")))


def _ban(config: Config, args: argparse.Namespace) -> int:
    from relay.commands.bans import run_ban

    return asyncio.run(run_ban(config, args.what, args.item, args.reason, args.purge))


def _unban(config: Config, args: argparse.Namespace) -> int:
    from relay.commands.bans import run_unban

    return asyncio.run(run_unban(config, args.what, args.item))


def _bans(config: Config, args: argparse.Namespace) -> int:
    from relay.commands.bans import run_bans

    return asyncio.run(run_bans(config, args.json))


def _verify(config: Config, args: argparse.Namespace) -> int:
    from relay.commands.projectors import run_verify

    return run_verify(config)


def _query(config: Config, args: argparse.Namespace) -> int:
    from relay.commands.projectors import run_query

    keyset = _keyset(args)
    if keyset is not None and (args.where or (args.pk is not None and (args.param or args.order_by or args.after))):
        print("relay query: --where (SQL) and --pk (one row) go alone; --param, --order-by and --after go "
              "together", file=sys.stderr)
        return 2
    seen: set[str] = set()
    for column, _ in args.param:  # as GET /tables refuses `?col=a&col=b`: an equality holds one value
        if column in seen:
            print(f"relay query: {column}: given twice", file=sys.stderr)
            return 2
        seen.add(column)
    return run_query(config, args.table, args.where, args.output, args.limit, keyset)


def _projectors_list(config: Config, args: argparse.Namespace) -> int:
    from relay.commands.projectors import run_projectors_list

    return run_projectors_list(config)


def _projectors_rebuild(config: Config, args: argparse.Namespace) -> int:
    from relay.commands.projectors import run_projectors_rebuild

    return run_projectors_rebuild(config, args.name)


def _projectors_refusals(config: Config, args: argparse.Namespace) -> int:
    from relay.commands.projectors import run_projectors_refusals

    return run_projectors_refusals(config, args.projector, args.limit, args.json)
