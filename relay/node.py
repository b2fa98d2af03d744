"""The Python API's name for a relay process (docs/projectors.md): `Node` and `open_store`, built in
relay/assembly.py."""

from relay.assembly import Node, open_store

__all__ = ["Node", "open_store"]
