"""`python -m sdalloc ARGS` runs the `sdalloc` program (replay, plan, run): sdalloc._cli."""

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
