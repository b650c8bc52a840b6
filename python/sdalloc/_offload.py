"""Weight offload for a torch module: sdalloc's unit offloader (sdalloc_transfer.h, "unit
offload"; docs/transfer.md).

    off = sdalloc.torch.offload(model, budget=512 << 20, device="cuda")
    with torch.no_grad():
        for t in timesteps:
            latents = model(latents, t)       # one step: weights streamed under the budget
    off.stats()["predicted_step_seconds"], off.describe()
    off.remove()                              # parameters host tensors again, hooks off

What offload() does:
  - cuts the module into units (_offload_units.py: blocks or sub-blocks of at most
    unit_bytes, one copy each) and packs every parameter into one host arena, unit after
    unit: the parameters' own storage is freed, so the model is in RAM once (the arena is
    page-locked in place, in the background);
  - the device gets one region of at most `budget` bytes, for good: the resident units and
    a ring of fixed slots for the streamed ones; every parameter is a view into it (on the
    device, or, before the plan, into the region's start where the recorded step loads
    each unit on demand);
  - one forward pre-hook per unit makes one C call (enter) - after the first step, only the
    streamed units keep theirs - and the root's hooks begin and end the step. The first
    step is recorded and planned; from the second on the C side issues the copies with
    events only: the host never waits, nothing is allocated.
A forward must run on the stream the offload was made for (torch's current stream at
offload(); refused naming both otherwise); a module whose parameters were replaced or
re-pointed after offload() is refused at its next forward (call remove() and offload()
again). For inference: the views go around autograd.

device None or "cpu": the simulated device of libsdalloc.so in host-compute mode (torch on
the CPU reads the "device" memory; copy_bytes_per_second gives its copies a speed).
A SimulatedDevice (sdalloc.torch.SimulatedDevice): that device, e.g. one whose compute
queue runs simulated kernels (tests and benchmarks of the real hook path). "cuda[:N]", an
int or a torch.device: the CUDA device of libsdalloc_torch.so; module buffers move to it
(back on remove()), the inputs must be on it. Where CUDA is not usable offload() raises
SdallocError (INVALID_ARGUMENT) saying why.
"""

import ctypes
import math
import numbers
from ctypes import c_int, c_size_t, c_uint64, c_void_p

from . import _native
from . import _offload_device as dev
from ._offload_units import DEFAULT_RESIDENT_BELOW, DEFAULT_UNIT_BYTES, partition


def _target(torch, device):
    """("sim", SimulatedDevice), ("cpu", None) or ("cuda", index)."""
    if isinstance(device, dev.SimulatedDevice):
        return "sim", device
    if device is None:
        return "cpu", None
    if not isinstance(device, (str, int, torch.device)) or isinstance(device, bool):
        raise TypeError(f"sdalloc.torch.offload: device must be a str, int, torch.device or "
                        f"SimulatedDevice, not {type(device).__name__}")
    where = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if where.type == "cpu":
        return "cpu", None
    if where.type != "cuda":
        raise ValueError(f"sdalloc.torch.offload: device {str(where)!r} is neither 'cpu' nor "
                         "'cuda[:N]'")
    if where.index is not None:
        return "cuda", where.index
    # No index: torch's current device; where torch has no CUDA, device 0, which the shim
    # then refuses with the reason.
    return "cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0


def _check_arguments(budget, copy_bytes_per_second, unit_bytes, kind):
    """Python-side checks: a C size_t would silently wrap a negative number."""
    if isinstance(budget, bool) or not isinstance(budget, (numbers.Integral, numbers.Real)):
        raise TypeError(f"sdalloc.torch.offload: budget must be a number of bytes, not "
                        f"{type(budget).__name__}")
    if not math.isfinite(budget):
        raise ValueError(f"sdalloc.torch.offload: budget must be finite, not {budget}")
    if int(budget) <= 0:
        raise ValueError(f"sdalloc.torch.offload: budget must be a positive number of bytes, "
                         f"not {int(budget)}")
    if isinstance(unit_bytes, bool) or not isinstance(unit_bytes, numbers.Integral) or \
            unit_bytes <= 0:
        raise ValueError(f"sdalloc.torch.offload: unit_bytes must be a positive int, not "
                         f"{unit_bytes!r}")
    if copy_bytes_per_second < 0:
        raise ValueError("sdalloc.torch.offload: copy_bytes_per_second must be >= 0")
    if kind != "cpu" and copy_bytes_per_second:
        raise ValueError("sdalloc.torch.offload: copy_bytes_per_second is the CPU path's "
                         "simulated speed; a device copies at its own")
    return int(budget)


class Offload:
    """The units, hooks and C handles behind sdalloc.torch.offload (see the module doc)."""

    def __init__(self, module, budget, device=None, copy_bytes_per_second=0.0,
                 unit_bytes=DEFAULT_UNIT_BYTES, resident_below=DEFAULT_RESIDENT_BELOW, pin=True):
        import torch  # pylint: disable=import-outside-toplevel
        self._torch = torch
        self._handle = None
        self._device = None
        self._owns_device = False
        self._hooks, self._unit_hooks, self._buffers, self._packed = [], [], [], []
        self._in_step = False
        kind, where = _target(torch, device)
        self.budget = _check_arguments(budget, copy_bytes_per_second, unit_bytes, kind)
        # Units small enough for a ring of several under the budget; units kept resident for
        # their size only where that is a small part of it.
        self._units = partition(module, min(unit_bytes, max(1, self.budget // 4)),
                                min(resident_below, self.budget // 256))
        if not self._units:
            raise ValueError("sdalloc.torch.offload: the module has no parameters")
        for unit in self._units:
            for owner, attr, p, _ in unit.entries:
                if p.device.type != "cpu" or not p.data.is_contiguous():
                    raise ValueError(f"sdalloc.torch.offload: parameter {attr} of "
                                     f"{type(owner).__name__} is not a contiguous host tensor")
        try:
            if kind == "sim":
                self._device = where
            elif kind == "cpu":
                self._device = dev.SimulatedDevice(copy_bytes_per_second=copy_bytes_per_second,
                                                   host_compute=True)
                self._owns_device = True
            else:
                self._device = dev.cuda_device(where)
                self._owns_device = True
            self._lib = self._device.lib
            self._cuda_index = self._device.cuda_index
            self._create(pin)
            self._pack()
            if self._cuda_index is not None:
                self._move_buffers(module)
            self._hooks.append(module.register_forward_pre_hook(self._begin))
            self._hooks.append(module.register_forward_hook(self._end))
            self._relayout()
        except BaseException:
            self.remove()
            raise

    # ------------------------------------------------------------------ set-up

    def _create(self, pin):
        c = self._lib.c
        config = dev.UnitOffloadConfig()
        # This struct's size, not the library's: the library writes no more than that.
        c.sdalloc_unit_offload_config_init_sized(ctypes.byref(config), ctypes.sizeof(config))
        config.budget = self.budget
        config.pin = bool(pin)
        handle = c_void_p()
        self._lib.check(c.sdalloc_unit_offload_create(self._device.handle, ctypes.byref(config),
                                                      ctypes.byref(handle)))
        self._handle = handle
        for unit in self._units:
            uid = c_size_t()
            status = c.sdalloc_unit_offload_add_unit(handle, unit.bytes, int(unit.keep_resident),
                                                     ctypes.byref(uid))
            if status:
                message = c.sdalloc_last_error().decode()
                raise _native.SdallocError(status, f"{message} (unit {unit.name})")
        self._lib.check(c.sdalloc_unit_offload_seal(handle))

    def _image(self, function, uid, nbytes, cuda_index=None):
        pointer = c_void_p()
        self._lib.check(function(self._handle, uid, ctypes.byref(pointer)))
        return dev.bytes_tensor(self._torch, pointer.value, nbytes, cuda_index)

    def _pack(self):
        """Every parameter into the arena, unit after unit; its own storage is then freed."""
        c = self._lib.c
        for uid, unit in enumerate(self._units):
            host = self._image(c.sdalloc_unit_offload_host_image, uid, unit.bytes)
            placed = {}
            for owner, attr, p, offset in unit.entries:
                if id(p) not in placed:
                    nbytes = p.numel() * p.element_size()
                    view = host[offset:offset + nbytes].view(p.dtype).view(p.shape)
                    view.copy_(p.data)
                    placed[id(p)] = view
                    p.data = view
                self._packed.append((owner, attr, p, placed[id(p)]))
        _return_freed_memory()

    def _move_buffers(self, module):
        target = self._torch.device("cuda", self._cuda_index)
        for owner in module.modules():
            for name, buffer in owner._buffers.items():  # pylint: disable=protected-access
                if buffer is not None and buffer.device != target:
                    self._buffers.append((owner, name, buffer))
        for owner, name, buffer in self._buffers:
            owner._buffers[name] = buffer.to(target)  # pylint: disable=protected-access

    def _relayout(self):
        """Points every parameter at its unit's device image and hooks the units that need
        their call: all while a step is to be recorded, the streamed ones once planned."""
        c = self._lib.c
        version, planned = c_uint64(), c_int()
        self._lib.check(c.sdalloc_unit_offload_layout(self._handle, ctypes.byref(version),
                                                      ctypes.byref(planned)))
        self._version = version.value
        for hook in self._unit_hooks:
            hook.remove()
        self._unit_hooks = []
        enter, handle, check = c.sdalloc_unit_offload_enter, self._handle, self._lib.check
        for uid, unit in enumerate(self._units):
            image = self._image(c.sdalloc_unit_offload_device_image, uid, unit.bytes,
                                self._cuda_index)
            placed = {}
            for _, _, p, offset in unit.entries:
                if id(p) not in placed:
                    nbytes = p.numel() * p.element_size()
                    placed[id(p)] = image[offset:offset + nbytes].view(p.dtype).view(p.shape)
                    p.data = placed[id(p)]
            streamed = c_int()
            self._lib.check(c.sdalloc_unit_offload_streamed(self._handle, uid,
                                                            ctypes.byref(streamed)))
            if unit.module is not None and (not planned.value or streamed.value):
                def hook(_module, _inputs, uid=uid):
                    status = enter(handle, uid)
                    if status:
                        check(status)
                self._unit_hooks.append(unit.module.register_forward_pre_hook(hook))
        self._slots = [(owner._parameters, attr)  # pylint: disable=protected-access
                       for owner, attr, _, _ in self._packed]
        self._expected = [d[n].data_ptr() for d, n in self._slots]

    # ------------------------------------------------------------------ steps

    def _changed(self):
        """The first parameter replaced or re-pointed since offload(), or None."""
        now = [d[n].data_ptr() for d, n in self._slots]
        if now == self._expected:
            return None
        for (owner, attr, _, _), ptr, expected in zip(self._packed, now, self._expected):
            if ptr != expected:
                return f"{type(owner).__name__}.{attr}"
        return "?"

    def _begin(self, _module, _inputs):
        if self._in_step:  # the last forward raised: its step ends here
            self._end(None, None, None)
        changed = self._changed()
        if changed is not None:
            raise RuntimeError(f"sdalloc.torch.offload: parameter {changed} was replaced or "
                               "moved after offload(); call remove() and offload() again")
        stream = self._device.current_stream()
        self._lib.check(self._lib.c.sdalloc_unit_offload_begin_step(
            self._handle, c_void_p(stream or None)))
        self._in_step = True

    def _end(self, _module, _inputs, _output):
        self._in_step = False
        c = self._lib.c
        self._lib.check(c.sdalloc_unit_offload_end_step(self._handle))
        version, planned = c_uint64(), c_int()
        self._lib.check(c.sdalloc_unit_offload_layout(self._handle, ctypes.byref(version),
                                                      ctypes.byref(planned)))
        if version.value != self._version:
            self._relayout()

    # ------------------------------------------------------------------ reports, removal

    def replan(self):
        """Records and plans the next forward again: for another input shape, whose work per
        unit differs from the one the plan was made for."""
        self._lib.check(self._lib.c.sdalloc_unit_offload_record_next(self._handle))
        self._relayout()

    def stats(self):
        """The offloader's figures (sdalloc_unit_offload_stats_t's fields): steps, copies,
        units streamed and resident, bytes, the plan's predicted step, floor and ideal floor,
        the measured copy speed; hooked_units: the unit hooks installed now."""
        stats = dev.unit_stats(self._lib, self._handle)
        stats["hooked_units"] = len(self._unit_hooks)
        stats["budget"] = self.budget
        return stats

    def describe(self):
        """The plan in words: units, ring, predicted step time and the floor."""
        return dev.describe(self._lib, self._handle)

    def host_tensor(self, param):
        """`param`'s bytes in the host arena (its one copy in RAM), as a tensor; for checks."""
        for _, _, p, host_view in self._packed:
            if p is param:
                return host_view
        raise KeyError("not a parameter of this offload")

    @property
    def units(self):
        """The units: (name, bytes, keep_resident), in the module tree's order."""
        return [(u.name, u.bytes, u.keep_resident) for u in self._units]

    def remove(self):
        """Removes the hooks, makes every parameter a host tensor of its own again (and
        buffers host ones), frees the device region and the arena."""
        for hook in self._hooks + self._unit_hooks:
            hook.remove()
        self._hooks, self._unit_hooks = [], []
        if self._handle is not None and self._device is not None:
            self._device.synchronize()  # the compute queued on the region must be done
        for _, _, p, host_view in self._packed:
            p.data = host_view.clone()  # before the arena goes
        self._packed = []
        for owner, name, buffer in self._buffers:
            owner._buffers[name] = buffer  # pylint: disable=protected-access
        self._buffers = []
        if self._handle is not None:
            self._lib.c.sdalloc_unit_offload_destroy(self._handle)
            self._handle = None
        if self._owns_device and self._device is not None:
            self._device.close()
        self._device = None

    def __del__(self):
        try:
            self.remove()
        except Exception:  # pylint: disable=broad-except
            pass


def _return_freed_memory():
    """Gives the freed parameter storage back to the system (glibc keeps freed heap pages
    otherwise), so that RAM holds the model once: the arena."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
