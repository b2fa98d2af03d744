"""A NIP-86 client for tests: NIP-98 auth events built and signed by nostr-sdk (not by the relay's code)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
import urllib.error
import urllib.request

import nostr_sdk as sdk

CONTENT_TYPE = "application/nostr+json+rpc"
PUBLIC_URL = "wss://relay.example"
"""The `[server] public_url` of the tests' relays: NIP-98 `u` tags name it, whatever port serves them."""
ADMIN_SECRET = 0xAD417


def admin_keys(secret: int = ADMIN_SECRET) -> sdk.Keys:
    """nostr-sdk keys for `secret`."""
    return sdk.Keys.parse(f"{secret:064x}")


def admin_config(pubkeys: list[str] | None = None, **admin) -> dict:
    """Config sections of a relay managed by `admin_keys()` (or `pubkeys`) at PUBLIC_URL."""
    return {"server": {"public_url": PUBLIC_URL},
            "admin": {"pubkeys": pubkeys or [admin_keys().public_key().to_hex()], **admin}}


def authorization(body: bytes, keys: sdk.Keys | None = None, url: str = PUBLIC_URL, method: str = "POST",
                  created_at: int | None = None, kind: int = 27235, payload: str | None = None,
                  extra_tags: list[list[str]] = ()) -> str:
    """`Nostr <base64 event>`: a NIP-98 event for `body`, signed by nostr-sdk; each argument can be made wrong,
    and `extra_tags` follow the u, method and payload tags."""
    tags = [["u", url], ["method", method], ["payload", payload or hashlib.sha256(body).hexdigest()], *extra_tags]
    builder = sdk.EventBuilder(sdk.Kind(kind), "").tags([sdk.Tag.parse(t) for t in tags])
    builder = builder.custom_created_at(sdk.Timestamp.from_secs(created_at or int(time.time())))
    event = builder.finalize(keys or admin_keys())
    return "Nostr " + base64.b64encode(event.as_json().encode()).decode()


def post(port: int, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    """POST `body` to / on loopback `port`; (status, JSON answer)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def call(port: int, method: str, *params, keys: sdk.Keys | None = None) -> tuple[int, dict]:
    """One NIP-86 call, properly authorized by `keys` (default: the admin); (status, JSON answer).

    The same call twice in one second is the same auth event signed twice: nostr-sdk's BIP-340 signatures
    use fresh auxiliary randomness, so the relay takes each once.
    """
    body = json.dumps({"method": method, "params": list(params)}).encode()
    headers = {"Content-Type": CONTENT_TYPE, "Authorization": authorization(body, keys)}
    return await asyncio.to_thread(post, port, body, headers)


async def result(port: int, method: str, *params) -> object:
    """The `result` of a NIP-86 call that must succeed."""
    status, answer = await call(port, method, *params)
    assert status == 200 and "error" not in answer, (status, answer)
    return answer["result"]
