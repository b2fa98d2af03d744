"""`relay.cli.main(argv)` run in this process, its output captured: faster than a subprocess per command line."""

from __future__ import annotations

import io
import os
from contextlib import redirect_stderr, redirect_stdout


class _Kept(io.BytesIO):
    """A byte buffer that outlives close(): `relay export` closes stdout when done."""

    def close(self) -> None:
        pass


def run_main(argv: list) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `relay ARGV` in this process, with no RELAY_* variable set; a usage error's
    SystemExit is its exit code.  Output that is not UTF-8 is shown with backslash escapes, as Python's own
    stderr does."""
    from relay.cli import main

    out, err = _Kept(), _Kept()
    stdout = io.TextIOWrapper(out, encoding="utf-8", errors="backslashreplace", write_through=True)
    stderr = io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace", write_through=True)
    saved = {name: os.environ.pop(name) for name in [n for n in os.environ if n.startswith("RELAY_")]}
    try:
        with redirect_stdout(stdout), redirect_stderr(stderr):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as exc:  # argparse: --help (0) and usage errors (2)
                code = exc.code
    finally:
        os.environ.update(saved)
    return code, out.getvalue().decode(errors="backslashreplace"), err.getvalue().decode(errors="backslashreplace")
