"""`kmm.Buffer`: one handle-backed allocation of device or pinned memory."""

import ctypes

import numpy as np

from . import _lib
from ._errors import InvalidHandleError, check

_lib_ = _lib.lib
KINDS = {"device": _lib.KMM_MEMORY_DEVICE, "pinned": _lib.KMM_MEMORY_PINNED}
KIND_NAMES = {v: k for k, v in KINDS.items()}
_plugin_alloc = _lib_.kmm_plugin_alloc
_buffer_free = _lib_.kmm_buffer_free
FORCE = _lib.KMM_FREE_FORCE


def _scratch(manager):
    """Two uint64 out-slots per manager and thread, reused by every allocation."""
    local = manager._local
    s = getattr(local, "scratch", None)
    if s is None:
        s = local.scratch = (ctypes.c_uint64 * 2)()
        local.addr = ctypes.addressof(s)
    return s, local.addr


def host_address(obj, writable):
    """(address, nbytes, keepalive) of a C-contiguous object with the buffer protocol."""
    if isinstance(obj, np.ndarray):
        a = obj
    else:
        a = np.asarray(memoryview(obj))
    if not a.flags.c_contiguous:
        raise ValueError("host memory must be C-contiguous (got strides %s)" % (a.strides,))
    if writable and not a.flags.writeable:
        raise ValueError("the destination is read-only")
    return a.ctypes.data, a.nbytes, a


class Buffer:
    """Device ("device") or page-locked host ("pinned") memory of a `Manager`.

    The buffer stays mapped (its address valid) for its whole life. It is freed, stream-ordered
    and without blocking, by `close()` or on garbage collection. It exports
    `__cuda_array_interface__` and DLPack as a 1-D uint8 array; `DeviceArray` adds shape and dtype."""

    __slots__ = ("_manager", "_handle", "_ptr", "nbytes", "_kind", "__weakref__")

    @classmethod
    def _alloc(cls, manager, nbytes, kind):
        scratch, addr = _scratch(manager)
        status = _plugin_alloc(manager._live(), nbytes, kind, manager._stream, addr, addr + 8)
        if status:
            check(status)
        self = cls.__new__(cls)
        self._manager = manager
        self._handle = scratch[0]
        self._ptr = scratch[1]
        self.nbytes = nbytes
        self._kind = kind
        return self

    # -- properties -----------------------------------------------------------------------
    @property
    def manager(self):
        return self._manager

    @property
    def handle(self):
        """The raw KmmBuffer handle (0 once closed)."""
        return self._handle

    @property
    def kind(self):
        """"device" or "pinned"."""
        return KIND_NAMES[self._kind]

    @property
    def ptr(self):
        """The address: a device pointer (host pointer for pinned memory and on the host backend)."""
        self._live()
        return self._ptr

    @property
    def closed(self):
        return self._handle == 0

    def __len__(self):
        return self.nbytes

    def _live(self):
        if not self._handle:
            raise InvalidHandleError("the buffer is closed")
        return self._handle

    def record_stream(self, stream):
        """Records that work on the raw `stream` may use this buffer's memory (as PyTorch's
        `Tensor.record_stream`): freeing, moving or trimming the memory waits for the work queued
        on that stream up to the free. Record every stream a consumer of `ptr` (CAI, Numba, CuPy
        kernels) uses other than the manager's; the stream must stay alive until the buffer is
        freed. DLPack exports record the consumer's stream themselves."""
        check(_lib_.kmm_buffer_record_stream(self._manager._live(), self._live(), int(stream)))

    def info(self):
        """{"bytes", "kind", "pins"} as libkmm reports them."""
        i = _lib.KmmBufferInfo()
        check(_lib_.kmm_buffer_info(self._manager._live(), self._live(), ctypes.byref(i)))
        return {"bytes": i.bytes, "kind": KIND_NAMES[i.kind], "pins": i.pins}

    # -- copies ---------------------------------------------------------------------------
    def _range(self, offset, nbytes):
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise IndexError("bytes %d..%d are outside the buffer of %d bytes" % (offset, offset + nbytes, self.nbytes))

    def copy_from_host(self, src, offset=0):
        """Copies a host object with the buffer protocol (NumPy array, bytes, ...) into the
        buffer at byte `offset`; returns when done."""
        addr, n, keep = host_address(src, writable=False)
        self._range(offset, n)
        check(_lib_.kmm_copy_to_device(self._manager._live(), self._live(), offset, addr, n))
        del keep
        return self

    def copy_to_host(self, dst=None, offset=0, nbytes=None):
        """Copies the buffer (from byte `offset`) into a writable host object `dst` (its size
        decides how much), or into a new bytearray of `nbytes` (default: the rest); returns it."""
        if dst is None:
            dst = bytearray(self.nbytes - offset if nbytes is None else nbytes)
        addr, n, keep = host_address(dst, writable=True)
        self._range(offset, n)
        check(_lib_.kmm_copy_to_host(self._manager._live(), addr, self._live(), offset, n))
        del keep
        return dst

    def copy_from(self, src, dst_offset=0, src_offset=0, nbytes=None):
        """Stream-ordered copy from another Buffer (of this or another manager of the same backend)."""
        if nbytes is None:
            nbytes = min(self.nbytes - dst_offset, src.nbytes - src_offset)
        check(_lib_.kmm_copy_buffer(self._manager._live(), self._live(), dst_offset,
                                    src._manager._live(), src._live(), src_offset, nbytes))
        return self

    def fill(self, pattern, offset=0, nbytes=None):
        """Fills bytes with repeats of `pattern` (bytes, 1 to 4096 long). Stream-ordered."""
        pattern = bytes(pattern)
        if nbytes is None:
            nbytes = self.nbytes - offset
        check(_lib_.kmm_fill(self._manager._live(), self._live(), offset, nbytes, pattern, len(pattern)))
        return self

    def host_view(self):
        """A writable memoryview of pinned memory (or of any memory on the host backend)."""
        if self._kind != _lib.KMM_MEMORY_PINNED and self._manager.backend != "host":
            raise TypeError("only pinned buffers (or buffers of the host backend) are host-addressable")
        self._live()
        if self.nbytes == 0:
            return memoryview(bytearray())
        return memoryview((ctypes.c_ubyte * self.nbytes).from_address(self._ptr)).cast("B")

    def ipc_handle(self):
        """(handle, offset): the 64-byte CUDA IPC handle of the device allocation holding this
        buffer and the buffer's offset in it. Another process opens the handle
        (`cuIpcOpenMemHandle`, e.g. `cupy.cuda.runtime.ipcOpenMemHandle`) and adds the offset.
        CUDA backend, device memory only (`kmm.NotSupportedError` on the host backend)."""
        out = (ctypes.c_uint8 * _lib.KMM_IPC_HANDLE_BYTES)()
        offset = ctypes.c_uint64()
        check(_lib_.kmm_buffer_ipc_handle(self._manager._live(), self._live(), out, ctypes.byref(offset)))
        return bytes(out), offset.value

    # -- exchange -------------------------------------------------------------------------
    def as_array(self, shape=None, dtype="uint8", strides=None, offset=0):
        """A `DeviceArray` view of this buffer."""
        from .array import DeviceArray

        dtype = np.dtype(dtype)
        if shape is None:
            shape = ((self.nbytes - offset) // dtype.itemsize,)
        return DeviceArray(self, shape, dtype, strides=strides, offset=offset)

    @property
    def __cuda_array_interface__(self):
        return self.as_array().__cuda_array_interface__

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return self.as_array().__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self):
        from .dlpack import device_of

        return device_of(self)

    # -- lifetime -------------------------------------------------------------------------
    def close(self):
        """Frees the buffer (stream-ordered, non-blocking). Idempotent. Arrays and exports that
        still point at it must not be used afterwards."""
        h, self._handle = self._handle, 0
        if h and self._manager._handle:
            check(_buffer_free(self._manager._handle, h, FORCE))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        h = getattr(self, "_handle", 0)
        if h:
            self._handle = 0
            try:
                m = self._manager._handle
                if m:
                    _buffer_free(m, h, FORCE)
            except Exception:  # interpreter shutdown
                pass

    def __repr__(self):
        if not self._handle:
            return "<kmm.Buffer closed>"
        return "<kmm.Buffer %s %d bytes at %#x>" % (self.kind, self.nbytes, self._ptr)


class _Imported(Buffer):
    """A buffer wrapping (borrowing) memory of another library; keeps its owner alive."""

    __slots__ = ("_owner",)

    @classmethod
    def _wrap(cls, manager, ptr, nbytes, kind, owner):
        out = ctypes.c_uint64()
        check(_lib_.kmm_buffer_wrap(manager._live(), ptr, nbytes, kind, _lib.KMM_BORROW, ctypes.byref(out)))
        self = cls.__new__(cls)
        self._manager = manager
        self._handle = out.value
        self._ptr = ptr
        self.nbytes = nbytes
        self._kind = kind
        self._owner = owner
        return self
