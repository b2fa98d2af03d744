"""The status page (`[http] status_page`, relay/status_page.py): `GET /` from a browser, parsed as HTML."""

from __future__ import annotations

import asyncio
import json
import urllib.error
from html.parser import HTMLParser

from tests.conftest import make_config
from tests.helpers import Client, Keys
from tests.inprocess import Relay
from tests.served import free_port, http_get
from tests.server.nip86 import admin_config, result

BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
SECRET = "the secret of a direct message"


class Page(HTMLParser):
    """The parts of the page a test reads: title, h1, tags seen, each section's table rows (cell texts)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.title = self.h1 = ""
        self.tags: list[tuple[str, dict]] = []
        self.sections: dict[str, list[list[str]]] = {}
        self.text: list[str] = []
        self._in: list[str] = []
        self._section = ""
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        self._in.append(tag)
        if tag == "section":
            self._section = attrs["id"]
            self.sections[self._section] = []
        elif tag == "tr" and "tbody" in self._in:
            self.sections[self._section].append([])
        elif tag == "td":
            self.sections[self._section][-1].append("")

    def handle_endtag(self, tag):
        while self._in and self._in.pop() != tag:
            pass

    def handle_data(self, data):
        self.text.append(data)
        if self._in and self._in[-1] == "title":
            self.title += data
        elif self._in and self._in[-1] == "h1":
            self.h1 += data
        elif self._in and self._in[-1] == "td":
            self.sections[self._section][-1][-1] += data


async def _page(relay) -> tuple[int, str, Page]:
    status, headers, body = await asyncio.to_thread(http_get, relay.port, "/", BROWSER, 5.0)
    return status, headers["Content-Type"], Page(body.decode())


async def test_a_browser_gets_a_page_of_the_relay_without_anything_private(tmp_path):
    """Name, description, NIPs and uptime; events by kind, database size; the peer (an IP: shown by number),
    projectors with rows and state, the newest refusal; no script, no external asset, no database path, no
    private kind's content, no IP address."""
    alice, bob = Keys(0xA11CE), Keys(0xB0B)
    config = make_config(tmp_path, info={"name": "Test <relay>", "description": "for people & tests"},
                         sync={"peers": [{"url": f"ws://127.0.0.1:{free_port()}", "direction": "down"}]})
    relay = Relay(config)
    await relay.start()
    try:
        client = await Client.connect(relay.url)
        bad_profile = alice.sign(kind=0, content="{not json")
        for event in (alice.sign(content="one"), bob.sign(content="two"), bad_profile,
                      bob.sign(kind=0, content=json.dumps({"name": "bob"})),
                      alice.sign(kind=4, content=SECRET, tags=[["p", bob.pubkey]])):
            assert (await client.publish(event))[2] is True
        await client.close()
        status, content_type, page = await _page(relay)
    finally:
        await relay.stop()
    assert status == 200 and content_type == "text/html; charset=utf-8"
    assert page.title == page.h1 == "Test <relay>"
    text = " ".join(page.text)
    assert "for people & tests" in text and "NIPs 1, 9, 11, 40, 42, 45, 50, 62, 70, 77" in text and "up " in text
    assert {"kind 1": "2", "kind 0": "2", "kind 4": "1"} == {row[0]: row[1] for row in page.sections["events"]}
    assert [row[:2] for row in page.sections["peers"]] == [["peer 1", "down"]]
    projectors = {row[0]: row for row in page.sections["projectors"]}
    assert projectors["profiles"][2:] == ["current", "1", "1"] and set(projectors) >= {"follows", "articles"}
    [refusal] = page.sections["refusals"]
    assert refusal[1:] == ["profiles", bad_profile["id"], "content is not valid JSON"]
    assert not [tag for tag, attrs in page.tags if tag == "script" or "src" in attrs or "href" in attrs]
    assert SECRET not in text and str(tmp_path) not in text and "127.0.0.1" not in text


async def test_clients_still_get_nip11_and_the_page_can_be_turned_off(tmp_path):
    """Accept naming both NIP-11 and HTML gets NIP-11 (clients first); `status_page = false`: a browser gets
    the relay's 426 as before."""
    relay = Relay(make_config(tmp_path, http={"status_page": False}))
    await relay.start()
    try:
        try:
            await asyncio.to_thread(http_get, relay.port, "/", BROWSER, 5.0)
            raise AssertionError("a page was served")
        except urllib.error.HTTPError as exc:
            assert exc.code == 426
    finally:
        await relay.stop()
    (tmp_path / "on").mkdir()
    relay = Relay(make_config(tmp_path / "on"))
    await relay.start()
    try:
        status, headers, body = await asyncio.to_thread(
            http_get, relay.port, "/", {"Accept": "application/nostr+json, text/html"}, 5.0)
        assert status == 200 and headers["Content-Type"] == "application/nostr+json" and json.loads(body)["name"]
    finally:
        await relay.stop()


async def test_the_page_shows_nip86s_name_description_and_icon_at_once(tmp_path):
    """changerelayname, changerelaydescription and changerelayicon show on the page as in NIP-11, on the next
    request although the page was just built (it kept [info]'s for good); set back to "", [info]'s again."""
    relay = Relay(make_config(tmp_path, info={"name": "Configured", "description": "from the file"},
                              **admin_config()))
    await relay.start()
    try:
        _, _, before = await _page(relay)
        assert before.h1 == "Configured" and not [attrs for tag, attrs in before.tags if tag == "img"]
        for method, value in (("changerelayname", "Renamed <b>"), ("changerelaydescription", "new words"),
                              ("changerelayicon", "https://relay.example/icon.png?a=1&b=2")):
            assert await result(relay.port, method, value) is True
        _, _, page = await _page(relay)
        assert page.title == page.h1 == "Renamed <b>" and "new words" in page.text
        assert [attrs["src"] for tag, attrs in page.tags if tag == "img"] == ["https://relay.example/icon.png?a=1&b=2"]
        for method in ("changerelayname", "changerelaydescription", "changerelayicon"):
            await result(relay.port, method, "")
        _, _, page = await _page(relay)
        assert page.h1 == "Configured" and "from the file" in page.text
        assert not [attrs for tag, attrs in page.tags if tag == "img"]
    finally:
        await relay.stop()


async def test_accept_weights_choose_between_nip11_and_the_page(relay):
    """q-values count: `text/html;q=0` is no request for the page (426, it got HTML), and NIP-11 at q=0.1 loses
    to text/html (it won)."""
    try:
        await asyncio.to_thread(http_get, relay.port, "/", {"Accept": "text/html;q=0"}, 5.0)
        raise AssertionError("an answer was served")
    except urllib.error.HTTPError as exc:
        assert exc.code == 426
    _, headers, _ = await asyncio.to_thread(
        http_get, relay.port, "/", {"Accept": "application/nostr+json;q=0.1, text/html"}, 5.0)
    assert headers["Content-Type"] == "text/html; charset=utf-8"
