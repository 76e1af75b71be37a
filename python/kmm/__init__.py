"""Kmm: GPU memory manager for quantitative MRI, from Python.

    import kmm
    mgr = kmm.Manager(device=0)                # backend="host" runs without a GPU
    buf = mgr.alloc(1 << 20)                   # a Buffer of device memory
    a = mgr.asarray(numpy_array)               # a DeviceArray (shape, dtype, strides)
    a.__cuda_array_interface__, a.__dlpack__() # zero-copy exchange with CuPy, PyTorch, Numba, JAX
    mgr.stats(); print(mgr.summary())

Plugins: `kmm.numba` (NBEP 7 EMM plugin), `kmm.cupy` (set_allocator), `kmm.torch`
(CUDAPluggableAllocator). They are imported on demand, never by `import kmm`.
"""

from . import _lib
from ._errors import (
    BackendError,
    BackendUnavailableError,
    BufferMappedError,
    CompileError,
    InternalError,
    InvalidArgumentError,
    InvalidHandleError,
    KmmError,
    NotSupportedError,
    NullPointerError,
    OutOfMemoryError,
    OutOfRangeError,
    SizeOverflowError,
    WrongKindError,
)
from .array import DeviceArray, from_cuda_array_interface, from_dlpack
from .buffer import Buffer
from .manager import Manager, default_manager

__all__ = [
    "Manager", "Buffer", "DeviceArray", "default_manager", "empty", "zeros", "asarray",
    "from_dlpack", "from_cuda_array_interface", "status_name",
    "KmmError", "NullPointerError", "InvalidArgumentError", "OutOfRangeError", "SizeOverflowError",
    "InvalidHandleError", "BufferMappedError", "WrongKindError", "OutOfMemoryError",
    "BackendUnavailableError", "BackendError", "NotSupportedError", "CompileError", "InternalError",
]

__version__ = _lib.lib.kmm_version().decode()
library_path = _lib.path
ABI_VERSION = _lib.ABI_VERSION


def status_name(status):
    """The name of a status code ("KMM_ERROR_OUT_OF_MEMORY")."""
    return _lib.lib.kmm_status_name(int(status)).decode()


def empty(shape, dtype="float32", manager=None, kind="device"):
    return DeviceArray.empty(shape, dtype, manager, kind)


def zeros(shape, dtype="float32", manager=None, kind="device"):
    return DeviceArray.zeros(shape, dtype, manager, kind)


def asarray(host, manager=None, kind="device"):
    """A DeviceArray copy of a host array, or a zero-copy view of a device array (CAI/DLPack)."""
    if isinstance(host, DeviceArray):
        return host
    if hasattr(host, "__cuda_array_interface__"):
        return DeviceArray.from_cuda_array_interface(host, manager)
    return DeviceArray.from_host(host, manager, kind)
