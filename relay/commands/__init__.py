"""The bodies of the `relay` subcommands (relay/cli.py parses the arguments and dispatches here).

Each module is one command or a family of them, returns the exit code and
prints what the person who ran it reads: `transfer` (import, export),
`sync`, `status`, `key`, `backup`, `projectors` (verify, projectors,
query).  `relay serve` is the node's own `run` (relay/node.py).
"""
