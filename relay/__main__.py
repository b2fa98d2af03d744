"""`python -m relay`: the same command line as the `relay` console script."""

from relay.cli import main

raise SystemExit(main())
