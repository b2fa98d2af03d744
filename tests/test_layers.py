"""Imports point one way (docs/architecture.md, "Layers"): every import of every module under relay/, function-level ones
included, goes to its own layer or a lower one, and no modules or parts import each other in a circle.

A part is a top-level module or package of relay/ (`store`, `server`, `node`, ...).  The failure message names
each offending edge as `module -> imported module (file:line)`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import relay

RELAY = Path(relay.__file__).parent

# Lowest first.  A part may import its own layer or a lower one, except the pairs in APART.
LAYERS: list[set[str]] = [
    {"relay", "protocol", "logging", "runtime", "processes", "failing"},  # "relay": relay/__init__.py
    {"store"},
    {"config", "config_reference"},  # config_reference: docs/configuration.md from the keys' declarations
    {"keys"},
    {"policies"},  # write policies and the strfry plugin protocol, run by ingest
    {"ingest"},
    {"wire"},  # websockets and HTTP on a socket, server and client sides: below everything that speaks on one
    {"server", "sync", "channel"},
    {"assembly", "node", "worker", "supervisor", "metrics", "retention", "hooks", "status", "status_page", "locks",
     "tuning", "signals"},
    {"commands", "cli", "arguments", "__main__"},
]
APART = [{"server", "sync"}, {"server", "channel"}, {"sync", "channel"}]  # same layer, yet neither may import the other


@dataclass(frozen=True)
class Edge:
    """`source` imports `target` (both dotted module names) at `line` of `path`."""

    source: str
    target: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({self.path}:{self.line})"


def module_name(path: Path, root: Path) -> str:
    """relay/server/app.py -> relay.server.app; relay/store/__init__.py -> relay.store."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_sources(root: Path = RELAY) -> dict[str, tuple[str, str]]:
    """Every module under `root`: dotted name -> (path relative to the repository, source text)."""
    return {module_name(p, root): (str(p.relative_to(root.parent)), p.read_text()) for p in sorted(root.rglob("*.py"))}


def import_edges(sources: dict[str, tuple[str, str]]) -> list[Edge]:
    """Every import of one of `sources` by another, wherever it stands (module level, function, TYPE_CHECKING).

    `from X import name` is an edge to X.name when that is a module, else to X;
    relative imports are resolved against the importing module's package.
    """
    edges = []
    for name, (path, text) in sources.items():
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(text, path)):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in sources else base for a in node.names]
            else:
                continue
            edges += [Edge(name, t, path, node.lineno) for t in dict.fromkeys(targets) if t in sources and t != name]
    return edges


def part(module: str) -> str:
    """The part of relay a module belongs to: relay.server.app -> server; relay -> relay."""
    return module.split(".")[1] if "." in module else module


def layer(module: str) -> int:
    """The index of `module`'s part in LAYERS (KeyError for a part that LAYERS does not place)."""
    return next(i for i, parts in enumerate(LAYERS) if part(module) in parts)


def back_edges(edges: list[Edge]) -> list[Edge]:
    """Edges to a higher layer, or between parts kept APART."""
    return [e for e in edges if layer(e.target) > layer(e.source) or {part(e.source), part(e.target)} in APART]


def cycle(edges: list[Edge]) -> list[Edge]:
    """One circle of edges (each edge's target is the next one's source), or [] when there is none."""
    out: dict[str, list[Edge]] = {}
    for e in edges:
        out.setdefault(e.source, []).append(e)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[Edge] = []

    def visit(node: str) -> list[Edge]:
        state[node] = 1
        for e in out.get(node, ()):
            if state.get(e.target) == 1:
                start = next((i for i, p in enumerate(path) if p.source == e.target), len(path))
                return path[start:] + [e]
            if e.target not in state:
                path.append(e)
                if found := visit(e.target):
                    return found
                path.pop()
        state[node] = 2
        return []

    for node in list(out):
        if node not in state and (found := visit(node)):
            return found
    return []


def part_edges(edges: list[Edge]) -> list[Edge]:
    """The edges between different parts, with each end named by its part (for part-level circles)."""
    return [Edge(part(e.source), part(e.target), e.path, e.line) for e in edges if part(e.source) != part(e.target)]


def problems(sources: dict[str, tuple[str, str]]) -> list[str]:
    """What breaks the layering of `sources`, one line per edge; [] when imports point one way."""
    edges = import_edges(sources)
    unplaced = sorted({part(m) for m in sources} - set().union(*LAYERS))
    if unplaced:
        return [f"not in LAYERS (place it in tests/test_layers.py): {', '.join(unplaced)}"]
    found = [f"back-edge: {e}" for e in back_edges(edges)]
    found += [f"module circle: {e}" for e in cycle(edges)]
    found += [f"part circle: {e}" for e in cycle(part_edges(edges))]
    return found


def test_imports_point_one_way():
    """No module under relay/ imports a higher layer, and no modules or parts import each other in a circle."""
    found = problems(read_sources())
    assert not found, "imports against the layers (module -> imported module):\n" + "\n".join(found)


def _with(sources: dict[str, tuple[str, str]], module: str, code: str) -> dict[str, tuple[str, str]]:
    path, text = sources[module]
    return {**sources, module: (path, text + "\n" + code + "\n")}


def test_a_back_edge_inside_a_function_is_named_with_its_line():
    """A function-level import of the server by the store fails, naming the edge and its line."""
    sources = read_sources()
    code = "def late():\n    from relay.server.app import RelayServer"
    found = problems(_with(sources, "relay.store.db", code))
    line = len(sources["relay.store.db"][1].splitlines()) + 3
    assert f"back-edge: relay.store.db -> relay.server.app (relay/store/db.py:{line})" in found


def test_server_and_sync_may_not_import_each_other():
    """server and sync share a layer but stay apart (a relative import is resolved too)."""
    found = problems(_with(read_sources(), "relay.sync.peer", "from ..server import nip11"))
    assert any(f.startswith("back-edge: relay.sync.peer -> relay.server.nip11 ") for f in found), found


def test_a_circle_within_a_layer_is_found():
    """Two modules of one part that import each other fail as a circle."""
    sources = _with(read_sources(), "relay.protocol.rejection", "import relay.protocol.filters")
    found = problems(sources)
    assert any(f.startswith("module circle: ") for f in found), found
