#!/usr/bin/env bash
# Create the reference-relay venvs used by the benchmark harness.
#   bench/.venv-nostr-relay : PyPI nostr-relay (Python relay, SQLite via SQLAlchemy)
#   bench/.venv-localrelay  : PyPI nostr-sdk 0.45.x (Rust LocalRelay via UniFFI bindings)
# Each has its own venv so their pins never touch the project's .venv.
# Idempotent: re-running only (re)installs what is missing.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  # Prefer the interpreter the project venv was built from.
  if [[ -f "$HERE/../.venv/pyvenv.cfg" ]]; then
    PY="$(sed -n 's/^executable = //p' "$HERE/../.venv/pyvenv.cfg")"
  fi
  [[ -x "${PY:-}" ]] || PY="$(command -v python3.11 || command -v python3)"
fi
echo "using $PY ($("$PY" --version))"

mkvenv() {  # dir, pip args...
  local dir="$1"; shift
  if [[ ! -x "$dir/bin/python" ]]; then
    "$PY" -m venv "$dir"
  fi
  "$dir/bin/pip" install -q "$@" 2>&1 | (grep -v "is ignored: it is neither a file nor a directory" || true)
}

# nostr-relay 1.14 (latest on PyPI, 2024-06). uvloop is optional but its CLI uses it when present.
mkvenv "$HERE/.venv-nostr-relay" "nostr-relay==1.14" uvloop
# The LocalRelay server script only needs nostr-sdk; the harness clients run in the project venv.
mkvenv "$HERE/.venv-localrelay" "nostr-sdk>=0.45,<0.46"

"$HERE/.venv-nostr-relay/bin/nostr-relay" --help >/dev/null
"$HERE/.venv-localrelay/bin/python" -c "import nostr_sdk; nostr_sdk.LocalRelayBuilder; print('nostr-sdk', __import__('importlib.metadata').metadata.version('nostr-sdk'))"
"$HERE/.venv-nostr-relay/bin/pip" freeze > "$HERE/.venv-nostr-relay/freeze.txt"
"$HERE/.venv-localrelay/bin/pip" freeze > "$HERE/.venv-localrelay/freeze.txt"
echo "ok: $(grep -i '^nostr.relay' "$HERE/.venv-nostr-relay/freeze.txt"), $(grep -i '^nostr.sdk' "$HERE/.venv-localrelay/freeze.txt")"
