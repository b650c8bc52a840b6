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

device="cpu" (the default): the engine is the host backend of libsdalloc.so: "device"
tensors are host tensors from the engine's second pool, handed to torch through DLPack;
copy_bytes_per_second gives the copies a known speed (for measurements on a CPU-only
machine).

device="cuda" / "cuda:N": the engine is the CUDA backend of libsdalloc_torch.so
(sdalloc_torch_transfer_engine_create_cuda, include/sdalloc/torch_shim.h). The weights stay
host tensors, registered in place with cudaHostRegister by the engine in the background;
loads run on the engine's copy stream into a stream-ordered pool on the device; before a
unit runs, the compute stream (torch's current stream of that device when offload() is
called; every forward must run on it) waits for its loads' events, so the host does not
block; an eviction frees on the compute stream, after the layers queued there that read
the weight. The module's buffers are moved to the device (back on remove()); the inputs
must be on it. Without a usable CUDA device, or with a shim built without CUDA, offload()
raises SdallocError (INVALID_ARGUMENT) saying so.
"""

import ctypes
import math
import numbers
import threading
from ctypes import POINTER, Structure, c_bool, c_double, c_int, c_size_t, c_uint64, c_void_p

from . import _native
from ._dlpack import (_DLTENSOR, DELETER, KDL_CPU, DLDataType, DLDevice, DLManagedTensor,
                      _capsule_new, dtype_of)

KDL_CUDA = 2  # DLPack's kDLCUDA


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
    "sdalloc_transfer_config_init_sized": (None, [POINTER(TransferConfig), c_size_t]),
    "sdalloc_transfer_engine_create": (c_int, [POINTER(TransferConfig), POINTER(c_void_p)]),
    "sdalloc_transfer_engine_destroy": (None, [c_void_p]),
    "sdalloc_offload_config_init_sized": (None, [POINTER(OffloadConfig), c_size_t]),
    "sdalloc_offload_create": (c_int, [c_void_p, POINTER(OffloadConfig), POINTER(c_void_p)]),
    "sdalloc_offload_destroy": (None, [c_void_p]),
    "sdalloc_offload_add_weight": (c_int, [c_void_p, c_void_p, c_size_t, POINTER(c_size_t)]),
    "sdalloc_offload_begin_step": (c_int, [c_void_p]),
    "sdalloc_offload_acquire": (c_int, [c_void_p, POINTER(c_size_t), c_size_t,
                                        POINTER(c_void_p)]),
    "sdalloc_offload_end_step": (c_int, [c_void_p]),
    "sdalloc_offload_stats": (c_int, [c_void_p, POINTER(OffloadStats)]),
}


# The shim's CUDA entry points (include/sdalloc/torch_shim.h); cudaStream_t is a pointer.
_CUDA_API = {
    "sdalloc_torch_transfer_engine_create_cuda": (c_int, [POINTER(TransferConfig), c_int,
                                                          POINTER(c_void_p)]),
    "sdalloc_torch_offload_create_cuda": (c_int, [c_void_p, POINTER(OffloadConfig), c_int,
                                                  c_void_p, POINTER(c_void_p)]),
    "sdalloc_torch_offload_reserved_bytes": (c_int, [c_void_p, POINTER(c_size_t)]),
}


def _library(cuda=False):
    """The library with the transfer functions typed: the host library (host backend) or,
    for a CUDA device, the shim, which carries the same functions and the CUDA ones."""
    lib = _native.shim() if cuda else _native.host()
    if not getattr(lib, "_transfer_bound", False):
        api = dict(_TRANSFER_API, **(_CUDA_API if cuda else {}))
        for name, (restype, argtypes) in api.items():
            function = getattr(lib.c, name)
            function.restype = restype
            function.argtypes = argtypes
        lib._transfer_bound = True  # pylint: disable=protected-access
    return lib


def _target(torch, device):
    """(None, None) for the host backend, or ("cuda", index) for a CUDA device."""
    if device is None:
        return None, None
    if not isinstance(device, (str, int, torch.device)) or isinstance(device, bool):
        raise TypeError(f"sdalloc.torch.offload: device must be a str, int or torch.device, "
                        f"not {type(device).__name__}")
    where = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if where.type == "cpu":
        return None, None
    if where.type != "cuda":
        raise ValueError(f"sdalloc.torch.offload: device {str(where)!r} is neither 'cpu' nor "
                         "'cuda[:N]'")
    if where.index is not None:
        return "cuda", where.index
    # No index: torch's current device; where torch has no CUDA, device 0, which the shim
    # then refuses with the reason.
    return "cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0


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

    def __init__(self, pointer, shape, dtype, device=(KDL_CPU, 0)):
        code, bits, _ = dtype_of(dtype)
        self._device = device
        shape_array = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        managed = DLManagedTensor()
        managed.dl_tensor.data = pointer
        managed.dl_tensor.device = DLDevice(*device)
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
        return self._device

    def __dlpack__(self, stream=None, **_unused):
        # `stream` (a CUDA view's consumer stream) needs no event: the offloader already
        # made the compute stream wait for the load.
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


def _check_arguments(budget, prefetch, copy_bytes_per_second, cuda):
    """Python-side checks: a C size_t would silently wrap a negative number."""
    # A float budget is taken as int(budget), as it always was; prefetch counts layers.
    if isinstance(budget, bool) or not isinstance(budget, (numbers.Integral, numbers.Real)):
        raise TypeError(f"sdalloc.torch.offload: budget must be a number of bytes, not "
                        f"{type(budget).__name__}")
    if isinstance(prefetch, bool) or not isinstance(prefetch, numbers.Integral):
        raise TypeError(f"sdalloc.torch.offload: prefetch must be an int, not "
                        f"{type(prefetch).__name__}")
    if not math.isfinite(budget):
        raise ValueError(f"sdalloc.torch.offload: budget must be finite, not {budget}")
    budget, prefetch = int(budget), int(prefetch)
    if budget <= 0:
        raise ValueError(f"sdalloc.torch.offload: budget must be a positive number of bytes, "
                         f"not {budget}")
    if prefetch < 0:
        raise ValueError(f"sdalloc.torch.offload: prefetch must be >= 0, not {prefetch}")
    if copy_bytes_per_second < 0:
        raise ValueError("sdalloc.torch.offload: copy_bytes_per_second must be >= 0")
    if cuda and copy_bytes_per_second:
        raise ValueError("sdalloc.torch.offload: copy_bytes_per_second is the host backend's "
                         "simulated speed; a CUDA device copies at its own")
    return budget, prefetch


class Offload:
    """The hooks, engine and offloader behind sdalloc.torch.offload (see the module doc)."""

    def __init__(self, module, budget, prefetch=2, copy_bytes_per_second=0.0, device=None):
        import torch  # pylint: disable=import-outside-toplevel
        self._torch = torch
        kind, index = _target(torch, device)
        self._cuda = kind == "cuda"
        self._index = index
        budget, prefetch = _check_arguments(budget, prefetch, copy_bytes_per_second,
                                            self._cuda)
        self._lib = _library(self._cuda)
        self._engine = None
        self._offload = None
        self._hooks = []
        self._buffers = []  # (owner, name, host buffer) moved to the device
        self._views = {}  # weight -> (device pointer, tensor): a view made once per address
        self._in_step = False
        self._stream = None
        c = self._lib.c
        config = TransferConfig()
        # This struct's size, not the library's: the library writes no more than that.
        c.sdalloc_transfer_config_init_sized(ctypes.byref(config), ctypes.sizeof(config))
        engine = c_void_p()
        if self._cuda:
            # Refuses, saying why, where no CUDA device is usable: before torch.cuda is asked.
            self._lib.check(c.sdalloc_torch_transfer_engine_create_cuda(
                ctypes.byref(config), index, ctypes.byref(engine)))
        else:
            config.copy_bytes_per_second = float(copy_bytes_per_second)
            self._lib.check(c.sdalloc_transfer_engine_create(ctypes.byref(config),
                                                             ctypes.byref(engine)))
        self._engine = engine
        try:
            options = OffloadConfig()
            c.sdalloc_offload_config_init_sized(ctypes.byref(options), ctypes.sizeof(options))
            options.budget = budget
            options.prefetch = prefetch
            handle = c_void_p()
            if self._cuda:
                self._stream = torch.cuda.current_stream(index).cuda_stream
                self._lib.check(c.sdalloc_torch_offload_create_cuda(
                    engine, ctypes.byref(options), index, c_void_p(self._stream or None),
                    ctypes.byref(handle)))
            else:
                self._lib.check(c.sdalloc_offload_create(engine, ctypes.byref(options),
                                                         ctypes.byref(handle)))
            self._offload = handle
            self.budget = budget
            self._add_weights(module, handle)
            if self._cuda:
                self._move_buffers(module)
            self._install(module)
        except BaseException:
            self.remove()
            raise

    def _add_weights(self, module, handle):
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
                self._lib.check(self._lib.c.sdalloc_offload_add_weight(
                    handle, host.data_ptr(), host.numel() * host.element_size(),
                    ctypes.byref(weight)))
                added[id(p)] = weight.value
                entries.append((p, host, weight.value))
            self._units.append((unit, entries))

    def _move_buffers(self, module):
        target = self._torch.device("cuda", self._index)
        for owner in module.modules():
            for name, buffer in owner._buffers.items():  # pylint: disable=protected-access
                if buffer is not None and buffer.device != target:
                    self._buffers.append((owner, name, buffer))
        for owner, name, buffer in self._buffers:
            owner._buffers[name] = buffer.to(target)  # pylint: disable=protected-access

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
        if self._cuda:
            current = self._torch.cuda.current_stream(self._index).cuda_stream
            if current != self._stream:
                raise RuntimeError(
                    f"sdalloc.torch.offload: the forward runs on CUDA stream {current:#x}, "
                    f"but the loads are ordered before stream {self._stream:#x} (the current "
                    "stream when offload() was called): run it there")
        self._lib.check(self._lib.c.sdalloc_offload_begin_step(self._offload))
        self._in_step = True

    def _end(self):
        self._in_step = False
        self._lib.check(self._lib.c.sdalloc_offload_end_step(self._offload))

    def _acquire(self, entries, ids):
        pointers = (c_void_p * len(entries))()
        self._lib.check(self._lib.c.sdalloc_offload_acquire(self._offload, ids, len(entries),
                                                            pointers))
        for (p, host, weight), pointer in zip(entries, pointers):
            p.data = self._view(weight, pointer, host)

    def _view(self, weight, pointer, host):
        """A tensor over the weight's device copy at `pointer`; the same address holds the
        same weight while it is resident, so the view is made once per address."""
        known = self._views.get(weight)
        if known is not None and known[0] == pointer:
            return known[1]
        dtype = str(host.dtype).replace("torch.", "")
        device = (KDL_CUDA, self._index) if self._cuda else (KDL_CPU, 0)
        tensor = self._torch.utils.dlpack.from_dlpack(
            _DeviceView(pointer, tuple(host.shape), dtype, device))
        self._views[weight] = (pointer, tensor)
        return tensor

    @staticmethod
    def _restore(entries):
        for p, host, _ in entries:
            p.data = host

    def stats(self):
        """The offloader's figures: loads, evictions, waits, steps, resident bytes; on a CUDA
        device also device_reserved_bytes, what its device pool holds."""
        out = OffloadStats()
        out.struct_size = ctypes.sizeof(OffloadStats)
        self._lib.check(self._lib.c.sdalloc_offload_stats(self._offload, ctypes.byref(out)))
        figures = {name: getattr(out, name) for name in _OFFLOAD_STAT_NAMES + _OFFLOAD_SIZE_NAMES}
        if self._cuda:
            reserved = c_size_t()
            self._lib.check(self._lib.c.sdalloc_torch_offload_reserved_bytes(
                self._offload, ctypes.byref(reserved)))
            figures["device_reserved_bytes"] = reserved.value
        return figures

    def remove(self):
        """Removes the hooks, points every parameter back at its host tensor (and buffers
        back at theirs), frees all."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        for _, entries in getattr(self, "_units", []):
            self._restore(entries)
        for owner, name, buffer in self._buffers:
            owner._buffers[name] = buffer  # pylint: disable=protected-access
        self._buffers = []
        self._views = {}
        if self._cuda and self._offload is not None:
            # The device memory is freed next: the compute queued on it must be done.
            self._torch.cuda.synchronize(self._index)
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
