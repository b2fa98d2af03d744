"""Types for the `relay` command line's arguments: each turns one argv string into a checked value.

Every option and positional of relay/cli.py goes through one of these as its argparse `type=`, so that a bad
value stops the command before anything runs: one line, `relay CMD: error: argument --pk: <what is wrong>
(see relay CMD --help)` (relay/cli.py's parser), exit 2.  Text is checked first everywhere: Python hands a byte of argv that is not UTF-8 over
as a lone surrogate (surrogateescape, U+DC80..U+DCFF), which SQLite, JSON and the log cannot encode, and a NUL,
which no real argv holds, cuts an SQL statement short.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import ipaddress
import json
import stat
from pathlib import Path
from urllib.parse import urlsplit

import orjson

from relay.protocol.nip19 import key_hex

MAX_TEXT_CHARS = 4096
"""Names, reasons, paths, URLs, `--param` values (a ban's reason is held to 1,000 by `relay ban` itself)."""
MAX_JSON_BYTES = 1 << 20
"""A JSON argument or `--where` SQL: 8 times what Linux lets one argv string hold (128 KiB)."""
MAX_JSON_DEPTH = 16
"""Nesting of a JSON argument: rows and filters need 2; orjson alone stops at 1024, past Python's own limits."""
MAX_WHOLE_NUMBER = 2**63 - 1
"""Cursors, limits, created_at: SQLite binds an integer as a signed 64-bit INTEGER."""
MAX_KIND = 65535


def _fail(message: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(message)


def _shown(text: str) -> str:
    """`text` for an error message: repr'd, cut to 200 characters."""
    return repr(text) if len(text) <= 200 else repr(text[:197]) + "..."


def text(value: str, max_chars: int = MAX_TEXT_CHARS) -> str:
    """`value` if it is valid UTF-8 (no surrogate), holds no NUL and has at most `max_chars` characters."""
    if len(value) > max_chars:
        raise _fail(f"longer than {max_chars} characters")
    if _not_utf8(value):
        raise _fail(f"not valid UTF-8 (a byte that is not UTF-8, or a lone surrogate): {_shown(value)}")
    if "\x00" in value:
        raise _fail("holds a NUL character")
    return value


def sql(value: str) -> str:
    """`--where`: SQL text, valid UTF-8, at most MAX_JSON_BYTES characters."""
    return text(value, MAX_JSON_BYTES)


def json_value(value: str, expected: str = "expected JSON") -> object:
    """A JSON text (UTF-8, at most MAX_JSON_BYTES, nested at most MAX_JSON_DEPTH deep) decoded; no string in it
    holds a lone surrogate (orjson refuses `\\ud800` escapes) and every integer fits SQLite's 64 bits."""
    text(value, MAX_JSON_BYTES)
    try:
        decoded = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):
            raise _fail(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
        if "surrogate" in str(exc):
            raise _fail(f"{_surrogate_at(value)}a lone surrogate (\\ud800-\\udfff without its pair) is not valid "
                        "UTF-8") from None
        raise _fail(f"{expected}, got {_shown(value)} (not JSON: {exc})") from None
    _check_tree(decoded)
    if _has_float(decoded):  # orjson decodes an integer past 64 bits as a float: look at the literals
        try:
            json.loads(value, parse_int=_int64)
        except OverflowError as exc:
            raise _fail(str(exc)) from None
    return decoded


def _int64(literal: str) -> int:
    """A JSON integer literal as an int; OverflowError past SQLite's 64 bits."""
    if len(literal.lstrip("-")) > 19 or not -MAX_WHOLE_NUMBER - 1 <= int(literal) <= MAX_WHOLE_NUMBER:
        raise OverflowError(f"the integer {_shown(literal)} is out of range (-2^63..2^63-1)")
    return int(literal)


def _has_float(decoded: object) -> bool:
    pending = [decoded]
    while pending:
        node = pending.pop()
        if type(node) is float:
            return True
        if type(node) in (dict, list):
            pending += node.values() if type(node) is dict else node
    return False


def _surrogate_at(value: str) -> str:
    """"KEY: " for the member of a JSON object whose string holds a lone surrogate (the stdlib decodes it), else ""."""
    try:
        decoded = json.loads(value)
    except (ValueError, RecursionError):
        return ""
    pending = [("", decoded)]
    while pending:
        key, node = pending.pop()
        if type(node) is str and _not_utf8(node) or type(node) is dict and any(map(_not_utf8, node)):
            return f"{key}: " if key else ""
        if type(node) in (dict, list):
            pending += list(node.items()) if type(node) is dict else [(key, child) for child in node]
    return ""


def _not_utf8(value: str) -> bool:
    """True when `value` cannot be encoded as UTF-8 (it holds a surrogate)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return True
    return False


def _check_tree(decoded: object) -> None:
    """Walk `decoded` without recursion: depth and integer range."""
    pending = [(decoded, 1)]
    while pending:
        node, depth = pending.pop()
        if type(node) is int and not -MAX_WHOLE_NUMBER - 1 <= node <= MAX_WHOLE_NUMBER:
            raise _fail(f"the integer {node} is out of range (-2^63..2^63-1)")
        if type(node) in (dict, list):
            if depth > MAX_JSON_DEPTH:
                raise _fail(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
            pending += [(child, depth + 1) for child in (node.values() if type(node) is dict else node)]


def json_object(value: str) -> dict:
    """`--pk`: a JSON object (of key columns)."""
    decoded = json_value(value, "expected a JSON object of key columns")
    if type(decoded) is not dict:
        raise _fail(f"expected a JSON object of key columns, got {_shown(value)}")
    return decoded


def json_row(value: str) -> dict | list:
    """`record put --row`: a JSON object, or a list of objects (a table with one row per tag)."""
    decoded = json_value(value, "expected a JSON object (or a list of them)")
    if type(decoded) is not dict and (type(decoded) is not list or any(type(row) is not dict for row in decoded)):
        raise _fail(f"expected a JSON object (or a list of them), got {_shown(value)}")
    return decoded


def nip01_filter(value: str) -> str:
    """`export --filter`: a NIP-01 filter, checked as a REQ's; the text itself is returned (the command parses it
    again, with the configuration's search setting)."""
    from relay.protocol.filters import parse_filter
    from relay.protocol.rejection import Rejection

    decoded = json_value(value, "expected a NIP-01 filter (a JSON object)")
    try:
        parse_filter(decoded)
    except Rejection as exc:
        raise _fail(str(exc)) from None
    return value


def sync_filter(value: str) -> str:
    """`sync --filter`: a NIP-01 filter without limit or search; the text itself is returned."""
    from relay.commands.sync import parse_sync_filter

    nip01_filter(value)
    try:
        parse_sync_filter(value)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    return value


def whole_number(what: str, maximum: int = MAX_WHOLE_NUMBER):
    """The type of a whole number 0..`maximum` (ASCII digits), named `what` in the error."""

    def parse(value: str) -> int:
        if not value.isascii() or not value.isdigit() or len(value) > 19 or int(value) > maximum:
            raise _fail(f"{what} is a whole number 0..{maximum}, got {_shown(value)}")
        return int(value)

    parse.__name__ = what  # argparse names the type in some messages
    return parse


cursor = whole_number("a cursor")


def feed_cursor(value: str) -> int | str:
    """`changes --since`: a change feed cursor, or `now` (from the newest position: only what comes next)."""
    return "now" if value == "now" else cursor(value)


unix_seconds = whole_number("created_at (unix seconds)")
row_limit = whole_number("a limit")
port_number = whole_number("a TCP port", 65535)
frame_size = whole_number("a frame size in bytes")


def kinds(value: str) -> frozenset[int]:
    """`--kinds K,...`: comma-separated kinds 0..65535."""
    parts = value.split(",")
    if not all(p.isascii() and p.isdigit() and len(p) <= 5 and int(p) <= MAX_KIND for p in parts):
        raise _fail(f"kinds are comma-separated numbers 0..{MAX_KIND}, got {_shown(value)}")
    return frozenset(map(int, parts))


def param(value: str) -> tuple[str, str]:
    """`query --param COL=VALUE`: (column, value), both text."""
    column, sep, found = text(value).partition("=")
    if not sep or not column:
        raise _fail(f"expected COL=VALUE, got {_shown(value)}")
    return column, found


def query_cursor(value: str) -> str:
    """`query --after`: a cursor a page printed: base64url of a JSON list of scalars, integers in 64 bits."""
    text(value)
    try:
        decoded = orjson.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    except (binascii.Error, ValueError):
        raise _fail(f"not a cursor this relay gave: {_shown(value)}") from None
    if type(decoded) is not list or not all(v is None or type(v) in (str, int, float) for v in decoded):
        raise _fail(f"not a cursor this relay gave: {_shown(value)}")
    _check_tree(decoded)
    return value


MAX_PATH_BYTES = 4095  # Linux PATH_MAX, less the NUL
MAX_NAME_BYTES = 255  # NAME_MAX of Linux file systems: one part of a path


def path(value: str) -> Path:
    """A file name: non-empty text (a name that is not UTF-8 cannot be given to SQLite) of a length the file
    system takes (past it, every call on it fails with ENAMETOOLONG, which the checks of `Path` do not catch)."""
    if not text(value):
        raise _fail("an empty path")
    found = Path(value)
    if len(value.encode()) > MAX_PATH_BYTES or any(len(part.encode()) > MAX_NAME_BYTES for part in found.parts):
        raise _fail(f"a path is at most {MAX_PATH_BYTES} bytes, each name in it {MAX_NAME_BYTES}: {_shown(value)}")
    return found


def database(value: str) -> str:
    """`--db`: a file name that is not a directory, kept as text (the configuration's `store.path`)."""
    found = path(value)
    if found.is_dir():
        raise _fail(f"{_shown(value)} is a directory (give a database file, e.g. DIR/relay.db)")
    return str(found)


def input_file(value: str) -> Path:
    """`import FILE`: '-' (stdin), or a file that exists and is not a directory (a FIFO or `<(...)` is fine)."""
    found = path(value)
    if value == "-":
        return found
    try:
        info = found.stat()
    except OSError as exc:
        raise _fail(f"{_shown(value)}: {exc.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        raise _fail(f"{_shown(value)} is a directory")
    return found


def output_file(value: str) -> Path:
    """`backup PATH`, `export -o`, `import --rejects`: not a directory, in a directory that exists."""
    found = path(value)
    try:
        if found.is_dir():
            raise _fail(f"{_shown(value)} is a directory")
        if not found.parent.is_dir():
            raise _fail(f"no directory {_shown(str(found.parent))} to hold {_shown(found.name)}")
    except OSError as exc:  # e.g. a loop of symbolic links
        raise _fail(f"{_shown(value)}: {exc.strerror}") from None
    return found


def key_file(value: str) -> Path:
    """`key --file`: a file that is not a directory, or one that can be created (with its missing directories)."""
    found = path(value)
    if found.is_dir():
        raise _fail(f"{_shown(value)} is a directory")
    ancestor = found.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise _fail(f"{_shown(str(ancestor))} is not a directory: no file can be created under it")
    return found


def ws_url(value: str) -> str:
    """`sync URL`: a ws:// or wss:// URL with a host, in ASCII (an international name in its xn-- form)."""
    text(value)
    if not value.startswith(("ws://", "wss://")):
        raise _fail(f"not a ws:// or wss:// URL: {_shown(value)}")
    if not value.isascii() or not value.isprintable() or " " in value:
        raise _fail(f"a URL is printable ASCII without spaces: {_shown(value)}")
    try:
        parts = urlsplit(value)
        parts.port  # raises ValueError for a port out of range
    except ValueError as exc:
        raise _fail(f"not a URL ({exc}): {_shown(value)}") from None
    if not parts.hostname:
        raise _fail(f"no host in {_shown(value)}")
    return value


def host(value: str) -> str:
    """`serve --host`: an address or host name, printable ASCII."""
    if not text(value).isascii() or not value.isprintable() or " " in value:
        raise _fail(f"an address or host name is printable ASCII without spaces: {_shown(value)}")
    return value


def pubkey(value: str) -> str:
    """A pubkey: 64 lowercase hex, or NIP-19 `npub1...` (given back as hex)."""
    return _key(value, "npub", "a pubkey")


def event_id(value: str) -> str:
    """An event id: 64 lowercase hex, or NIP-19 `note1...` (given back as hex)."""
    return _key(value, "note", "an event id")


def _key(value: str, hrp: str, what: str) -> str:
    from relay.protocol.event import is_hex64

    if is_hex64(text(value)):
        return value
    if value.lower().startswith(hrp + "1"):
        try:
            return key_hex(value, hrp)
        except ValueError as exc:
            raise _fail(f"not a valid {hrp}: {exc}") from None
    raise _fail(f"{what} is 64 lowercase hex characters or {hrp}1..., got {_shown(value)}")


def ip_network(value: str) -> str:
    """`ban ip`: an IP address or network (192.0.2.0/24), as `ipaddress` writes it."""
    try:
        return str(ipaddress.ip_network(text(value), strict=False))
    except ValueError:
        raise _fail(f"not an IP address or network: {_shown(value)}") from None


BAN_ITEMS = {"event": event_id, "pubkey": pubkey, "ip": ip_network}
"""`relay ban|unban WHAT ITEM`: ITEM's type for each WHAT."""
