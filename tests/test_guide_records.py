"""docs/projectors.md "Records": the Python example, copied as it is (only its `<64-hex>` placeholders filled),
runs on a real node and its delete removes the article it wrote."""

from __future__ import annotations

import textwrap
from pathlib import Path

GUIDE = Path(__file__).parents[1] / "docs" / "projectors.md"


def _python_after(guide: str, heading: str) -> str:
    return guide.split(heading, 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


async def test_the_guide_records_example_works_as_written(tmp_path, monkeypatch):
    """Reading then writing, as the guide shows them: every put and the delete are accepted, the article is gone."""
    guide = GUIDE.read_text()
    code = _python_after(guide, "**Python** (in the relay's process") + _python_after(guide, "Writing, in the same process:")
    for n in range(code.count("<64-hex>")):  # each placeholder its own pubkey (a follow list lists each once)
        code = code.replace("<64-hex>", f"{n + 1:064x}", 1)
    monkeypatch.chdir(tmp_path)  # the example's relative paths: config/relay.toml, data/relay.db, app.key
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "relay.toml").write_text("[server]\nport = 0\nworkers = 0\n")
    namespace: dict = {}
    exec(f"async def example():\n{textwrap.indent(code, '    ')}\n    return node, app\n", namespace)
    node, app = await namespace["example"]()
    try:
        assert await node.records.get_record("articles", {"pubkey": app.pubkey, "d": "hello"}) is None
        assert await node.records.get_record("profiles", {"pubkey": node.records.node_key.pubkey}) is not None
    finally:
        await node.stop()
