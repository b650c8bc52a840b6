"""Handing a host allocation of an sdalloc pool to another library through DLPack.

DLPack's C structs (dlpack.h, ABI stable since v0.6):
    DLDevice        {int32 device_type; int32 device_id}
    DLDataType      {uint8 code; uint8 bits; uint16 lanes}
    DLTensor        {void* data; DLDevice device; int32 ndim; DLDataType dtype;
                     int64* shape; int64* strides; uint64 byte_offset}
    DLManagedTensor {DLTensor dl_tensor; void* manager_ctx; void (*deleter)(DLManagedTensor*)}
A producer hands out a PyCapsule named "dltensor" holding a DLManagedTensor*; the consumer
renames it "used_dltensor" and calls `deleter` when its tensor dies. Here the deleter frees
the block back to its pool, so the memory returns to sdalloc exactly when the consumer's
tensor is garbage. An export never consumed is freed when its HostTensor dies.
"""

import ctypes
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_int, c_int32, c_int64, c_uint8,
                    c_uint16, c_uint64, c_void_p, py_object)

KDL_CPU = 1

# name -> (DLPack type code, bits): kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4.
DTYPES = {
    "float32": (2, 32), "float": (2, 32), "float16": (2, 16), "half": (2, 16),
    "bfloat16": (4, 16), "float64": (2, 64), "double": (2, 64),
    "int8": (0, 8), "int16": (0, 16), "int32": (0, 32), "int64": (0, 64), "long": (0, 64),
    "uint8": (1, 8),
}


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32),
                ("dtype", DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class DLManagedTensor(Structure):
    pass


DELETER = CFUNCTYPE(None, POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p),
                            ("deleter", DELETER)]

_DLTENSOR = b"dltensor"  # module-level: the capsule keeps a pointer to these bytes
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = py_object
_capsule_new.argtypes = [c_void_p, c_char_p, c_void_p]
_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype = c_int
_capsule_is_valid.argtypes = [py_object, c_char_p]

# Exports a consumer may still own: key -> (managed struct, shape array, pool, pointer).
_exports = {}
_exports_lock = threading.Lock()
_next_key = [1]


def dtype_of(dtype):
    """(code, bits, itemsize) for a dtype name ("float16") or object (torch.float16)."""
    name = str(dtype).rsplit(".", 1)[-1]
    if name not in DTYPES:
        raise ValueError(f"sdalloc: unsupported dtype {dtype!r} for DLPack export "
                         f"(supported: {', '.join(sorted(DTYPES))})")
    code, bits = DTYPES[name]
    return code, bits, bits // 8


def _release(key):
    with _exports_lock:
        entry = _exports.pop(key, None)
    if entry is not None:
        _, _, pool, pointer = entry
        pool.free(pointer)


@DELETER
def _deleter(managed):
    try:
        _release(managed.contents.manager_ctx)
    except Exception:  # pylint: disable=broad-except
        pass  # called from the consumer's C code: nothing may propagate (shutdown, etc.)


class HostTensor:
    """A dense host tensor in an sdalloc pool, exportable once through DLPack.

    torch.utils.dlpack.from_dlpack(t) (or numpy.from_dlpack) takes it over without a copy;
    the memory returns to the pool when the consumer's tensor is freed. If it is never
    exported, it returns to the pool when this object dies (or on close()).
    """

    def __init__(self, pool, shape, dtype="float32"):
        code, bits, itemsize = dtype_of(dtype)
        self.shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in self.shape):
            raise ValueError(f"sdalloc: negative dimension in shape {self.shape}")
        numel = 1
        for d in self.shape:
            numel *= d
        self.nbytes = numel * itemsize
        self.pool = pool
        # Zero-size tensors still get a real (512-byte) block: consumers want a non-null data.
        self.pointer = pool.malloc(max(self.nbytes, 1))
        self._capsule = None
        ndim = len(self.shape)
        shape_array = (c_int64 * max(ndim, 1))(*self.shape)
        managed = DLManagedTensor()
        managed.dl_tensor.data = self.pointer
        managed.dl_tensor.device = DLDevice(KDL_CPU, 0)
        managed.dl_tensor.ndim = ndim
        managed.dl_tensor.dtype = DLDataType(code, bits, 1)
        managed.dl_tensor.shape = shape_array
        managed.dl_tensor.strides = None  # compact row-major
        managed.dl_tensor.byte_offset = 0
        managed.deleter = _deleter
        with _exports_lock:
            key = _next_key[0]
            _next_key[0] += 1
            _exports[key] = (managed, shape_array, pool, self.pointer)
        managed.manager_ctx = key
        self._key = key
        self._managed = managed

    def __dlpack_device__(self):
        return (KDL_CPU, 0)

    def __dlpack__(self, stream=None, **_unused):
        """The capsule, once: a second export would hand the same memory to two owners."""
        if self._capsule is not None or self._key not in _exports:
            raise RuntimeError("sdalloc: this HostTensor was already exported or closed")
        self._capsule = _capsule_new(ctypes.addressof(self._managed), _DLTENSOR, None)
        return self._capsule

    def close(self):
        """Frees the memory now unless a consumer took it over."""
        consumed = self._capsule is not None and not _capsule_is_valid(self._capsule, _DLTENSOR)
        if not consumed:
            _release(self._key)

    def __del__(self):
        try:
            self.close()
        except Exception:  # pylint: disable=broad-except
            pass


def live_exports():
    """How many exported allocations a consumer still holds (for tests and leak checks)."""
    with _exports_lock:
        return len(_exports)
