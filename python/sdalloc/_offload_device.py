"""The devices sdalloc.torch.offload runs on, and the C functions it calls (sdalloc_transfer.h,
"unit offload"), bound with ctypes.

Three devices, one interface (the library's sdalloc_stream_device_t):
  - the simulated device of libsdalloc.so (SimulatedDevice below): a compute queue of
    simulated kernels, one copy engine of a given bandwidth, costs per call and simulated
    clocks - the host backend, on which the offload is tested; with host_compute (what
    device=None / "cpu" makes) the calling thread computes, so torch on the CPU reads the
    "device" memory directly;
  - a CUDA device, made by libsdalloc_torch.so (sdalloc_torch_stream_device_create_cuda) on
    torch's current stream; refused, saying why, where CUDA is not usable.
DeviceView hands a range of device (or simulated device) memory to torch through DLPack.
"""

import contextlib
import ctypes
import threading
from ctypes import (POINTER, Structure, c_bool, c_char_p, c_double, c_int, c_size_t, c_uint64,
                    c_void_p)

from . import _native
from ._dlpack import (_DLTENSOR, DELETER, KDL_CPU, DLDataType, DLDevice, DLManagedTensor,
                      _capsule_new, dtype_of)

KDL_CUDA = 2  # DLPack's kDLCUDA


class SimDeviceConfig(Structure):
    _fields_ = [("struct_size", c_size_t), ("copy_bytes_per_second", c_double),
                ("seconds_per_copy", c_double), ("seconds_per_call", c_double),
                ("host_compute", c_bool)]


_SIM_STAT_NAMES = ("kernels", "copy_calls", "copied_bytes", "pageable_copies", "calls",
                   "host_waits", "device_allocations", "check_failures")


class SimDeviceStats(Structure):
    _fields_ = [("struct_size", c_size_t)] + [(n, c_uint64) for n in _SIM_STAT_NAMES] + [
        ("device_bytes", c_size_t), ("locked_bytes", c_size_t)]


class UnitOffloadConfig(Structure):
    _fields_ = [("struct_size", c_size_t), ("budget", c_size_t), ("pin", c_bool),
                ("register_chunk_bytes", c_size_t), ("staging_chunk_bytes", c_size_t)]


_UNIT_COUNT_NAMES = ("steps", "recorded_steps", "planned_steps", "divergent_steps", "plans",
                     "copies", "copied_bytes", "staged_copies", "host_waits",
                     "device_allocations", "layout_version")
_UNIT_SIZE_NAMES = ("units", "streamed_units", "model_bytes", "resident_bytes", "ring_bytes",
                    "region_bytes", "streamed_bytes", "registered_bytes", "arena_bytes_in_ram")
_UNIT_FLAG_NAMES = ("registration_refused", "planned")
_UNIT_TIME_NAMES = ("compute_seconds", "predicted_step_seconds", "floor_seconds",
                    "ideal_floor_seconds", "copy_bytes_per_second", "seconds_per_copy")


class UnitOffloadStats(Structure):
    _fields_ = ([("struct_size", c_size_t)] + [(n, c_uint64) for n in _UNIT_COUNT_NAMES] +
                [(n, c_size_t) for n in _UNIT_SIZE_NAMES] + [(n, c_int) for n in
                                                              _UNIT_FLAG_NAMES] +
                [(n, c_double) for n in _UNIT_TIME_NAMES])


_P = c_void_p
_API = {
    "sdalloc_sim_device_config_init_sized": (None, [POINTER(SimDeviceConfig), c_size_t]),
    "sdalloc_sim_device_create": (c_int, [POINTER(SimDeviceConfig), POINTER(_P)]),
    "sdalloc_stream_device_destroy": (None, [_P]),
    "sdalloc_stream_device_compute_stream": (c_int, [_P, POINTER(_P)]),
    "sdalloc_stream_device_synchronize": (c_int, [_P]),
    "sdalloc_sim_launch": (c_int, [_P, c_double, c_double, _P, _P, c_size_t]),
    "sdalloc_sim_host_seconds": (c_int, [_P, POINTER(c_double)]),
    "sdalloc_sim_device_stats": (c_int, [_P, POINTER(SimDeviceStats)]),
    "sdalloc_unit_offload_config_init_sized": (None, [POINTER(UnitOffloadConfig), c_size_t]),
    "sdalloc_unit_offload_create": (c_int, [_P, POINTER(UnitOffloadConfig), POINTER(_P)]),
    "sdalloc_unit_offload_destroy": (None, [_P]),
    "sdalloc_unit_offload_add_unit": (c_int, [_P, c_size_t, c_int, POINTER(c_size_t)]),
    "sdalloc_unit_offload_seal": (c_int, [_P]),
    "sdalloc_unit_offload_host_image": (c_int, [_P, c_size_t, POINTER(_P)]),
    "sdalloc_unit_offload_device_image": (c_int, [_P, c_size_t, POINTER(_P)]),
    "sdalloc_unit_offload_layout": (c_int, [_P, POINTER(c_uint64), POINTER(c_int)]),
    "sdalloc_unit_offload_streamed": (c_int, [_P, c_size_t, POINTER(c_int)]),
    "sdalloc_unit_offload_begin_step": (c_int, [_P, _P]),
    "sdalloc_unit_offload_enter": (c_int, [_P, c_size_t]),
    "sdalloc_unit_offload_end_step": (c_int, [_P]),
    "sdalloc_unit_offload_record_next": (c_int, [_P]),
    "sdalloc_unit_offload_stats": (c_int, [_P, POINTER(UnitOffloadStats)]),
    "sdalloc_unit_offload_describe": (c_int, [_P, c_char_p, c_size_t, POINTER(c_size_t)]),
}
_CUDA_API = {"sdalloc_torch_stream_device_create_cuda": (c_int, [c_int, _P, POINTER(_P)])}


def library(cuda=False):
    """The library with the unit offload functions typed: the host library, or for CUDA the
    shim, which carries the same functions and the CUDA device's."""
    lib = _native.shim() if cuda else _native.host()
    if not getattr(lib, "_unit_offload_bound", False):
        for name, (restype, argtypes) in dict(_API, **(_CUDA_API if cuda else {})).items():
            function = getattr(lib.c, name)
            function.restype = restype
            function.argtypes = argtypes
        lib._unit_offload_bound = True  # pylint: disable=protected-access
    return lib


def _stats_dict(structure, names):
    return {name: getattr(structure, name) for name in names}


class StreamDevice:
    """A device handle of `lib`; `stream` the token a forward must run on."""

    def __init__(self, lib, handle, cuda_index=None):
        self.lib = lib
        self.handle = handle
        self.cuda_index = cuda_index
        stream = c_void_p()
        lib.check(lib.c.sdalloc_stream_device_compute_stream(handle, ctypes.byref(stream)))
        self.stream = stream.value or 0

    def current_stream(self):
        """The stream the caller's work goes to now (checked at each forward)."""
        if self.cuda_index is None:
            return self.stream
        import torch  # pylint: disable=import-outside-toplevel
        return torch.cuda.current_stream(self.cuda_index).cuda_stream

    def synchronize(self):
        self.lib.check(self.lib.c.sdalloc_stream_device_synchronize(self.handle))

    def close(self):
        if self.handle is not None:
            self.lib.c.sdalloc_stream_device_destroy(self.handle)
            self.handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # pylint: disable=broad-except
            pass


class SimulatedDevice(StreamDevice):
    """The simulated device (sdalloc/transfer/simulated_device.hpp): pass it as
    sdalloc.torch.offload(..., device=sim) and launch kernels with launch(); host_seconds()
    reads its clock. With host_compute the caller's thread computes on "device" memory."""

    def __init__(self, copy_bytes_per_second=0.0, seconds_per_copy=0.0, seconds_per_call=0.0,
                 host_compute=False):
        lib = library()
        config = SimDeviceConfig()
        lib.c.sdalloc_sim_device_config_init_sized(ctypes.byref(config), ctypes.sizeof(config))
        config.copy_bytes_per_second = float(copy_bytes_per_second)
        config.seconds_per_copy = float(seconds_per_copy)
        config.seconds_per_call = float(seconds_per_call)
        config.host_compute = bool(host_compute)
        handle = c_void_p()
        lib.check(lib.c.sdalloc_sim_device_create(ctypes.byref(config), ctypes.byref(handle)))
        super().__init__(lib, handle)
        self.host_compute = bool(host_compute)
        self._current = self.stream
        self._launch = lib.c.sdalloc_sim_launch

    def current_stream(self):
        return self._current

    @contextlib.contextmanager
    def on_stream(self, token):
        """Within: the caller's work goes to stream `token` (for tests of the stream check)."""
        previous, self._current = self._current, token
        try:
            yield
        finally:
            self._current = previous

    def launch(self, host_seconds, device_seconds, reads=0, expected=0, nbytes=0):
        """A kernel: host_seconds for the host, device_seconds on the compute queue; when it
        runs, `nbytes` at address `reads` are compared with those at `expected`."""
        status = self._launch(self.handle, host_seconds, device_seconds, reads or None,
                              expected or None, nbytes)
        if status:
            self.lib.check(status)

    def host_seconds(self):
        seconds = c_double()
        self.lib.check(self.lib.c.sdalloc_sim_host_seconds(self.handle, ctypes.byref(seconds)))
        return seconds.value

    def stats(self):
        out = SimDeviceStats()
        out.struct_size = ctypes.sizeof(out)
        self.lib.check(self.lib.c.sdalloc_sim_device_stats(self.handle, ctypes.byref(out)))
        return dict(_stats_dict(out, _SIM_STAT_NAMES), device_bytes=out.device_bytes,
                    locked_bytes=out.locked_bytes)


def cuda_device(index):
    """The shim's CUDA device on torch's current stream of device `index`; where CUDA is
    not usable the shim refuses, saying why, before torch.cuda is asked anything."""
    import torch  # pylint: disable=import-outside-toplevel
    lib = library(cuda=True)
    stream = torch.cuda.current_stream(index).cuda_stream if torch.cuda.is_available() else 0
    handle = c_void_p()
    lib.check(lib.c.sdalloc_torch_stream_device_create_cuda(index, c_void_p(stream or None),
                                                             ctypes.byref(handle)))
    return StreamDevice(lib, handle, cuda_index=index)


# DLPack views of device memory: the offload owns it, so the deleter only forgets the view.
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


class DeviceView:
    """A dense uint8 tensor of `nbytes` at `pointer` for torch.utils.dlpack.from_dlpack."""

    def __init__(self, pointer, nbytes, device=(KDL_CPU, 0)):
        code, bits, _ = dtype_of("uint8")
        self._device = device
        shape = (ctypes.c_int64 * 1)(nbytes)
        managed = DLManagedTensor()
        managed.dl_tensor.data = pointer
        managed.dl_tensor.device = DLDevice(*device)
        managed.dl_tensor.ndim = 1
        managed.dl_tensor.dtype = DLDataType(code, bits, 1)
        managed.dl_tensor.shape = shape
        managed.dl_tensor.strides = None
        managed.dl_tensor.byte_offset = 0
        managed.deleter = _view_deleter
        with _views_lock:
            key = _next_view[0]
            _next_view[0] += 1
            _views[key] = (managed, shape)
        managed.manager_ctx = key
        self._managed = managed

    def __dlpack_device__(self):
        return self._device

    def __dlpack__(self, stream=None, **_unused):
        # A CUDA consumer's stream needs no event: the offload orders its copies before the
        # compute stream, on which the forward runs.
        return _capsule_new(ctypes.addressof(self._managed), _DLTENSOR, None)


def bytes_tensor(torch, pointer, nbytes, cuda_index=None):
    """A uint8 tensor over `nbytes` at `pointer`: host memory, or CUDA device `cuda_index`'s."""
    device = (KDL_CPU, 0) if cuda_index is None else (KDL_CUDA, cuda_index)
    return torch.utils.dlpack.from_dlpack(DeviceView(pointer, nbytes, device))


def unit_stats(lib, handle):
    out = UnitOffloadStats()
    out.struct_size = ctypes.sizeof(out)
    lib.check(lib.c.sdalloc_unit_offload_stats(handle, ctypes.byref(out)))
    stats = _stats_dict(out, _UNIT_COUNT_NAMES + _UNIT_SIZE_NAMES + _UNIT_TIME_NAMES)
    stats.update({name: bool(getattr(out, name)) for name in _UNIT_FLAG_NAMES})
    return stats


def describe(lib, handle):
    needed = c_size_t()
    lib.check(lib.c.sdalloc_unit_offload_describe(handle, None, 0, ctypes.byref(needed)))
    text = ctypes.create_string_buffer(needed.value)
    lib.check(lib.c.sdalloc_unit_offload_describe(handle, text, needed.value, None))
    return text.value.decode()
