"""The status page (`[http] status_page`, relay/status_page.py): `GET /` from a browser, parsed as HTML."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import urllib.error
from html.parser import HTMLParser

from relay.store import refused
from relay.store.db import connect_readonly
from tests.conftest import make_config
from tests.helpers import Client, Keys, eventually
from tests.inprocess import Relay, running
from tests.policies.sample import serving
from tests.served import Served, clean_env, free_port, http_get
from tests.server.nip86 import admin_config, result

BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
SECRET = "the secret of a direct message"


class Page(HTMLParser):
    """The parts of the page a test reads: title, h1, tags seen, each section's table rows (cell texts), its
    headers and the classes of its headers and cells, the sections whose table is in a `div.scroll`, the URL."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.title = self.h1 = self.url = self.caption = ""
        self.tags: list[tuple[str, dict]] = []
        self.sections: dict[str, list[list[str]]] = {}
        self.heads: dict[str, list[str]] = {}
        self.head_classes: dict[str, list[str]] = {}
        self.cell_classes: dict[str, list[list[str]]] = {}
        self.captions: dict[str, str] = {}
        self.scrolled: set[str] = set()
        self.text: list[str] = []
        self._in: list[str] = []
        self._scroll = self._url = False
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
            self.heads[self._section], self.head_classes[self._section] = [], []
            self.cell_classes[self._section] = []
            self.captions[self._section] = ""
        elif tag == "div":
            self._scroll = attrs.get("class") == "scroll"
        elif tag == "table" and self._scroll:
            self.scrolled.add(self._section)
        elif tag == "th":
            self.heads[self._section].append("")
            self.head_classes[self._section].append(attrs.get("class", ""))
        elif tag == "tr" and "tbody" in self._in:
            self.sections[self._section].append([])
            self.cell_classes[self._section].append([])
        elif tag == "td":
            self.sections[self._section][-1].append("")
            self.cell_classes[self._section][-1].append(attrs.get("class", ""))
        if attrs.get("id") == "url":
            self._url = True

    def handle_endtag(self, tag):
        self._url = False  # the URL is one element's text
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
        elif self._in and self._in[-1] == "th":
            self.heads[self._section][-1] += data
        elif self._in and self._in[-1] == "caption":
            self.captions[self._section] += data
        if self._url:
            self.url += data


async def _page(relay, path: str = "/", **headers: str) -> tuple[int, str, Page]:
    status, answer, body = await asyncio.to_thread(http_get, relay.port, path, {**BROWSER, **headers}, 5.0)
    return status, answer["Content-Type"], Page(body.decode())


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
        port = relay.port
    finally:
        await relay.stop()
    assert status == 200 and content_type == "text/html; charset=utf-8"
    assert page.title == page.h1 == "Test <relay>"
    text = " ".join(page.text)
    assert "for people & tests" in text and "NIPs 1, 9, 11, 40, 42, 45, 50, 62, 70, 77" in text and "up " in text
    assert {"1 (note)": "2", "0 (metadata)": "2", "4 (encrypted DM)": "1"} == {
        row[0]: row[1] for row in page.sections["events"]}
    assert [row[:2] for row in page.sections["peers"]] == [["peer 1", "down"]]
    projectors = {row[0]: row for row in page.sections["projectors"]}
    assert projectors["profiles"][1:] == ["0 (metadata)", "current", "1", "1"]
    assert set(projectors) >= {"follows", "articles"}
    [refusal] = page.sections["refusals"]
    assert refusal[1:] == ["0 (metadata)", "projector profiles", bad_profile["id"], "content is not valid JSON"]
    assert not [tag for tag, attrs in page.tags if tag == "script" or "src" in attrs or "href" in attrs]
    # the one IP address is the page's own, in the URL the browser asked for
    assert SECRET not in text and str(tmp_path) not in text and text.count("127.0.0.1") == 1
    assert page.url == f"ws://127.0.0.1:{port}/"


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


async def test_numbers_and_their_headers_are_right_aligned_and_rows_fill_every_column(tmp_path):
    """In every table each row has as many cells as there are headers, and a column of numbers (the peers'
    counts, events, rows) is right-aligned in its header as in its cells; the other columns are not."""
    config = make_config(tmp_path, sync={"peers": [{"url": f"ws://127.0.0.1:{free_port()}", "direction": "up"}]})
    async with running(config) as relay:
        client = await Client.connect(relay.url)
        assert (await client.publish(Keys(0xA11CE).sign(content="one")))[2] is True
        await client.close()
        _, _, page = await _page(relay)
    numbers = {"events": {"events"}, "peers": {"events in", "events out", "refused"},
               "projectors": {"rows", "refusals"}}
    for section, heads in page.heads.items():
        right = [h in numbers.get(section, ()) for h in heads]
        assert [c == "n" for c in page.head_classes[section]] == right, section
        for row, classes in zip(page.sections[section], page.cell_classes[section]):
            if row != ["none"]:
                assert len(row) == len(heads) and [c == "n" for c in classes] == right, section
    assert page.heads["peers"][3:6] == ["events in", "events out", "refused"]
    assert page.sections["peers"][0][3:6] == ["0", "0", "0"]


async def test_the_page_fits_a_phone(relay):
    """The viewport meta, and each table in a box of its own that scrolls sideways (.scroll: overflow-x), so a
    wide table does not widen the page on a 390 px screen (bench/status_page_screenshots.py shows it)."""
    _, _, page = await _page(relay)
    assert ("meta", {"name": "viewport", "content": "width=device-width, initial-scale=1"}) in page.tags
    assert page.scrolled == set(page.sections) == {"events", "peers", "projectors", "refusals"}
    style = next(text for text in page.text if ".scroll" in text)
    assert ".scroll { overflow-x: auto; }" in style


async def test_the_websocket_url_is_the_public_one_or_the_one_the_browser_asked_for(tmp_path):
    """`[server] public_url` when set; else the request's Host and path, wss:// behind a TLS proxy
    (X-Forwarded-Proto: https), ws:// otherwise."""
    config = make_config(tmp_path, server={"paths": ["/", "/nostr"]})
    async with running(config) as relay:
        _, _, plain = await _page(relay, "/nostr", Host="relay.example.com")
        _, _, proxied = await _page(relay, "/", Host="relay.example.com", **{"X-Forwarded-Proto": "https"})
    assert (plain.url, proxied.url) == ("ws://relay.example.com/nostr", "wss://relay.example.com/")
    (tmp_path / "public").mkdir()
    async with running(make_config(tmp_path / "public", server={"public_url": "wss://relay.example.org/"})) as relay:
        _, _, page = await _page(relay, Host="other.example.com")
    assert page.url == "wss://relay.example.org/"


async def test_counts_and_nouns_agree(tmp_path):
    """"1 peer", "1 event", "1 projected table": singular for one, plural otherwise."""
    config = make_config(tmp_path, sync={"peers": [{"url": "wss://relay.example.com", "direction": "down"}]})
    config = dataclasses.replace(config, projectors=tuple(p for p in config.projectors if p.name == "profiles"))
    async with running(config) as relay:
        client = await Client.connect(relay.url)
        assert (await client.publish(Keys(0xA11CE).sign(content="one")))[2] is True
        await client.close()
        _, _, page = await _page(relay)
    assert page.captions["peers"] == "1 peer (NIP-77)"
    assert page.captions["events"].startswith("1 event; database ")
    assert page.captions["projectors"] == "1 projected table"


async def _logged_refusals(path, count: int) -> None:
    """Wait until the policy refusal log holds `count` rows (the writer records them after the OK)."""
    def rows() -> int:
        conn = connect_readonly(path)
        try:
            return len(refused.recent(conn, 100))
        finally:
            conn.close()
    assert await eventually(lambda: rows() >= count), f"fewer than {count} refusals logged"


async def test_recent_refusals_list_a_write_policys_refusals_beside_the_projectors(tmp_path):
    """A client's event refused by a `[[policies]]` entry is listed (kind, policy and source, id, the OK message)
    with the projector's refusal; a shadow-reject (OK true to the client) and a policy's failure are not."""
    alice = Keys(0xA11CE)
    refused_note, shadowed, failed = (alice.sign(content=c) for c in ("reject", "shadow", "raise"))
    bad_profile = alice.sign(kind=0, content="{not json")
    async with serving(tmp_path, '[[policies]]\nname = "by_content"\ncall = "tests.policies.sample:by_content"') \
            as relay:
        client = await Client.connect(relay.url)
        for event in (bad_profile, refused_note, shadowed, failed):
            await client.publish(event)
        await client.close()
        await _logged_refusals(tmp_path / "relay.db", 1)
        _, _, page = await _page(relay)
    rows = page.sections["refusals"]
    assert sorted(row[1:] for row in rows) == [
        ["0 (metadata)", "projector profiles", bad_profile["id"], "content is not valid JSON"],
        ["1 (note)", "policy by_content (client)", refused_note["id"], "blocked: no thanks"]]


def test_a_refusal_in_the_writer_process_shows_on_a_workers_page(tmp_path):
    """With worker processes the policies run in the writer process and the page is served by a worker: the
    refusal reaches it through the database."""
    spammer = Keys(0x5BA3)
    (tmp_path / "denied.txt").write_text(spammer.pubkey + "\n")
    (tmp_path / "relay.toml").write_text(f"""
[server]
port = 0
workers = 2
[store]
path = "{tmp_path / 'relay.db'}"
[[policies]]
name = "denylist"
call = "relay.policies.builtin:pubkey_list"
options = {{ deny_file = "{tmp_path / 'denied.txt'}" }}
""")
    note = spammer.sign(content="buy now")
    with Served(tmp_path, "--config", tmp_path / "relay.toml", env=clean_env(RELAY_SERVER__WORKERS="2")) as served:
        port = int(served.started_url().rsplit(":", 1)[1])
        served.wait_health(port)

        async def publish_and_read() -> Page:
            client = await Client.connect(f"ws://127.0.0.1:{port}")
            assert (await client.publish(note))[2:] == [False, "blocked: this pubkey may not publish here"]
            await client.close()
            await _logged_refusals(tmp_path / "relay.db", 1)
            status, _, body = await asyncio.to_thread(http_get, port, "/", BROWSER, 5.0)
            return Page(body.decode())

        page = asyncio.run(publish_and_read())
    assert [row[1:] for row in page.sections["refusals"]] == [
        ["1 (note)", "policy denylist (client)", note["id"], "blocked: this pubkey may not publish here"]]
