"""sdalloc: a memory manager for deep-learning inference, from Python.

Pure Python over sdalloc's C API (ctypes): no compiled extension, nothing built against
torch. Works without CUDA and without torch: host pools, statistics, snapshots and event
traces are always available; sdalloc.torch adds PyTorch integration.

    import sdalloc
    pool = sdalloc.Pool(capacity=8 << 30)          # host pool that behaves like an 8 GiB card
    sdalloc.Pool(mode="pool")                      # the segment cache instead of pages
    t = pool.tensor((1024, 1024), "float16")       # a DLPack-exportable host tensor
    x = torch.utils.dlpack.from_dlpack(t)          # memory returns to the pool when x dies
    sdalloc.stats(pool)["reserved_bytes.all.peak"]
    sdalloc.dump_snapshot("snap.pickle", pool)     # pytorch.org/memory_viz reads it
    with sdalloc.record("trace.csv", pool):        # an event trace `sdalloc replay` reads
        ...
    planned = sdalloc.Pool(mode="planned")         # serves a repeated step from one arena
    for _ in range(steps):
        with planned.step():                       # recorded once, then replayed by position
            ...
    planned.step_stats()["divergent_steps"]

Under LD_PRELOAD=libsdalloc_preload.so (docs/preload.md), `with sdalloc.step():` marks the
steps of a loop for the drop-in's mode:planned, and sdalloc.preloaded() says it is there.

Without a `pool` argument, stats / snapshot / dump_snapshot / record use the PyTorch
shim's pools once sdalloc.torch.install() (or mempool()) has run, else the default host pool
(default_pool()).

Libraries are found through SDALLOC_LIBRARY_DIR, next to the package, or in the source
tree's build directories (see sdalloc._native).
"""

import pickle
import warnings
from ctypes import byref, c_int, c_int64, c_size_t, c_uint64, c_void_p, sizeof

from . import _native
from ._dlpack import HostTensor, live_exports
from ._native import LibraryNotFound, SdallocError
from ._snapshot import snapshot_of
from ._preload import owns as preload_owns, preloaded, step

__all__ = ["Pool", "Step", "step", "preloaded", "preload_owns", "HostTensor", "SdallocError", "LibraryNotFound", "default_pool", "stats",
           "snapshot", "dump_snapshot", "record", "Recording", "version", "live_exports"]

_STATE_FREE, _STATE_LIVE, _STATE_PENDING = 0, 1, 2


def version():
    """The version of the loaded libsdalloc.so, e.g. "0.1.0"."""
    return _native.host().c.sdalloc_version().decode()


class Pool:
    """A pool: a C API pool handle and the library it belongs to.

    Pool(mode="auto", **options) creates a host pool (libsdalloc.so). mode picks the pool
    (docs/pools.md): "vmm" maps 64 KiB pages and moves them under the requests
    that need them; "pool" is the segment cache over whole mmap'd segments; "planned" serves
    a repeated step from one planned arena; "auto" (default) is vmm, or pool with
    hugepages=True (transparent huge pages come in whole segments). options are the other
    fields of sdalloc_pool_config_t: capacity (every mode); initial_reservation,
    segment_granularity, min_segment_size, huge_threshold, release_cached_before_growth,
    consolidate_when_empty (the segment cache, also under planned); replan_after_divergent_steps,
    max_plans, planner_max_search_nodes (planned). planned=True is mode="planned". Pools
    of the PyTorch shim come from sdalloc.torch.pool(device).

    A planned pool serves a repeated step from one planned arena: mark each step with
    `with pool.step(stream):` (or begin_step() / end_step()); the first step is recorded,
    later ones are served by position while they repeat it (see step_stats()).
    """

    def __init__(self, mode="auto", hugepages=False, _handle=None, _library=None, _owned=True,
                 **options):
        self._lib = _library or _native.host()
        self._owned = _owned
        self._handle = None
        self._planned = None  # unknown for a handle from elsewhere: asked on first stats()
        if _handle is not None:
            self._handle = _handle
            return
        if mode not in _native.POOL_MODES:
            raise ValueError(f"sdalloc.Pool: unknown mode {mode!r} (one of "
                             f"{', '.join(_native.POOL_MODES)})")
        config = _native.PoolConfig()
        self._lib.c.sdalloc_pool_config_init_sized(byref(config), sizeof(config))
        config.resource = 1 if hugepages else 0
        config.mode = _native.POOL_MODES[mode]
        for name, value in options.items():
            if name not in dict(_native.PoolConfig._fields_) or name in ("struct_size",
                                                                         "resource", "mode"):
                raise TypeError(f"sdalloc.Pool: unknown option {name!r}")
            if name in _native.RETIRED_POOL_FIELDS:
                warnings.warn(f"sdalloc.Pool: {name} no longer has any effect (retired in "
                              "0.2: mode='vmm' moves pages; docs/pools.md)",
                              DeprecationWarning, stacklevel=2)
                continue
            setattr(config, name, value)
        handle = c_void_p()
        self._lib.check(self._lib.c.sdalloc_pool_create(byref(config), byref(handle)))
        self._handle = handle.value
        self._planned = bool(config.planned) or mode == "planned"

    @property
    def handle(self):
        """The sdalloc_pool_t* as an int."""
        return self._handle

    @property
    def library(self):
        return self._lib.path

    def close(self):
        """Destroys an owned pool (every allocation becomes invalid). Idempotent."""
        if self._owned and self._handle is not None:
            self._lib.c.sdalloc_pool_destroy(self._handle)
        self._handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # pylint: disable=broad-except
            pass

    # -- memory -------------------------------------------------------------------------
    def malloc(self, size, stream=None, alignment=None):
        """Allocates `size` bytes; returns the address as an int (None for size 0)."""
        out = c_void_p()
        if alignment is None:
            status = self._lib.c.sdalloc_malloc(self._handle, size, stream, byref(out))
        else:
            status = self._lib.c.sdalloc_malloc_aligned(self._handle, size, alignment, stream,
                                                        byref(out))
        self._lib.check(status)
        return out.value

    def free(self, pointer, stream=None):
        self._lib.check(self._lib.c.sdalloc_free(self._handle, pointer, stream))

    def allocation_size(self, pointer):
        size = c_size_t()
        self._lib.check(self._lib.c.sdalloc_allocation_size(self._handle, pointer, byref(size)))
        return size.value

    def tensor(self, shape, dtype="float32"):
        """A HostTensor of this pool: hand it to torch with torch.utils.dlpack.from_dlpack."""
        return HostTensor(self, shape, dtype)

    def trim(self):
        """Returns wholly free cached segments to the resource; answers the bytes released."""
        released = c_size_t()
        self._lib.check(self._lib.c.sdalloc_trim(self._handle, byref(released)))
        return released.value

    # -- steps (planned pools) ----------------------------------------------------------
    def begin_step(self, stream=None):
        """Starts a step whose allocations on `stream` (None: the default stream) follow
        the plan; the first step is recorded. Raises SdallocError (INVALID_ARGUMENT) for a
        pool that is not planned or a step already in progress."""
        self._lib.check(self._lib.c.sdalloc_pool_begin_step(self._handle, stream))

    def end_step(self):
        """Ends the step begun by begin_step() (after a recorded step: plans it and reserves
        the arena). Raises SdallocError (INVALID_ARGUMENT) when no step is in progress or
        the pool is not planned."""
        self._lib.check(self._lib.c.sdalloc_pool_end_step(self._handle))

    def step(self, stream=None):
        """`with pool.step(stream): ...` - begin_step(stream) on entry, end_step() on exit,
        also when the body raises (the body's exception is then the one that propagates)."""
        return Step(self.begin_step, self.end_step, stream)

    def step_stats(self):
        """Every sdalloc_step_stats_t field as a dict. Raises SdallocError
        (INVALID_ARGUMENT) for a pool that is not planned."""
        raw = _native.StepStats()
        raw.struct_size = sizeof(raw)
        self._lib.check(self._lib.c.sdalloc_pool_step_stats(self._handle, byref(raw)))
        return {name: getattr(raw, name) for name, _ in raw._fields_ if name != "struct_size"}

    def is_planned(self):
        """Whether this is a planned pool."""
        if self._planned is None:
            self._planned = self.mode == "planned"
        return self._planned

    @property
    def mode(self):
        """The mode the pool was built in, "vmm", "pool", "planned" or "async" (never "auto":
        that resolves when the pool is made; docs/pools.md)."""
        raw = c_int()
        self._lib.check(self._lib.c.sdalloc_pool_mode(self._handle, byref(raw)))
        return {v: k for k, v in _native.POOL_MODES.items()}[raw.value]

    # -- figures ------------------------------------------------------------------------
    def stats(self):
        """Every sdalloc_stats_t field, plus the same figures under PyTorch's
        torch.cuda.memory_stats() key names ("allocated_bytes.all.current", ...), plus for
        a planned pool every step_stats() field prefixed "step_" ("step_divergent_steps")."""
        raw = _native.Stats()
        raw.struct_size = sizeof(raw)
        self._lib.check(self._lib.c.sdalloc_pool_stats(self._handle, byref(raw)))
        result = {name: getattr(raw, name) for name, _ in raw._fields_ if name != "struct_size"}
        result.update(self.memory_stats())
        if self.is_planned():
            result.update({"step_" + name: value for name, value in self.step_stats().items()})
        return result

    def memory_stats(self):
        """Only the PyTorch-named figures, like torch.cuda.memory_stats()."""
        result = {}
        index = 0
        value = c_int64()
        while True:
            key = self._lib.c.sdalloc_memory_stat_key(index)
            if key is None:
                break
            self._lib.check(self._lib.c.sdalloc_memory_stat(self._handle, key, byref(value)))
            result[key.decode()] = value.value
            index += 1
        return result

    def reset_peak(self):
        self._lib.check(self._lib.c.sdalloc_pool_reset_peak(self._handle))

    def layout(self):
        """Segments (address order), each a dict with its blocks (address order)."""
        c = self._lib.c
        layout = c_void_p()
        self._lib.check(c.sdalloc_pool_layout(self._handle, byref(layout)))
        try:
            segments = []
            seg = _native.SegmentInfo()
            block = _native.BlockInfo()
            for i in range(c.sdalloc_layout_segment_count(layout)):
                seg.struct_size = sizeof(seg)
                self._lib.check(c.sdalloc_layout_segment(layout, i, byref(seg)))
                blocks = []
                for j in range(seg.block_count):
                    block.struct_size = sizeof(block)
                    self._lib.check(c.sdalloc_layout_block(layout, i, j, byref(block)))
                    blocks.append({"address": block.address, "size": block.size,
                                   "requested": block.requested, "state": block.state})
                segments.append({"address": seg.address, "size": seg.size,
                                 "stream": seg.stream or 0, "huge": seg.huge,
                                 "pinned": seg.pinned, "blocks": blocks})
            return segments
        finally:
            c.sdalloc_layout_destroy(layout)

    # -- event trace --------------------------------------------------------------------
    def trace_start(self, path):
        self._lib.check(self._lib.c.sdalloc_pool_trace_start(self._handle,
                                                             str(path).encode()))

    def trace_stop(self):
        events = c_uint64()
        self._lib.check(self._lib.c.sdalloc_pool_trace_stop(self._handle, byref(events)))
        return events.value


class Step:
    """A step as a context manager (Pool.step(), sdalloc.torch.step()): `begin(stream)` on
    entry, `end()` on exit. When the body raised, the step is still ended and the body's
    exception propagates (an error of end() is then attached to it as a note)."""

    def __init__(self, begin, end, stream=None):
        self._begin = begin
        self._end = end
        self.stream = stream

    def __enter__(self):
        self._begin(self.stream)
        return self

    def __exit__(self, exc_type, exc, traceback):
        try:
            self._end()
        except SdallocError as error:
            if exc is None:
                raise
            if hasattr(exc, "add_note"):
                exc.add_note(f"sdalloc: ending the step also failed: {error}")
        return False


_default_pool = None


def default_pool():
    """The process's default host pool, created on first use."""
    global _default_pool  # pylint: disable=global-statement
    if _default_pool is None:
        _default_pool = Pool()
    return _default_pool


def _pools(pool):
    """{device: Pool} for a call with an optional pool argument (see the module doc)."""
    if pool is not None:
        return {-1: pool}
    from . import torch as sdalloc_torch  # pylint: disable=import-outside-toplevel
    shim_pools = sdalloc_torch.pools()
    return shim_pools if shim_pools else {-1: default_pool()}


def stats(pool=None, device=None):
    """Figures of `pool` (sdalloc names and PyTorch's memory_stats names).

    Without a pool: the PyTorch shim's pool of `device` (default: the lowest device that has
    one) once sdalloc.torch is in use, else the default host pool."""
    pools = _pools(pool)
    if device is not None:
        if device not in pools:
            raise ValueError(f"sdalloc: device {device} has no pool (pools: {sorted(pools)})")
        return pools[device].stats()
    return pools[min(pools)].stats()


def snapshot(pool=None):
    """A dict in the layout of torch.cuda.memory._snapshot() (see sdalloc._snapshot)."""
    pools = _pools(pool)
    settings = {"allocator": "sdalloc", "sdalloc_version": version()}
    from . import torch as sdalloc_torch  # pylint: disable=import-outside-toplevel
    config = sdalloc_torch.config_text()
    if config and pool is None:
        settings["SDALLOC_CONF"] = config
    return snapshot_of(pools, settings)


def dump_snapshot(path, pool=None):
    """Pickles snapshot(pool) to `path`, as torch.cuda.memory._dump_snapshot() does."""
    with open(path, "wb") as out:
        pickle.dump(snapshot(pool), out)


class Recording:
    """An event trace being written (see record()); stop() answers the events written."""

    def __init__(self, path, pools):
        self.path = str(path)
        self._pools = []
        self.events = None
        for device, pool in sorted(pools.items()):
            target = self.path if len(pools) == 1 else f"{self.path}.{device}"
            pool.trace_start(target)
            self._pools.append(pool)

    def stop(self):
        if self.events is None:
            self.events = sum(pool.trace_stop() for pool in self._pools)
        return self.events

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


def record(path, pool=None):
    """Starts writing an event trace (`op,id,size,stream`, what `sdalloc replay` reads) of
    everything the pool serves from now on; use as a context manager or call .stop().
    With several shim pools (devices), one file per device: <path>.<device>."""
    return Recording(path, _pools(pool))


# --------------------------------------------------------------------------- packaging
# The drop-in's path for LD_PRELOAD, and the version. __version__ comes from CMake's
# project(VERSION): the build writes _version.py beside the libraries (the wheel, `cmake
# --install`); in the source tree (python/ on the path) the loaded library says it.
from ._preload import preload_path  # noqa: E402 (kept at the end: Pool's edits stay apart)

__all__ += ["preload_path"]

try:
    from . import _version  # noqa: E402
    __version__ = _version.__version__
except ImportError:
    def __getattr__(name):
        if name == "__version__":
            return version()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
