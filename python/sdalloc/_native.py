"""Finding and binding sdalloc's shared libraries (ctypes, no compiled extension).

Two libraries carry the C API of include/sdalloc/sdalloc.h:
  libsdalloc.so        the host library: pools over host memory;
  libsdalloc_torch.so  the PyTorch shim (include/sdalloc/torch_shim.h), self-contained: it
                       carries its own copy of the C API, bound to its own per-device pools.
Two more files are found the same way, never loaded here: libsdalloc_preload.so (the malloc
drop-in, for LD_PRELOAD: sdalloc.preload_path()) and the `sdalloc` program (sdalloc._cli).
A pool handle must be used with the functions of the library that made it, so every Pool
object keeps its Library.

Where the libraries are looked for, in order:
  1. SDALLOC_LIBRARY_DIR: directories separated by os.pathsep (a build tree's src/ works:
     the shim is then looked for in its torch_shim/ subdirectory). When it is set, nothing
     else is searched, so a test or a user gets exactly the build they named.
  2. Next to this package (the wheel's layout: the program in its bin/) and, for an installed
     tree (<prefix>/lib/sdalloc/python/sdalloc), <prefix>/lib (the program in <prefix>/bin).
  3. The source tree's build directories (<repo>/build*/.../src), newest first.
"""

import ctypes
import glob
import os
from ctypes import (POINTER, Structure, c_bool, c_char_p, c_double, c_int, c_int64, c_size_t,
                    c_uint64, c_void_p)

HOST_LIBRARY = "libsdalloc.so"
TORCH_LIBRARY = "libsdalloc_torch.so"
PRELOAD_LIBRARY = "libsdalloc_preload.so"
PROGRAM = "sdalloc"

SUCCESS = 0
STATUS_NAMES = {0: "SUCCESS", 1: "OUT_OF_MEMORY", 2: "INVALID_ARGUMENT", 3: "INVALID_POINTER",
                4: "INTERNAL"}


class SdallocError(RuntimeError):
    """A C API call failed; `status` is the sdalloc_status_t name, the message sdalloc's."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = STATUS_NAMES.get(status, str(status))


class LibraryNotFound(ImportError):
    """sdalloc's shared library is not where the package looked (the message lists where)."""


class ProgramNotFound(FileNotFoundError):
    """The `sdalloc` program is not where the package looked (the message lists where)."""


# --------------------------------------------------------------------------- structs

class PoolConfig(Structure):
    _fields_ = [("struct_size", c_size_t), ("resource", c_int), ("capacity", c_size_t),
                ("initial_reservation", c_size_t), ("segment_granularity", c_size_t),
                ("min_segment_size", c_size_t), ("huge_threshold", c_size_t),
                ("release_cached_before_growth", c_bool), ("consolidate_when_empty", c_bool),
                # The header's order: `planned` follows, past the first version's padding.
                ("replan_after_divergent_steps", c_size_t), ("planned", c_bool),
                ("max_plans", c_size_t), ("planner_max_search_nodes", c_size_t),
                ("small_pool_limit", c_size_t), ("small_granularity", c_size_t),
                ("keep_spare_pages", c_bool), ("grow_arena", c_bool),
                ("cut_free_ends", c_bool), ("mode", c_int)]

# sdalloc_pool_mode_t, by the name SDALLOC_CONF spells (docs/pools.md).
POOL_MODES = {"auto": 0, "pool": 1, "vmm": 2, "planned": 3, "async": 4}
# Fields kept in the struct for old callers, ignored by the library since 0.2.
RETIRED_POOL_FIELDS = ("small_pool_limit", "small_granularity", "keep_spare_pages",
                       "grow_arena", "cut_free_ends")


class Stats(Structure):
    _fields_ = [("struct_size", c_size_t)] + [
        (name, c_size_t) for name in (
            "live_bytes", "peak_live_bytes", "allocated_bytes", "peak_allocated_bytes",
            "reserved_bytes", "peak_reserved_bytes", "live_allocations",
            "peak_live_allocations")] + [
        ("allocations", c_uint64), ("frees", c_uint64), ("segments", c_size_t),
        ("peak_segments", c_size_t), ("segment_allocations", c_uint64),
        ("segment_releases", c_uint64), ("free_bytes", c_size_t),
        ("largest_free_block", c_size_t), ("pending_free_bytes", c_size_t),
        ("oom_retries", c_uint64), ("ooms", c_uint64), ("consolidations", c_uint64),
        ("streams", c_size_t), ("fragmentation", c_double), ("peak_overhead_ratio", c_double),
        ("segment_splits", c_uint64), ("arena_growths", c_uint64), ("stitches", c_uint64),
        ("spare_bytes", c_size_t)]


class StepStats(Structure):
    """sdalloc_step_stats_t: what a planned pool has done with its steps."""
    _fields_ = [("struct_size", c_size_t), ("has_plan", c_bool), ("in_step", c_bool),
                ("arena_bytes", c_size_t), ("planned_events", c_size_t)] + [
        (name, c_uint64) for name in (
            "planned_allocations", "kept_allocations", "fallback_allocations",
            "recorded_allocations", "recorded_steps", "planned_steps", "divergent_steps",
            "replans", "arena_failures")] + [("plans", c_size_t)]


class SegmentInfo(Structure):
    _fields_ = [("struct_size", c_size_t), ("address", c_size_t), ("size", c_size_t),
                ("stream", c_void_p), ("block_count", c_size_t), ("huge", c_bool),
                ("pinned", c_bool)]


class BlockInfo(Structure):
    _fields_ = [("struct_size", c_size_t), ("address", c_size_t), ("size", c_size_t),
                ("requested", c_size_t), ("state", c_int)]


# --------------------------------------------------------------------------- binding

_C_API = {
    "sdalloc_last_error": (c_char_p, []),
    "sdalloc_version": (c_char_p, []),
    "sdalloc_pool_config_init_sized": (None, [POINTER(PoolConfig), c_size_t]),
    "sdalloc_pool_create": (c_int, [POINTER(PoolConfig), POINTER(c_void_p)]),
    "sdalloc_pool_destroy": (None, [c_void_p]),
    "sdalloc_malloc": (c_int, [c_void_p, c_size_t, c_void_p, POINTER(c_void_p)]),
    "sdalloc_malloc_aligned": (c_int, [c_void_p, c_size_t, c_size_t, c_void_p,
                                       POINTER(c_void_p)]),
    "sdalloc_free": (c_int, [c_void_p, c_void_p, c_void_p]),
    "sdalloc_allocation_size": (c_int, [c_void_p, c_void_p, POINTER(c_size_t)]),
    "sdalloc_trim": (c_int, [c_void_p, POINTER(c_size_t)]),
    "sdalloc_pool_begin_step": (c_int, [c_void_p, c_void_p]),
    "sdalloc_pool_end_step": (c_int, [c_void_p]),
    "sdalloc_pool_step_stats": (c_int, [c_void_p, POINTER(StepStats)]),
    "sdalloc_pool_stats": (c_int, [c_void_p, POINTER(Stats)]),
    "sdalloc_pool_reset_peak": (c_int, [c_void_p]),
    "sdalloc_pool_mode": (c_int, [c_void_p, POINTER(c_int)]),
    "sdalloc_memory_stat": (c_int, [c_void_p, c_char_p, POINTER(c_int64)]),
    "sdalloc_memory_stat_key": (c_char_p, [c_size_t]),
    "sdalloc_pool_layout": (c_int, [c_void_p, POINTER(c_void_p)]),
    "sdalloc_layout_segment_count": (c_size_t, [c_void_p]),
    "sdalloc_layout_segment": (c_int, [c_void_p, c_size_t, POINTER(SegmentInfo)]),
    "sdalloc_layout_block": (c_int, [c_void_p, c_size_t, c_size_t, POINTER(BlockInfo)]),
    "sdalloc_layout_destroy": (None, [c_void_p]),
    "sdalloc_pool_trace_start": (c_int, [c_void_p, c_char_p]),
    "sdalloc_pool_trace_stop": (c_int, [c_void_p, POINTER(c_uint64)]),
}

_SHIM_API = {
    # The exact signatures PyTorch calls: (size_t, int, cudaStream_t) and
    # (void*, size_t, int, cudaStream_t); cudaStream_t is a pointer.
    "sdalloc_torch_malloc": (c_void_p, [c_size_t, c_int, c_void_p]),
    "sdalloc_torch_free": (None, [c_void_p, c_size_t, c_int, c_void_p]),
    "sdalloc_torch_init": (None, [c_int]),
    "sdalloc_torch_empty_cache": (None, []),
    "sdalloc_torch_record_stream": (None, [c_void_p, c_void_p]),
    "sdalloc_torch_memory_fraction_hook": (None, [c_double, c_int]),
    "sdalloc_torch_configure": (c_int, [c_char_p]),
    "sdalloc_torch_config": (c_char_p, []),
    "sdalloc_torch_has_cuda": (c_int, []),
    "sdalloc_torch_pool": (c_void_p, [c_int]),
    "sdalloc_torch_get_pool": (c_int, [c_int, POINTER(c_void_p)]),
    "sdalloc_torch_set_memory_fraction": (c_int, [c_double, c_int]),
    "sdalloc_torch_trim": (c_int, [POINTER(c_size_t)]),
    "sdalloc_torch_last_error": (c_char_p, []),
    "sdalloc_torch_quarantined_bytes": (c_size_t, []),
    "sdalloc_torch_vmm_unmaps": (c_uint64, [c_int]),
    # sdalloc_torch_malloc_raising is not bound: its C++ exception cannot cross ctypes.
}


class Library:
    """One loaded library with its functions typed: lib.c.sdalloc_malloc(...), lib.path."""

    def __init__(self, path, shim):
        self.path = path
        self.shim = shim
        self.c = ctypes.CDLL(path)
        for name, (restype, argtypes) in list(_C_API.items()) + (
                list(_SHIM_API.items()) if shim else []):
            function = getattr(self.c, name)
            function.restype = restype
            function.argtypes = argtypes

    def check(self, status, shim_call=False):
        """Raises SdallocError with the library's message unless status is SUCCESS."""
        if status != SUCCESS:
            if shim_call:
                message = self.c.sdalloc_torch_last_error()
            else:
                message = self.c.sdalloc_last_error()
            raise SdallocError(status, message.decode("utf-8", "replace"))


# --------------------------------------------------------------------------- search

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(os.path.dirname(_PACKAGE_DIR))


def _candidates(directory, name):
    yield os.path.join(directory, name)
    if name == TORCH_LIBRARY:
        yield os.path.join(directory, "torch_shim", name)
    elif name == PRELOAD_LIBRARY:
        yield os.path.join(directory, "preload", name)
    else:
        # A runtime-only install has libsdalloc.so.<major> without the development link.
        yield from sorted(glob.glob(os.path.join(directory, name + ".[0-9]*")), key=len)


def search_path():
    """The directories searched, in order (see the module docstring)."""
    configured = os.environ.get("SDALLOC_LIBRARY_DIR")
    if configured:
        return [d for d in configured.split(os.pathsep) if d]
    dirs = [_PACKAGE_DIR, os.path.normpath(os.path.join(_PACKAGE_DIR, "..", "..", ".."))]
    builds = glob.glob(os.path.join(_REPO_ROOT, "build*", "src")) + glob.glob(
        os.path.join(_REPO_ROOT, "build*", "*", "src"))
    builds = [d for d in builds if os.path.exists(os.path.join(d, HOST_LIBRARY))]
    builds.sort(key=lambda d: os.path.getmtime(os.path.join(d, HOST_LIBRARY)), reverse=True)
    return dirs + builds


def find(name):
    """The path of library `name`, or raises LibraryNotFound listing where it looked."""
    dirs = search_path()
    for directory in dirs:
        for path in _candidates(directory, name):
            if os.path.isfile(path):
                return path
    where = "SDALLOC_LIBRARY_DIR" if os.environ.get("SDALLOC_LIBRARY_DIR") else "the default path"
    raise LibraryNotFound(
        f"sdalloc: {name} not found in {where}: {', '.join(dirs) or '(empty)'}. Build sdalloc "
        f"(cmake --build <dir>) and set SDALLOC_LIBRARY_DIR to the directory holding {name} "
        f"(a build tree's src/ directory).")


_ELF_MAGIC = b"\x7fELF"


def _is_native_program(path):
    # In a venv, <prefix>/bin/sdalloc is the console script that runs this search: only the
    # compiled program qualifies, so the script can never exec itself.
    try:
        with open(path, "rb") as file:
            return file.read(4) == _ELF_MAGIC and os.access(path, os.X_OK)
    except OSError:
        return False


def find_program():
    """The path of the `sdalloc` program: in each directory of search_path(), its bin/ (the
    wheel), ../bin (an installed tree's libdir) or ../tools (a build tree's src/). Raises
    ProgramNotFound listing where it looked."""
    dirs = search_path()
    places = []
    for directory in dirs:
        for sub in ("bin", os.path.join(os.pardir, "bin"), os.path.join(os.pardir, "tools")):
            path = os.path.normpath(os.path.join(directory, sub, PROGRAM))
            places.append(path)
            if _is_native_program(path):
                return path
    raise ProgramNotFound(
        f"sdalloc: the sdalloc program was not found; looked at {', '.join(places) or '(none)'}. "
        f"Install the sdalloc wheel, or build sdalloc (target sdalloc_cli) and set "
        f"SDALLOC_LIBRARY_DIR to the build tree's src/ directory.")


_loaded = {}


def load(name):
    """The Library `name` (HOST_LIBRARY or TORCH_LIBRARY), loaded once per process."""
    if name not in _loaded:
        _loaded[name] = Library(find(name), shim=(name == TORCH_LIBRARY))
    return _loaded[name]


def host():
    return load(HOST_LIBRARY)


def shim():
    return load(TORCH_LIBRARY)
