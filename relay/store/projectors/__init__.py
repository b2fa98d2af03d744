"""Projectors: SQL tables computed from events, kept in the write transaction (see engine.py).

Public names: `ProjectorSpec`, `FieldSpec`, `SpecError` (spec.py), `CausalSpec`,
`Operation` (causal.py), `ProjectorHook`, `rebuild`, `force_rebuild` (engine.py),
`verify` (verify.py), `BUILTIN_PROJECTORS` (builtin.py).
"""

from relay.store.projectors.builtin import BUILTIN_PROJECTORS, builtin_projectors
from relay.store.projectors.causal import CausalSpec, Operation
from relay.store.projectors.engine import ProjectorHook, force_rebuild, rebuild
from relay.store.projectors.rows import Refusal, RowMaker
from relay.store.projectors.spec import FieldSpec, ProjectorSpec, SpecError, parse_specs
from relay.store.projectors.verify import TableCheck, verify

__all__ = ["BUILTIN_PROJECTORS", "CausalSpec", "FieldSpec", "Operation", "ProjectorHook", "ProjectorSpec",
           "Refusal", "RowMaker", "SpecError", "TableCheck", "builtin_projectors", "force_rebuild", "parse_specs",
           "rebuild", "verify"]
