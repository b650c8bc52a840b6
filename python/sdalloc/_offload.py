"""Weight offload for a torch module through sdalloc's transfer engine (sdalloc_transfer.h).

    off = sdalloc.torch.offload(model, budget=512 << 20, prefetch=2)
    with torch.no_grad():
        for t in timesteps:
            latents = model(latents, t)          # one step: weights streamed under the budget
    off.stats()["peak_resident_bytes"] <= off.budget
    off.remove()                                 # hooks off, parameters as they were

The module's parameters stay where they are (host memory, registered with the engine in
place: ~1x the model in host RAM, no pinned copy). Each *unit* - a submodule that owns
parameters directly, with its whole subtree - is one use: a forward pre-hook acquires its
parameters from the engine (device copies, loaded ahead by the plan) and points the
parameters at them, a forward hook points them back at the host tensors. The root's
forward is one step: the first is recorded, the order is planned (Belady-optimal eviction,
loads `prefetch` uses ahead), later steps follow the plan. For inference (the swap goes
around autograd).

This library's engine is the host backend: "device" tensors are host tensors from the
engine's second pool, handed to torch through DLPack; copy_bytes_per_second gives the copies
a known speed (for measurements on a CPU-only machine).
"""

import ctypes
import threading
from ctypes import POINTER, Structure, c_bool, c_double, c_int, c_size_t, c_uint64, c_void_p

from . import _native
from ._dlpack import (_DLTENSOR, DELETER, KDL_CPU, DLDataType, DLDevice, DLManagedTensor,
                      _capsule_new, dtype_of)


class TransferConfig(Structure):
    _fields_ = [("struct_size", c_size_t), ("staging_budget", c_size_t),
                ("batch_bytes", c_size_t), ("small_bytes", c_size_t), ("chunk_bytes", c_size_t),
                ("copy_streams", c_size_t), ("copy_bytes_per_second", c_double)]


class OffloadConfig(Structure):
    _fields_ = [("struct_size", c_size_t), ("budget", c_size_t), ("prefetch", c_size_t),
                ("pin", c_bool)]


_OFFLOAD_STAT_NAMES = ("loads", "loaded_bytes", "evictions", "waits", "recorded_steps",
                       "planned_steps", "divergent_steps", "plans")
_OFFLOAD_SIZE_NAMES = ("resident_bytes", "peak_resident_bytes", "budget", "largest_weight")


class OffloadStats(Structure):
    _fields_ = [("struct_size", c_size_t)] + [(n, c_uint64) for n in _OFFLOAD_STAT_NAMES] + [
        (n, c_size_t) for n in _OFFLOAD_SIZE_NAMES]


_TRANSFER_API = {
    "sdalloc_transfer_config_init": (None, [POINTER(TransferConfig)]),
    "sdalloc_transfer_engine_create": (c_int, [POINTER(TransferConfig), POINTER(c_void_p)]),
    "sdalloc_transfer_engine_destroy": (None, [c_void_p]),
    "sdalloc_offload_config_init": (None, [POINTER(OffloadConfig)]),
    "sdalloc_offload_create": (c_int, [c_void_p, POINTER(OffloadConfig), POINTER(c_void_p)]),
    "sdalloc_offload_destroy": (None, [c_void_p]),
    "sdalloc_offload_add_weight": (c_int, [c_void_p, c_void_p, c_size_t, POINTER(c_size_t)]),
    "sdalloc_offload_begin_step": (c_int, [c_void_p]),
    "sdalloc_offload_acquire": (c_int, [c_void_p, POINTER(c_size_t), c_size_t,
                                        POINTER(c_void_p)]),
    "sdalloc_offload_end_step": (c_int, [c_void_p]),
    "sdalloc_offload_stats": (c_int, [c_void_p, POINTER(OffloadStats)]),
}


def _library():
    """The host library with the transfer functions typed (only it carries them)."""
    lib = _native.host()
    if not getattr(lib, "_transfer_bound", False):
        for name, (restype, argtypes) in _TRANSFER_API.items():
            function = getattr(lib.c, name)
            function.restype = restype
            function.argtypes = argtypes
        lib._transfer_bound = True  # pylint: disable=protected-access
    return lib


# DLPack views of engine memory: the engine owns it, so the deleter only forgets the view.
_views = {}
_views_lock = threading.Lock()
_next_view = [1]


@DELETER
def _view_deleter(managed):
    try:
        with _views_lock:
            _views.pop(managed.contents.manager_ctx, None)
    except Exception:  # pylint: disable=broad-except
        pass  # called from torch's C code: nothing may propagate


class _DeviceView:
    """A dense tensor at `pointer` (engine memory) for torch.utils.dlpack.from_dlpack."""

    def __init__(self, pointer, shape, dtype):
        code, bits, _ = dtype_of(dtype)
        shape_array = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        managed = DLManagedTensor()
        managed.dl_tensor.data = pointer
        managed.dl_tensor.device = DLDevice(KDL_CPU, 0)
        managed.dl_tensor.ndim = len(shape)
        managed.dl_tensor.dtype = DLDataType(code, bits, 1)
        managed.dl_tensor.shape = shape_array
        managed.dl_tensor.strides = None
        managed.dl_tensor.byte_offset = 0
        managed.deleter = _view_deleter
        with _views_lock:
            key = _next_view[0]
            _next_view[0] += 1
            _views[key] = (managed, shape_array)
        managed.manager_ctx = key
        self._managed = managed

    def __dlpack_device__(self):
        return (KDL_CPU, 0)

    def __dlpack__(self, stream=None, **_unused):
        return _capsule_new(ctypes.addressof(self._managed), _DLTENSOR, None)


def _units(module):
    """(unit, [(owner, name, parameter)]) for each submodule owning parameters directly,
    the parameters of its whole subtree with it; modules without any are descended into."""
    if any(p is not None for p in module._parameters.values()):  # pylint: disable=protected-access
        params = []
        for owner in module.modules():
            for name, p in owner._parameters.items():  # pylint: disable=protected-access
                if p is not None:
                    params.append((owner, name, p))
        return [(module, params)]
    units = []
    for child in module.children():
        units.extend(_units(child))
    return units


class Offload:
    """The hooks, engine and offloader behind sdalloc.torch.offload (see the module doc)."""

    def __init__(self, module, budget, prefetch=2, copy_bytes_per_second=0.0):
        import torch  # pylint: disable=import-outside-toplevel
        self._torch = torch
        self._lib = _library()
        c = self._lib.c
        config = TransferConfig()
        c.sdalloc_transfer_config_init(ctypes.byref(config))
        config.copy_bytes_per_second = float(copy_bytes_per_second)
        engine = c_void_p()
        self._lib.check(c.sdalloc_transfer_engine_create(ctypes.byref(config),
                                                         ctypes.byref(engine)))
        self._engine = engine
        self._offload = None
        self._hooks = []
        self._in_step = False
        try:
            options = OffloadConfig()
            c.sdalloc_offload_config_init(ctypes.byref(options))
            options.budget = int(budget)
            options.prefetch = int(prefetch)
            handle = c_void_p()
            self._lib.check(c.sdalloc_offload_create(engine, ctypes.byref(options),
                                                     ctypes.byref(handle)))
            self._offload = handle
            self.budget = int(budget)
            self._units = []
            added = {}  # a parameter shared by several modules (tied weights) is one weight
            for unit, params in _units(module):
                entries = []
                for owner, name, p in params:
                    if id(p) in added:
                        entries.append((p, p.data, added[id(p)]))
                        continue
                    if p.device.type != "cpu" or not p.data.is_contiguous():
                        raise ValueError(f"sdalloc.torch.offload: parameter {name} of "
                                         f"{type(owner).__name__} is not a contiguous host "
                                         "tensor")
                    host = p.data
                    weight = c_size_t()
                    self._lib.check(c.sdalloc_offload_add_weight(
                        handle, host.data_ptr(), host.numel() * host.element_size(),
                        ctypes.byref(weight)))
                    added[id(p)] = weight.value
                    entries.append((p, host, weight.value))
                self._units.append((unit, entries))
            self._install(module)
        except BaseException:
            self.remove()
            raise

    def _install(self, module):
        self._hooks.append(module.register_forward_pre_hook(lambda m, i: self._begin()))
        for unit, entries in self._units:
            ids = (c_size_t * len(entries))(*[w for _, _, w in entries])
            self._hooks.append(unit.register_forward_pre_hook(
                lambda m, i, entries=entries, ids=ids: self._acquire(entries, ids)))
            self._hooks.append(unit.register_forward_hook(
                lambda m, i, o, entries=entries: self._restore(entries)))
        self._hooks.append(module.register_forward_hook(lambda m, i, o: self._end()))

    def _begin(self):
        if self._in_step:  # the last forward raised: close its step first
            self._end()
        self._lib.check(self._lib.c.sdalloc_offload_begin_step(self._offload))
        self._in_step = True

    def _end(self):
        self._in_step = False
        self._lib.check(self._lib.c.sdalloc_offload_end_step(self._offload))

    def _acquire(self, entries, ids):
        pointers = (c_void_p * len(entries))()
        self._lib.check(self._lib.c.sdalloc_offload_acquire(self._offload, ids, len(entries),
                                                            pointers))
        from_dlpack = self._torch.utils.dlpack.from_dlpack
        for (p, host, _), pointer in zip(entries, pointers):
            dtype = str(host.dtype).replace("torch.", "")
            p.data = from_dlpack(_DeviceView(pointer, tuple(host.shape), dtype))

    @staticmethod
    def _restore(entries):
        for p, host, _ in entries:
            p.data = host

    def stats(self):
        """The offloader's figures: loads, evictions, waits, steps, resident bytes."""
        out = OffloadStats()
        out.struct_size = ctypes.sizeof(OffloadStats)
        self._lib.check(self._lib.c.sdalloc_offload_stats(self._offload, ctypes.byref(out)))
        return {name: getattr(out, name) for name in _OFFLOAD_STAT_NAMES + _OFFLOAD_SIZE_NAMES}

    def remove(self):
        """Removes the hooks, points every parameter back at its host tensor, frees all."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        for _, entries in getattr(self, "_units", []):
            self._restore(entries)
        if self._offload is not None:
            self._lib.c.sdalloc_offload_destroy(self._offload)
            self._offload = None
        if self._engine is not None:
            self._lib.c.sdalloc_transfer_engine_destroy(self._engine)
            self._engine = None

    def __del__(self):
        try:
            self.remove()
        except Exception:  # pylint: disable=broad-except
            pass
