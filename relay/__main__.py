"""`relay` (the console script) and `python -m relay`: the command line of relay/cli.py.

`relay serve` blocks SIGINT and SIGTERM first, before the imports (a few hundred milliseconds): a stop asked
while it starts waits until its event loop takes the signals (relay/signals.py `stop_on_signals`) and stops
it cleanly, where Python's own SIGINT handler would raise KeyboardInterrupt wherever start-up was.
"""

import signal
import sys


def main() -> int:
    """Run the command line; returns the exit code."""
    if sys.argv[1:2] == ["serve"]:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        from relay.cli import main as run_command_line

        return run_command_line()
    except KeyboardInterrupt:  # a second Ctrl-C, or one before the command could take it: stop now, quietly
        print("relay: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
