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
from ._errors import check as _check
from .array import DeviceArray, _import_kind, _refuse_other_device, from_cuda_array_interface, from_dlpack
from .buffer import Buffer
from .manager import Manager, default_manager
from .manager import chosen as _chosen
from .manager import kind_code as _kind_code

__all__ = [
    "Manager", "Buffer", "DeviceArray", "default_manager", "empty", "zeros", "asarray",
    "from_dlpack", "from_cuda_array_interface", "status_name", "device_count", "can_access_peer",
    "live_managers",
    "KmmError", "NullPointerError", "InvalidArgumentError", "OutOfRangeError", "SizeOverflowError",
    "InvalidHandleError", "BufferMappedError", "WrongKindError", "OutOfMemoryError",
    "BackendUnavailableError", "BackendError", "NotSupportedError", "CompileError", "InternalError",
]

__version__ = _lib.lib.kmm_version().decode()
library_path = _lib.path
ABI_VERSION = _lib.ABI_VERSION


def status_name(status):
    """The name of a status code ("KMM_ERROR_OUT_OF_MEMORY")."""
    from ._args import U32_MAX, integer

    return _lib.lib.kmm_status_name(integer(status, "status", 0, U32_MAX)).decode()


def _backend_code(backend):
    from .manager import BACKENDS
    if not isinstance(backend, str):
        raise TypeError("backend = %r must be one of %s (got %s)" % (backend, sorted(BACKENDS), type(backend).__name__))
    if backend not in BACKENDS:
        raise InvalidArgumentError("backend must be one of %s, got %r" % (sorted(BACKENDS), backend))
    return BACKENDS[backend]


def device_count(backend="auto"):
    """How many devices `backend` ("auto", "host", "cuda") offers: the visible CUDA devices, or
    the host backend's stand-ins (KMM_HOST_DEVICES, 1 to 64, default 1). Managers exist on
    devices 0 .. device_count() - 1."""
    import ctypes
    n = ctypes.c_uint32()
    _check(_lib.lib.kmm_device_count(_backend_code(backend), ctypes.byref(n)))
    return n.value


def can_access_peer(device, peer, backend="auto"):
    """Whether copies between `device` and `peer` go peer to peer (True) or are staged through
    pinned host memory (False). Host stand-in devices pair up: 0 with 1, 2 with 3, ..."""
    import ctypes
    out = ctypes.c_uint32()
    from ._args import device as _device
    _check(_lib.lib.kmm_device_can_access_peer(_backend_code(backend), _device(device, "device"), _device(peer, "peer"),
                                               ctypes.byref(out)))
    return out.value == 1


def live_managers():
    """How many managers are alive in this process: created and not yet torn down. A closed
    manager counts until its teardown ends: while `host_view` memoryviews or DLPack exports of
    its buffers live (it is destroyed when the last one lets go), and while the deferred
    teardown of a collected one runs."""
    import ctypes
    n = ctypes.c_uint32()
    _check(_lib.lib.kmm_live_managers(ctypes.byref(n)))
    return n.value


def empty(shape, dtype="float32", manager=None, kind="device"):
    return DeviceArray.empty(shape, dtype, manager, kind)


def zeros(shape, dtype="float32", manager=None, kind="device"):
    return DeviceArray.zeros(shape, dtype, manager, kind)


def asarray(host, manager=None, kind=None):
    """A DeviceArray copy of a host array (in `kind` memory, "device" unless given), or a
    zero-copy view of a device array (CAI/DLPack). A view is of the memory it views: asked for
    another kind than that (a kmm buffer's own kind, another library's CAI object is device
    memory), asarray refuses rather than hand back the wrong kind (`asarray(x.get(), kind=...)`
    copies)."""
    want = None if kind is None else _kind_code(kind)
    if isinstance(host, DeviceArray):
        m = _chosen(manager)  # checked even where unused
        _same_kind(want, _kind_code(host.buffer.kind), kind)
        if manager is not None:
            _refuse_other_device(host, m)  # a view, never a copy to another device
        return host
    if hasattr(host, "__cuda_array_interface__"):
        _same_kind(want, _import_kind([host]), kind)  # the kind the import wraps it as
        return DeviceArray.from_cuda_array_interface(host, manager)
    return DeviceArray.from_host(host, manager, "device" if kind is None else kind)


def _same_kind(want, have, kind):
    if want is not None and want != have:
        raise ValueError(
            "kind = %r: the array is a view of %s memory, which asarray does not copy (asarray(x.get(), kind=...) does)"
            % (kind, "device" if have == _lib.KMM_MEMORY_DEVICE else "pinned")
        )
