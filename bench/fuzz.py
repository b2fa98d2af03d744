"""Long fuzz runs of the parser fuzz tests (tests/hostile/test_fuzz_*.py), outside CI.

    .venv/bin/python bench/fuzz.py                      # 100,000 examples per fuzz test
    .venv/bin/python bench/fuzz.py --examples 5000 -k negentropy

Sets FUZZ_EXAMPLES (read by tests/hostile/fuzzing.py) and runs pytest on the
fuzz tests only; a failure prints hypothesis' shrunk input, which then belongs
in the test as an `@example`.  Exit code: pytest's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from common import REPO


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=100_000, help="examples per fuzz test (default 100,000)")
    parser.add_argument("-k", default="", help="pytest -k expression to pick fuzz tests (e.g. config, negentropy)")
    args = parser.parse_args()
    selection = "fuzz" + (f" and ({args.k})" if args.k else "")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-k", selection,
               "tests/hostile/"]
    return subprocess.call(command, cwd=REPO, env={**os.environ, "FUZZ_EXAMPLES": str(args.examples)})


if __name__ == "__main__":
    sys.exit(main())
