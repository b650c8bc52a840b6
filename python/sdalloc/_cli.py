"""The `sdalloc` command of the Python package: runs the compiled `sdalloc` program installed
with it (replay, plan, run), with the same arguments, in place of this process.

The console script `sdalloc` and `python -m sdalloc` both come here. The program's default
drop-in for `sdalloc run` is the path its build made, which a wheel installed elsewhere does
not have: unless SDALLOC_PRELOAD_LIBRARY is set, it is pointed at the package's own
libsdalloc_preload.so.
"""

import os
import sys

from . import _native


def main(argv=None):
    """Replaces this process with the `sdalloc` program; returns 1 with a message on stderr
    when the program is not installed."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        program = _native.find_program()
    except _native.ProgramNotFound as error:
        print(error, file=sys.stderr)
        return 1
    env = dict(os.environ)
    if not env.get("SDALLOC_PRELOAD_LIBRARY"):
        try:
            env["SDALLOC_PRELOAD_LIBRARY"] = _native.find(_native.PRELOAD_LIBRARY)
        except _native.LibraryNotFound:
            pass  # `sdalloc run` says what is missing when a mode needs it
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(program, [_native.PROGRAM] + args, env)
    return 1  # not reached: execve replaces the process or raises OSError
