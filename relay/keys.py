"""The node's own key: created once with mode 0600; answers NIP-42 AUTH challenges of peers and signs records.

By default each database has its own (`key_path`), beside it."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path

import structlog
from coincurve import PrivateKey

from relay.protocol.auth import AUTH_KIND
from relay.protocol.event import serialize_for_id

log = structlog.get_logger(__name__)


MAX_KEY_FILE_BYTES = 4096  # a key file holds 64 hex digits and a newline; more is not a key file


class NodeKeyError(RuntimeError):
    """The key file cannot be read, created, or does not hold a 64-hex secret key."""


class NodeKey:
    """A BIP-340 key pair: `pubkey` is 64 lowercase hex (x-only), `sign_event` builds signed events."""

    def __init__(self, secret: bytes) -> None:
        self._private = PrivateKey(secret)
        self.pubkey = self._private.public_key_xonly.format().hex()

    def sign_event(self, kind: int, tags: list[list[str]], content: str = "",
                   created_at: int | None = None) -> dict:
        """A signed NIP-01 event as a JSON-ready dict; `created_at` defaults to now (unix seconds)."""
        created_at = int(time.time()) if created_at is None else created_at
        event_id = hashlib.sha256(serialize_for_id(self.pubkey, created_at, kind, tags, content)).hexdigest()
        sig = self._private.sign_schnorr(bytes.fromhex(event_id)).hex()
        return {"id": event_id, "pubkey": self.pubkey, "created_at": created_at, "kind": kind,
                "tags": tags, "content": content, "sig": sig}

    def auth_event(self, relay_url: str, challenge: str) -> dict:
        """The NIP-42 kind-22242 event answering `challenge` from `relay_url` (tags `relay`, `challenge`)."""
        return self.sign_event(AUTH_KIND, [["relay", relay_url], ["challenge", challenge]])


KEY_SUFFIX = ".key"  # the default key file: the database's file name and this, beside it
LEGACY_KEY_FILE = "sync.key"  # the default before: one per folder, whatever the databases in it


def key_path(secret_key_file: str, db_path: str) -> Path:
    """Where the node key lives: `secret_key_file`, or when it is "" the database's own, beside it
    (`data/relay.db` -> `data/relay.db.key`): two databases, two nodes, two keys.

    With the default, a database whose key file is absent takes over the `sync.key` an earlier version left in
    its folder (the identity its peers know): renamed, so that one database only gets it (the others get new
    keys), and logged `node_key_taken_over`.
    """
    if secret_key_file:
        return Path(secret_key_file)
    db = Path(db_path)
    path = db.with_name(db.name + KEY_SUFFIX)
    legacy = db.parent / LEGACY_KEY_FILE
    if not path.exists():
        try:
            os.rename(legacy, path)  # atomic: one database wins it
        except FileNotFoundError:
            pass  # none left there, or another database's already
        except OSError as exc:
            log.warning("node_key_take_over_failed", legacy=str(legacy), path=str(path), error=str(exc))
        else:
            log.warning("node_key_taken_over", legacy=str(legacy), path=str(path),
                        hint="the node key of this database is now this file, one per database")
    return path


def load_or_create(path: Path) -> NodeKey:
    """Read the node's secret key (64 hex + newline) from `path`, creating it (mode 0600) if absent.

    Creation is atomic (O_EXCL), so two processes starting at once agree on one key.

    Raises:
        NodeKeyError: unreadable file, or content that is not a valid 64-hex secret key.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    except OSError as exc:
        raise NodeKeyError(f"{path}: cannot create the node key: {exc}") from None
    else:
        secret = os.urandom(32)
        with os.fdopen(fd, "w") as f:
            f.write(secret.hex() + "\n")
        key = NodeKey(secret)
        log.info("node_key_created", path=str(path), pubkey=key.pubkey)
        return key
    try:
        for _ in range(20):  # another process may have created it a moment ago and be writing it
            with path.open("rb") as f:  # bounded: --file may name /dev/zero or a huge file by mistake
                text = f.read(MAX_KEY_FILE_BYTES + 1).decode("ascii").strip()
            if text:
                break
            time.sleep(0.05)
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise NodeKeyError(f"{path}: cannot read the node key: {exc}") from None
    try:
        secret = bytes.fromhex(text)
        if len(secret) != 32:
            raise ValueError("not 32 bytes")
        key = NodeKey(secret)
    except ValueError:
        raise NodeKeyError(f"{path}: must hold one 64-hex secret key") from None
    # Warned only for a real key: a file that is not one is refused above, whatever its mode.
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("node_key_readable_by_others", path=str(path), mode=oct(mode & 0o777))
    return key
