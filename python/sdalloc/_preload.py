"""sdalloc._preload: the malloc drop-in (libsdalloc_preload.so) seen from Python.

When the process runs with LD_PRELOAD=libsdalloc_preload.so, its functions
(include/sdalloc/preload.h) are in the global symbol table: ctypes.CDLL(None) finds them, and
nothing else is loaded. sdalloc.step() marks one step for mode:planned (the first mark
switches the drop-in's automatic step detection off); sdalloc.preloaded() says whether the
drop-in is there and on; sdalloc.preload_path() says which file to preload.
"""

import contextlib
import ctypes

from . import _native

_lib = None


def _functions():
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(None)
        try:
            lib.sdalloc_preload_owns.argtypes = [ctypes.c_void_p]
            lib.sdalloc_preload_threshold.restype = ctypes.c_size_t
            lib.sdalloc_preload_begin_step.restype = ctypes.c_int
            lib.sdalloc_preload_end_step.restype = ctypes.c_int
        except AttributeError:
            lib = False  # not preloaded
        _lib = lib
    return _lib or None


def preload_path():
    """The path of libsdalloc_preload.so, for LD_PRELOAD: the one installed with this package
    (found as the other libraries are, sdalloc._native). Raises sdalloc.LibraryNotFound,
    saying where it looked, when there is none. From a shell:
    LD_PRELOAD=$(python3 -c 'import sdalloc; print(sdalloc.preload_path())') python3 app.py"""
    return _native.find(_native.PRELOAD_LIBRARY)


def preloaded():
    """True when libsdalloc_preload.so is preloaded and serving (a bad SDALLOC_CONF turns it off)."""
    lib = _functions()
    return lib is not None and lib.sdalloc_preload_threshold() > 0


def owns(address):
    """True when the address (e.g. tensor.data_ptr()) lies in the drop-in's pool."""
    lib = _functions()
    return lib is not None and lib.sdalloc_preload_owns(address) == 1


@contextlib.contextmanager
def step():
    """`with sdalloc.step():` marks one step of a repeated loop for the preloaded drop-in in
    mode:planned: the first is recorded, later ones come from the planned arena. Raises
    RuntimeError when the drop-in is not preloaded, not in mode:planned, or a step is open."""
    lib = _functions()
    if lib is None:
        raise RuntimeError("sdalloc.step(): libsdalloc_preload.so is not preloaded (LD_PRELOAD)")
    if lib.sdalloc_preload_begin_step() != 0:
        raise RuntimeError("sdalloc.step(): the drop-in refused to begin a step (it needs "
                           "SDALLOC_CONF=mode:planned, and no step may be open)")
    try:
        yield
    finally:
        lib.sdalloc_preload_end_step()
