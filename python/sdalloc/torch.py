"""sdalloc as PyTorch's CUDA allocator, and PyTorch-facing helpers.

    import sdalloc.torch
    sdalloc.torch.install(mode="pool")        # before anything touches CUDA
    ...                                       # every CUDA tensor now lives in sdalloc
    sdalloc.stats()["reserved_bytes.all.peak"]
    sdalloc.dump_snapshot("snap.pickle")      # open in pytorch.org/memory_viz

install(**config) is the full replacement (torch >= 2.0): PyTorch's
CUDAPluggableAllocator loads libsdalloc_torch.so's sdalloc_torch_malloc_raising /
sdalloc_torch_free and change_current_allocator swaps it in. That is only possible before
PyTorch initialises its CUDA allocator; install() checks and says so when it is too late.
A failed allocation raises RuntimeError ("CUDA out of memory (sdalloc): ..." with sdalloc's
figures) at the allocation, never a tensor at address 0. install() also sets every hook
PyTorch's allocator object takes (init, empty_cache, set_per_process_memory_fraction,
record_stream) and replaces torch.cuda.memory_stats / reset_peak_memory_stats /
memory_snapshot (which CUDAPluggableAllocator does not implement) with the shim pools'
figures, so memory_allocated() and friends work; hooks() says what was set.

mempool(**config) is the other integration (torch >= 2.5): a torch.cuda.MemPool whose
segments come from sdalloc, used with `with torch.cuda.use_mem_pool(pool):`; PyTorch keeps
its own caching and statistics on top.

Configuration keywords (both functions) are SDALLOC_CONF's keys (include/sdalloc/torch_shim.h):
backend ("cuda" | "host"), segments ("whole" | "chunked": mode pool and planned take 2 MiB
chunks mapped into reserved address space, so their arena grows in place),
mode ("pool" | "async" | "vmm" | "planned"), capacity,
memory_fraction, granularity, min_segment, huge_threshold, small_pool, small_granularity,
initial_reservation (ints are bytes; strings like "2MiB" also work), release_before_growth,
consolidate, spare_pages, grow_arena, cut_free_ends (bools),
replan_after (mode "planned": divergent steps in a row before the step is recorded again),
max_plans (mode "planned": plans kept at once, one per kind of step),
plan_nodes (mode "planned": search nodes per plan, for the same plan on every machine).
Keywords not given come from the SDALLOC_CONF environment variable, else the defaults.

mode="planned" serves a repeated step (one denoising iteration) from one planned arena.
Mark each step:

    sdalloc.torch.install(mode="planned")
    for t in timesteps:
        with sdalloc.torch.step():            # current device, its current stream
            latents = scheduler.step(unet(latents, t), t, latents)
    sdalloc.stats()["step_divergent_steps"]

The first step is recorded and planned; later steps that repeat it are served from the
arena by position. A buffer kept past the end of a step (the latents above) is a "kept"
allocation: it is served by the caching pool in later steps and does not break the plan.
begin_step() / end_step() do the same for loops that cannot use `with`.

host_tensor(shape, dtype) works without CUDA: a host allocation of sdalloc handed to torch
through DLPack (its memory returns to the pool when the tensor dies).
"""

import os

from . import _native
from ._native import SdallocError

# SDALLOC_CONF's keys in the shim's order (its option table, src/torch_shim/shim_config.cpp),
# so a typo fails before the shim is loaded; tests/python/test_sdalloc_torch_shim.py checks
# that they are the table's keys.
_CONFIG_KEYS = ("backend", "mode", "capacity", "memory_fraction", "replan_after", "max_plans",
                "plan_nodes", "granularity", "min_segment", "huge_threshold",
                "initial_reservation", "release_before_growth", "consolidate")
# Keys retired in 0.2: still passed on (the shim ignores them with one warning line).
_RETIRED_KEYS = ("segments", "small_pool", "small_granularity", "spare_pages", "grow_arena",
                 "cut_free_ends")

_installed = {"allocator": None, "conf": None}


def _torch():
    try:
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError as error:
        raise ImportError("sdalloc.torch needs PyTorch (import torch failed: "
                          f"{error})") from error
    return torch


def conf_string(**config):
    """SDALLOC_CONF text for keyword settings, over the SDALLOC_CONF environment variable.

    Raises TypeError for an unknown keyword (a typo must not silently do nothing)."""
    pairs = {}
    env = os.environ.get("SDALLOC_CONF", "")
    for item in env.split(","):
        if ":" in item:
            key, value = item.split(":", 1)
            pairs[key.strip()] = value.strip()
    for key, value in config.items():
        if key not in _CONFIG_KEYS and key not in _RETIRED_KEYS:
            raise TypeError(f"sdalloc.torch: unknown setting {key!r} "
                            f"(known: {', '.join(_CONFIG_KEYS)})")
        if isinstance(value, bool):
            value = "true" if value else "false"
        pairs[key] = str(value)
    return ",".join(f"{k}:{v}" for k, v in pairs.items())


def configure(**config):
    """Sets the shim's configuration without touching PyTorch (used by install/mempool, and
    by tests that call the shim directly). Raises SdallocError (INVALID_ARGUMENT) naming a
    bad key or value, or when a pool already exists."""
    lib = _native.shim()
    text = conf_string(**config)
    lib.check(lib.c.sdalloc_torch_configure(text.encode()), shim_call=True)
    return config_text()


def config_text():
    """The shim's configuration in effect, in SDALLOC_CONF form ("" if the shim is not
    loaded or its configuration is bad)."""
    if _native.TORCH_LIBRARY not in _native._loaded:  # pylint: disable=protected-access
        return ""
    return _native.shim().c.sdalloc_torch_config().decode()


def has_cuda():
    """Whether libsdalloc_torch.so was built with the CUDA backend."""
    return bool(_native.shim().c.sdalloc_torch_has_cuda())


def _too_late(torch):
    """Why PyTorch's allocator can no longer be replaced, or None."""
    if not torch.cuda.is_initialized():
        return None
    detail = ""
    try:
        reserved = sum(torch.cuda.memory_reserved(d) for d in range(torch.cuda.device_count()))
        detail = f" ({reserved} bytes already reserved by PyTorch's own CUDA allocator)"
    except Exception:  # pylint: disable=broad-except
        pass
    return ("sdalloc.torch.install() was called too late: PyTorch's CUDA allocator is already "
            f"initialised{detail}, and PyTorch cannot swap an allocator once CUDA memory "
            "may have been allocated through it. Call sdalloc.torch.install() at the start of "
            "the program, before the first CUDA tensor, model.cuda() or torch.cuda call that "
            "initialises CUDA.")


def _pluggable_allocator(torch, malloc_name="sdalloc_torch_malloc"):
    memory = torch.cuda.memory
    if not hasattr(memory, "CUDAPluggableAllocator"):
        raise RuntimeError(
            f"sdalloc.torch: torch {torch.__version__} has no "
            "torch.cuda.memory.CUDAPluggableAllocator (PyTorch >= 2.0 is needed to replace "
            "the CUDA allocator)")
    if not torch.cuda.is_available():
        raise RuntimeError(f"sdalloc.torch: torch {torch.__version__} sees no CUDA device "
                           "(torch.cuda.is_available() is False): there is nothing to replace")
    return memory.CUDAPluggableAllocator(_native.shim().path, malloc_name, "sdalloc_torch_free")


# The optional hooks of PyTorch's C++ CUDAPluggableAllocator (its Python binding's set_*_fn
# methods, which take a function's address) and the shim's function for each.
_HOOKS = (("set_init_fn", "sdalloc_torch_init"),
          ("set_reset_fn", "sdalloc_torch_empty_cache"),
          ("set_memory_fraction_fn", "sdalloc_torch_memory_fraction_hook"),
          ("set_record_stream_fn", "sdalloc_torch_record_stream"))


def _function_address(name):
    from ctypes import c_void_p, cast  # pylint: disable=import-outside-toplevel
    return cast(getattr(_native.shim().c, name), c_void_p).value


def _install_hooks(allocator):
    """Sets every hook the allocator object offers; answers the set_*_fn names it lacks."""
    native = allocator.allocator() if hasattr(allocator, "allocator") else None
    missing = []
    for setter, function in _HOOKS:
        method = getattr(native, setter, None)
        if callable(method):
            method(_function_address(function))
        else:
            missing.append(setter)
    return missing


def _device_index(torch, device):
    """torch.cuda's device argument (None, int, str, torch.device) as an index."""
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    index = getattr(torch.device(device) if isinstance(device, str) else device, "index", None)
    return torch.cuda.current_device() if index is None else int(index)


def _shim_memory_stats(torch, device=None):
    """torch.cuda.memory_stats for the shim: its pool's PyTorch-named figures (an empty dict,
    as PyTorch's allocator gives, for a device that has not allocated)."""
    index = _device_index(torch, device)
    if index not in pools():
        return {}
    return dict(sorted(memory_stats(index).items()))


def _shim_reset_peak(torch, device=None):
    index = _device_index(torch, device)
    found = pools()
    if index in found:
        found[index].reset_peak()


def _shim_record_stream(tensor, stream):
    """Tensor.record_stream through the shim: the storage's base pointer (what PyTorch's own
    allocator records) and the stream's cudaStream_t."""
    from ctypes import c_void_p  # pylint: disable=import-outside-toplevel
    storage = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage()
    lib = _native.shim()
    lib.c.sdalloc_torch_record_stream(c_void_p(storage.data_ptr()),
                                      c_void_p(stream.cuda_stream or None))


def _wrap(owners, name, replacement, wrapped):
    for owner in owners:
        if hasattr(owner, name):
            setattr(owner, name, replacement)
    wrapped.append(name)


def _install_wrappers(torch, missing_hooks):
    """Replaces the torch calls that no hook reaches, or whose hook this torch lacks, with the
    shim's; answers their names (docs/pytorch.md lists what changes meaning)."""
    cuda, memory, wrapped = torch.cuda, torch.cuda.memory, []
    owners = (cuda, memory)
    # CUDAPluggableAllocator raises for getDeviceStats / resetPeakStats: memory_allocated,
    # memory_reserved, max_memory_* and memory_summary all go through memory_stats.
    _wrap(owners, "memory_stats", lambda device=None: _shim_memory_stats(torch, device),
          wrapped)
    _wrap(owners, "reset_peak_memory_stats", lambda device=None: _shim_reset_peak(torch, device),
          wrapped)
    from . import snapshot  # pylint: disable=import-outside-toplevel
    _wrap(owners, "memory_snapshot", lambda *args, **kwargs: snapshot()["segments"], wrapped)
    if "set_reset_fn" in missing_hooks:
        _wrap(owners, "empty_cache", lambda: (empty_cache(), None)[1], wrapped)
    if "set_memory_fraction_fn" in missing_hooks:
        _wrap(owners, "set_per_process_memory_fraction",
              lambda fraction, device=None: set_memory_fraction(
                  fraction, _device_index(torch, device)), wrapped)
    if "set_record_stream_fn" in missing_hooks:
        torch.Tensor.record_stream = _shim_record_stream
        wrapped.append("Tensor.record_stream")
    return wrapped


def install(**config):
    """Makes sdalloc PyTorch's CUDA allocator for this process (see the module doc).

    Raises RuntimeError when it is too late (CUDA already initialised), when torch is older
    than 2.0 or has no CUDA, and SdallocError for a bad configuration. Calling it again with
    the same settings does nothing; with other settings it raises."""
    torch = _torch()
    text = conf_string(**config)
    if _installed["allocator"] is not None:
        if text == _installed["conf"]:
            return
        raise RuntimeError("sdalloc.torch.install(): already installed with "
                           f"'{_installed['conf']}'; the allocator cannot change in a process")
    reason = _too_late(torch)
    if reason is not None:
        raise RuntimeError(reason)
    # The raising allocation function: PyTorch wraps what it returns without a null check.
    allocator = _pluggable_allocator(torch, "sdalloc_torch_malloc_raising")
    configure(**config)
    missing = _install_hooks(allocator)  # before the swap, which calls the init hook
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as error:  # e.g. "Can't swap an already initialized allocator"
        raise RuntimeError(f"sdalloc.torch.install() was called too late: PyTorch refused to "
                           f"swap its CUDA allocator ({error}). Call it at the start of the "
                           "program, before anything initialises CUDA.") from error
    _installed["allocator"] = allocator
    _installed["conf"] = text
    _installed["hooks"] = tuple(h for h, _ in _HOOKS if h not in missing)
    _installed["wrapped"] = tuple(_install_wrappers(torch, missing))


def hooks():
    """What install() did beyond the swap: {"hooks": the CUDAPluggableAllocator set_*_fn
    hooks set, "wrapped": the torch functions replaced by the shim's}."""
    return {"hooks": _installed.get("hooks", ()), "wrapped": _installed.get("wrapped", ())}


def installed():
    return _installed["allocator"] is not None


def mempool(**config):
    """A torch.cuda.MemPool whose segments come from sdalloc (torch >= 2.5).

    Use with `with torch.cuda.use_mem_pool(pool): ...`. Raises RuntimeError on an older
    torch (naming its version) or one without CUDA."""
    torch = _torch()
    if not hasattr(torch.cuda, "MemPool"):
        raise RuntimeError(
            f"sdalloc.torch.mempool() needs torch.cuda.MemPool, which PyTorch added in 2.5; "
            f"this is torch {torch.__version__}. Use sdalloc.torch.install() (torch >= 2.0) "
            "instead.")
    allocator = _pluggable_allocator(torch)
    if not any_pool():
        configure(**config)
    elif config:
        raise RuntimeError("sdalloc.torch.mempool(): the shim's pools exist already, so "
                           f"settings cannot change (in effect: '{config_text()}')")
    pool = torch.cuda.MemPool(allocator.allocator())
    _installed.setdefault("mempools", []).append((pool, allocator))
    return pool


def any_pool():
    if _native.TORCH_LIBRARY not in _native._loaded:  # pylint: disable=protected-access
        return False
    lib = _native.shim()
    return any(lib.c.sdalloc_torch_pool(d) for d in range(-1, 64))


def pools():
    """{device: Pool} for every device whose shim pool exists (empty before any use)."""
    from . import Pool  # pylint: disable=import-outside-toplevel
    if _native.TORCH_LIBRARY not in _native._loaded:  # pylint: disable=protected-access
        return {}
    lib = _native.shim()
    found = {}
    for device in range(-1, 64):
        handle = lib.c.sdalloc_torch_pool(device)
        if handle:
            found[device] = Pool(_handle=handle, _library=lib, _owned=False)
    return found


def pool(device):
    """The shim's Pool for `device`, created now if needed (with the configuration)."""
    from . import Pool  # pylint: disable=import-outside-toplevel
    from ctypes import byref, c_void_p  # pylint: disable=import-outside-toplevel
    lib = _native.shim()
    handle = c_void_p()
    lib.check(lib.c.sdalloc_torch_get_pool(device, byref(handle)), shim_call=True)
    return Pool(_handle=handle.value, _library=lib, _owned=False)


def _step_device(device):
    """`device`, or the current CUDA device when torch has CUDA; else a ValueError."""
    if device is not None:
        return int(device)
    try:
        torch = _torch()
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        raise ValueError("sdalloc.torch: no CUDA device to default to (torch has no CUDA "
                         "here): pass device= (e.g. device=0 for a backend:host pool)")
    return torch.cuda.current_device()


def _step_stream(device, stream):
    """`stream`, or PyTorch's current stream of `device` when CUDA is available; else None
    (the default stream)."""
    if stream is not None or device < 0:
        return stream
    try:
        torch = _torch()
    except ImportError:
        return None
    if not torch.cuda.is_available() or device >= torch.cuda.device_count():
        return None
    return torch.cuda.current_stream(device).cuda_stream or None


def _step_call(call, device):
    """Runs call(pool of device); a refusal because the shim's mode is not planned gets the
    configuration in effect added to the C API's message."""
    shim_pool = pool(device)
    try:
        return call(shim_pool)
    except SdallocError as error:
        if error.status != "INVALID_ARGUMENT" or "mode:planned" in config_text():
            raise
        wrapped = SdallocError(2, f"{error} (sdalloc.torch: steps need the shim's mode "
                                  f"planned; the configuration is '{config_text()}')")
        raise wrapped from error


def begin_step(device=None, stream=None):
    """Starts a step on the shim's pool of `device` (default: the current CUDA device) for
    allocations on `stream` (default: PyTorch's current stream of that device when CUDA is
    available, else the default stream). Needs mode "planned" (SdallocError otherwise, as
    for a step already in progress)."""
    device = _step_device(device)
    stream = _step_stream(device, stream)
    _step_call(lambda p: p.begin_step(stream), device)


def end_step(device=None):
    """Ends the step begun by begin_step() on the shim's pool of `device`."""
    device = _step_device(device)
    _step_call(lambda p: p.end_step(), device)


def step(device=None, stream=None):
    """`with sdalloc.torch.step(): ...` - one step of the shim's planned pool of `device`
    (defaults as begin_step()). The step is ended also when the body raises; the body's
    exception is the one that propagates."""
    from . import Step  # pylint: disable=import-outside-toplevel
    device = _step_device(device)
    stream = _step_stream(device, stream)
    return Step(lambda s: _step_call(lambda p: p.begin_step(s), device),
                lambda: _step_call(lambda p: p.end_step(), device), stream)


def step_stats(device=None):
    """step_stats() of the shim's planned pool of `device` (default as begin_step())."""
    device = _step_device(device)
    return _step_call(lambda p: p.step_stats(), device)


def memory_stats(device=None):
    """PyTorch-named figures of the shim's pool, like torch.cuda.memory_stats(device)."""
    from . import stats  # pylint: disable=import-outside-toplevel
    return {k: v for k, v in stats(device=device).items() if "." in k or k.startswith("num_")}


def empty_cache():
    """Returns the shim pools' wholly free segments to the device (what torch.cuda.empty_cache
    does for the native allocator); answers the bytes released."""
    from ctypes import byref, c_size_t  # pylint: disable=import-outside-toplevel
    lib = _native.shim()
    released = c_size_t()
    lib.check(lib.c.sdalloc_torch_trim(byref(released)), shim_call=True)
    return released.value


def set_memory_fraction(fraction, device=0):
    """Caps the shim's pool of `device` at fraction x the device's memory (like
    torch.cuda.set_per_process_memory_fraction)."""
    lib = _native.shim()
    lib.check(lib.c.sdalloc_torch_set_memory_fraction(float(fraction), int(device)),
              shim_call=True)


def host_tensor(shape, dtype=None, pool=None):
    """A torch tensor on the CPU whose memory is an sdalloc host allocation (DLPack).

    The memory returns to the pool when the tensor (and every view of it) dies. Default
    pool: sdalloc.default_pool()."""
    torch = _torch()
    from . import default_pool  # pylint: disable=import-outside-toplevel
    dtype = torch.float32 if dtype is None else dtype
    source = (pool or default_pool()).tensor(shape, dtype)
    return torch.utils.dlpack.from_dlpack(source)


__all__ = ["install", "installed", "hooks", "mempool", "configure", "config_text", "conf_string",
           "has_cuda", "pools", "pool", "memory_stats", "empty_cache", "set_memory_fraction",
           "host_tensor", "step", "begin_step", "end_step", "step_stats", "SdallocError"]


def offload(module, budget, device=None, copy_bytes_per_second=0.0, unit_bytes=32 << 20,
            pin=True):
    """Streams `module`'s weights to a device under a `budget` of device bytes
    (sdalloc/_offload.py): the module is cut into units of at most unit_bytes, packed into
    one host arena (the model once in RAM, page-locked in place unless pin=False), and
    every parameter becomes a view into one device region of at most `budget`; the first
    forward is recorded and planned, later ones copy units ahead with events only, one C
    call per unit. device None or "cpu": the simulated device on the CPU (torch computes on
    the host; copy_bytes_per_second: its copies' speed); a sdalloc.torch.SimulatedDevice;
    "cuda[:N]": libsdalloc_torch.so's CUDA device on the current stream (refused with
    SdallocError where CUDA is not usable). A budget below the largest unit raises
    SdallocError naming the unit; a budget that is not a positive finite number of bytes,
    TypeError or ValueError. Answers the Offload object: stats(), describe(), remove()."""
    from ._offload import Offload  # pylint: disable=import-outside-toplevel
    return Offload(module, budget, device=device, copy_bytes_per_second=copy_bytes_per_second,
                   unit_bytes=unit_bytes, pin=pin)


def __getattr__(name):
    # sdalloc.torch.SimulatedDevice: the simulated device, loaded with the offload code.
    if name == "SimulatedDevice":
        from ._offload_device import SimulatedDevice  # pylint: disable=import-outside-toplevel
        return SimulatedDevice
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
