"""`kmm.Buffer`: one handle-backed allocation of device or pinned memory."""

import ctypes
import threading

import numpy as np

from . import _args, _lib
from ._errors import InvalidHandleError, NotCopyable, OutOfMemoryError, check, error
from ._lifetime import end_export, later

_lib_ = _lib.lib
KINDS = {"device": _lib.KMM_MEMORY_DEVICE, "pinned": _lib.KMM_MEMORY_PINNED}
KIND_NAMES = {v: k for k, v in KINDS.items()}
_plugin_alloc = _lib_.kmm_plugin_alloc
_buffer_free = _lib_.kmm_buffer_free
FORCE = _lib.KMM_FREE_FORCE
#: Guards the export counts of buffers and managers (exports are rare; allocation never takes it).
# Reentrant: a collection that starts while a thread holds it may end an export (a dying
# memoryview or DLPack consumer), whose release takes it again in the same thread.
_export_lock = threading.RLock()


class _ExportToken(NotCopyable):
    """Held by an exported object (the ctypes array under a `host_view` memoryview, as its
    `_kmm_export`): ends the export when that object dies (`kmm._lifetime.end_export`)."""

    __slots__ = ("end",)

    def __init__(self, release):
        self.end = release

    def __del__(self):
        end_export(self)

    # Rearmed when a finalizer kept the exported object past a collection: the dict of each
    # object holding this token (the array's, and a copy's) gets the fresh one.
    def holding(self, referrer):
        if type(referrer) is dict and referrer.get("_kmm_export") is self:
            return lambda fresh: referrer.__setitem__("_kmm_export", fresh)
        return None

    def fresh(self):
        return _ExportToken(self.end)


def take_slots(local):
    """Two uint64 out-slots for one allocation, as (array, address), from the thread's spares in
    `local` (put them back in `local.spares` once read). Never shared by two allocations in
    flight: a collection may run a finalizer that allocates between any two bytecodes (Python
    3.12 runs it there), even between a call and the reads of its out-slots."""
    try:
        spares = local.spares
    except AttributeError:
        spares = local.spares = []
    if spares:
        return spares.pop()
    s = (ctypes.c_uint64 * 2)()
    return s, ctypes.addressof(s)


def host_address(obj, writable, name):
    """(address, nbytes, keepalive) of a C-contiguous object with the buffer protocol, named
    `name` in errors."""
    if type(obj) is np.ndarray:
        a = obj
    elif isinstance(obj, np.ndarray):
        # A subclass may override nbytes, flags, dtype or ctypes (properties): the copy would
        # then read or write past its memory. The base class's view of it says what it is.
        a = np.ndarray.view(obj, np.ndarray)
    else:
        a = _buffer_array(obj, name)
    if a.dtype.hasobject:
        # Its bytes are PyObject pointers: copying into them makes pointers out of device data
        # (a crash at the next reference count), copying out of them leaks addresses.
        raise TypeError("%s holds Python objects (dtype %s); Kmm memory holds plain data only" % (name, a.dtype))
    if not a.flags.c_contiguous:
        raise ValueError("host memory must be C-contiguous (got strides %s)" % (a.strides,))
    if writable and not a.flags.writeable:
        raise ValueError("%s is read-only" % name)
    return a.ctypes.data, a.nbytes, a


def _buffer_array(obj, name):
    """An array over the memory of a buffer-protocol object: as NumPy reads it, or, for formats
    NumPy has no dtype for (ctypes pointers, long doubles, wide chars, bit fields), its bytes
    (a copy moves bytes)."""
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError("%s = %r does not support the buffer protocol (a NumPy array, bytes, bytearray, "
                        "memoryview, ...)" % (name, type(obj).__name__)) from None
    try:
        return np.asarray(view)
    except (ValueError, TypeError, NotImplementedError):
        if "O" in view.format:
            raise TypeError("%s holds Python objects (format %r); Kmm memory holds plain data only"
                            % (name, view.format)) from None
        if not view.c_contiguous:
            raise ValueError("%s: host memory must be C-contiguous" % name) from None
        return np.frombuffer(view.cast("B"), np.uint8) if view.nbytes else np.empty(0, np.uint8)


class Buffer(NotCopyable):
    """Device ("device") or page-locked host ("pinned") memory of a `Manager`.

    The buffer stays mapped (its address valid) for its whole life. It is freed, stream-ordered
    and without blocking, by `close()` or on garbage collection: when a collection finds it in
    garbage, at the end of that collection (a finalizer of the same garbage may still use its
    memory through an export or an array), and never while an export lives. It exports
    `__cuda_array_interface__` and DLPack as a 1-D uint8 array; `DeviceArray` adds shape and dtype.

    Exports and `close()`: memoryviews from `host_view()` and DLPack capsules (and the arrays
    consumers make from them) hold the memory. `close()` (of the buffer or of its manager) while
    such exports live closes the Python object at once (its methods, `ptr` and
    `__cuda_array_interface__` raise) and frees the memory when the last export lets go. A
    `__cuda_array_interface__` consumer holds the exporting object, which garbage collection then
    never frees; an explicit `close()` is the caller's word that no consumer still uses `ptr`."""

    __slots__ = ("_manager", "_handle", "_ptr", "_nbytes", "_kind", "_exports", "_pending", "__weakref__")

    def __init__(self, *args, **kwargs):
        # Made by _alloc and _wrap only (through __new__): an empty object had none of its slots,
        # and repr, closed, ptr and close() raised AttributeError.
        raise TypeError("kmm.Buffer is not constructed directly: allocate one with Manager.alloc(nbytes, kind) "
                        "(arrays: kmm.empty, Manager.empty, Manager.asarray)")

    @classmethod
    def _alloc(cls, manager, nbytes, kind):
        local = manager._local
        slots = take_slots(local)
        scratch, addr = slots
        status = _plugin_alloc(manager._live(), nbytes, kind, manager._stream, addr, addr + 8)
        handle, ptr = scratch[0], scratch[1]
        local.spares.append(slots)
        if status:
            e = error(status)
            if isinstance(e, OutOfMemoryError):
                # The memory as the failure left it: the error shows its map in Jupyter.
                e.memory_status = manager.status()
            raise e
        self = cls.__new__(cls)
        self._manager = manager
        self._handle = handle
        self._ptr = ptr
        self._nbytes = nbytes
        self._kind = kind
        self._exports = 0
        self._pending = 0
        if manager._held:
            manager._release_passed()  # producers of freed imports whose work has run
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
    def nbytes(self):
        """The size in bytes. Read-only: every bounds check (copies, `host_view`, arrays, exports)
        trusts it."""
        return self._nbytes

    @property
    def kind(self):
        """"device" or "pinned"."""
        return KIND_NAMES[self._kind]

    @property
    def device(self):
        """The device (ordinal) of the buffer's manager: its memory's for device memory."""
        return self._manager.device

    @property
    def ptr(self):
        """The address: a device pointer (host pointer for pinned memory and on the host backend)."""
        self._live()
        return self._ptr

    @property
    def closed(self):
        """True once the buffer or its manager is closed."""
        return self._handle == 0 or self._manager.closed

    def __len__(self):
        return self.nbytes

    def _live(self):
        if not self._handle:
            raise InvalidHandleError("the buffer is closed")
        if self._manager.closed:
            raise InvalidHandleError("the buffer's manager is closed")
        return self._handle

    def _export(self):
        """Counts an export of the memory and returns the function (idempotent) that ends it; a
        `close()` meanwhile defers the free until the last export ends."""
        manager = self._manager
        with _export_lock:
            # Checked under the lock close() takes: checked before it, a close() in another
            # thread could free the memory between the check and the count, and the export
            # would then show freed memory.
            self._live()
            self._exports += 1
            manager._exports += 1
        ended = []

        def release():
            with _export_lock:
                if ended:
                    return
                ended.append(True)
                self._exports -= 1
                manager._exports -= 1
                handle = self._pending if self._exports == 0 else 0
                if handle:
                    self._pending = 0
            if handle:
                # Ended by a finalizer (the view's) while the collector runs: freed when it ends.
                fn, args = self._freeing(manager, handle)
                later(fn, *args)
            manager._end_deferred_close()

        return release

    def record_stream(self, stream):
        """Records that work on the raw `stream` may use this buffer's memory (as PyTorch's
        `Tensor.record_stream`): freeing, moving or trimming the memory waits for the work queued
        on that stream up to the free. Record every stream a consumer of `ptr` (CAI, Numba, CuPy
        kernels) uses other than the manager's; the stream must stay alive until the buffer is
        freed. DLPack exports record the consumer's stream themselves."""
        check(_lib_.kmm_buffer_record_stream(self._manager._live(), self._live(), _args.stream(stream)))

    def info(self):
        """{"bytes", "kind", "pins", "spilled", "never_spill"} as libkmm reports them."""
        i = _lib.KmmBufferInfo()
        check(_lib_.kmm_buffer_info(self._manager._live(), self._live(), ctypes.byref(i)))
        return {"bytes": i.bytes, "kind": KIND_NAMES[i.kind], "pins": i.pins,
                "spilled": bool(i.spilled), "never_spill": bool(i.never_spill)}

    @property
    def spilled(self):
        """Whether the buffer's bytes are in host memory now (spilled under device pressure,
        see the manager's `spill_limit`); its next use brings them back."""
        return self.info()["spilled"]

    def never_spill(self, never=True):
        """Keeps the buffer on the device when the manager spills (`never=False` lets it spill
        again); a spilled buffer comes back first. Mapped buffers (handed out by address to
        Numba, CuPy, PyTorch, CAI and DLPack consumers) never spill either way."""
        check(_lib_.kmm_buffer_never_spill(self._manager._live(), self._live(), _args.flag(never, "never")))
        return self

    # -- copies ---------------------------------------------------------------------------
    def _range(self, offset, nbytes, offset_name="offset", nbytes_name="nbytes"):
        """Checked (offset, nbytes) of a byte range inside the buffer."""
        offset = _args.nbytes(offset, offset_name)
        nbytes = _args.nbytes(nbytes, nbytes_name)
        if offset + nbytes > self.nbytes:
            raise IndexError("bytes %d..%d (%s, %s) are outside the buffer of %d bytes"
                             % (offset, offset + nbytes, offset_name, nbytes_name, self.nbytes))
        return offset, nbytes

    def copy_from_host(self, src, offset=0):
        """Copies a host object with the buffer protocol (NumPy array, bytes, ...) into the
        buffer at byte `offset`; returns when done. `src` must not overlap the bytes it is copied
        to (the buffer's own `host_view`; ValueError)."""
        addr, n, keep = host_address(src, writable=False, name="src")
        offset, n = self._range(offset, n)
        self._refuse_overlap(addr, offset, n, "src")
        check(_lib_.kmm_copy_to_device(self._manager._live(), self._live(), offset, addr, n))
        del keep
        return self

    def copy_to_host(self, dst=None, offset=0, nbytes=None):
        """Copies the buffer (from byte `offset`) into a writable host object `dst` (its first
        `nbytes` bytes; default: all of it), or into a new bytearray of `nbytes` (default: the
        rest); returns it. `dst` must not overlap the bytes copied (the buffer's own `host_view`;
        ValueError)."""
        offset = _args.nbytes(offset, "offset")
        if nbytes is not None:
            nbytes = _args.nbytes(nbytes, "nbytes")
        if dst is None:
            nbytes = max(self.nbytes - offset, 0) if nbytes is None else nbytes
            self._range(offset, nbytes)
            dst = bytearray(nbytes)
        addr, n, keep = host_address(dst, writable=True, name="dst")
        if nbytes is not None and nbytes != n:
            if nbytes > n:
                raise ValueError("nbytes = %d exceeds dst's %d bytes" % (nbytes, n))
            n = nbytes  # was ignored: the whole of dst was copied
        offset, n = self._range(offset, n)
        self._refuse_overlap(addr, offset, n, "dst")
        check(_lib_.kmm_copy_to_host(self._manager._live(), addr, self._live(), offset, n))
        del keep
        return dst

    def _refuse_overlap(self, addr, offset, nbytes, name):
        """ValueError where host memory `name` (at `addr`) overlaps the bytes offset..offset +
        nbytes of this buffer it is copied to or from (its own `host_view` at another range):
        a copy staged in chunks leaves neither memmove's result nor the old bytes. As copy_from
        refuses overlapping ranges of one buffer. (Device addresses never meet host ones.)"""
        start = self._ptr + offset
        if nbytes and addr < start + nbytes and start < addr + nbytes:
            raise ValueError("%s (host bytes %#x..%#x) overlaps bytes %d..%d of the buffer it is copied with "
                             "(its own host_view): copy through a separate host array"
                             % (name, addr, addr + nbytes, offset, offset + nbytes))

    def copy_from(self, src, dst_offset=0, src_offset=0, nbytes=None):
        """Stream-ordered copy from another Buffer (of this or another manager of the same backend)
        of `nbytes` at `src_offset` to `dst_offset`; by default the rest of `src` from
        `src_offset`, which must fit here (IndexError otherwise: nothing is cut short)."""
        if not isinstance(src, Buffer):
            raise TypeError("src = %r must be a kmm.Buffer" % (src,))
        dst_offset = _args.nbytes(dst_offset, "dst_offset")
        src_offset = _args.nbytes(src_offset, "src_offset")
        if nbytes is None:
            nbytes = max(src.nbytes - src_offset, 0)
        dst_offset, nbytes = self._range(dst_offset, nbytes, "dst_offset")
        src_offset, nbytes = src._range(src_offset, nbytes, "src_offset")
        check(_lib_.kmm_copy_buffer(self._manager._live(), self._live(), dst_offset,
                                    src._manager._live(), src._live(), src_offset, nbytes))
        return self

    def fill(self, pattern, offset=0, nbytes=None):
        """Fills bytes with repeats of `pattern` (bytes, 1 to 4096 long). Stream-ordered."""
        if not isinstance(pattern, (bytes, bytearray, memoryview)):
            raise TypeError("pattern = %r must be bytes (1 to 4096 of them)" % (pattern,))
        pattern = bytes(pattern)
        offset = _args.nbytes(offset, "offset")
        if nbytes is None:
            nbytes = max(self.nbytes - offset, 0)
        offset, nbytes = self._range(offset, nbytes)
        check(_lib_.kmm_fill(self._manager._live(), self._live(), offset, nbytes, pattern, len(pattern)))
        return self

    def host_view(self):
        """A writable memoryview of pinned memory (or of any memory on the host backend), made
        once the work queued on the manager's stream has run (a CPU reader reads at once, as a
        DLPack export to the CPU does): it shows what `fill`, `copy_from` and the copies wrote.
        Work queued after that is read after `manager.synchronize()`. The view holds the memory:
        a `close()` meanwhile frees it once the view (and every array made from it) is released
        or collected."""
        if self._kind != _lib.KMM_MEMORY_PINNED and self._manager.backend != "host":
            raise TypeError("only pinned buffers (or buffers of the host backend) are host-addressable")
        self._live()
        self._manager.synchronize()
        if self.nbytes == 0:
            return memoryview(bytearray())
        memory = (ctypes.c_ubyte * self.nbytes).from_address(self._ptr)
        memory._kmm_export = _ExportToken(self._export())
        return memoryview(memory).cast("B")

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

        self._live()
        dtype = _args.plain_dtype(dtype)
        offset = _args.nbytes(offset, "offset")
        if shape is None:
            shape = (max(self.nbytes - offset, 0) // dtype.itemsize,)
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
        """Frees the buffer (stream-ordered, non-blocking), or, while `host_view` memoryviews or
        DLPack exports of it live, once the last of them lets go. Idempotent. Its arrays and
        `ptr` must not be used afterwards."""
        with _export_lock:
            h, self._handle = self._handle, 0
            if h and self._exports:
                self._pending = h
                return
        if h:
            fn, args = self._freeing(self._manager, h)
            fn(*args, raising=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # An export holds the buffer, so only a garbage cycle holding both brings it here with
        # exports live: as close(), the last export's end frees it. Otherwise freed now, or, in
        # a collection, at its end (another finalizer of the garbage may still use the memory).
        h = getattr(self, "_handle", 0)
        if h:
            try:
                with _export_lock:
                    self._handle = 0
                    if self._exports:
                        self._pending = h
                        return
                fn, args = self._freeing(self._manager, h)
                later(fn, *args)
            except Exception:  # interpreter shutdown: the module's globals may be gone
                pass

    def _freeing(self, manager, handle):
        """(fn, args): the call that frees `handle` of this buffer."""
        return _free, (manager, handle)

    def __repr__(self):
        if self.closed:
            return "<kmm.Buffer closed>"
        return "<kmm.Buffer %s %d bytes at %#x>" % (self.kind, self.nbytes, self._ptr)


def _free(manager, handle, raising=False):
    """Frees a buffer's `handle` unless its manager is gone (destroyed with all its buffers).
    `raising`: a failure raises (close()), except the manager's destroy by another thread after
    its handle was read, which freed the buffer with the rest."""
    try:
        m = manager._handle
        status = _buffer_free(m, handle, FORCE) if m else 0
    except Exception:  # interpreter shutdown
        return
    if raising and status and not (status == InvalidHandleError.status and not manager._handle):
        check(status)


def _free_import(manager, handle, owner, raising=False):
    """Frees an import's buffer, then keeps its producer (`owner`) until the work queued so far on
    the manager's stream has run: the free is stream-ordered, and that work may still read or
    write the producer's memory (a DLPack deleter or a dropped producer would free it under it)."""
    try:
        _free(manager, handle, raising)
    finally:
        manager._hold_until_stream_passes(owner)


class _Imported(Buffer):
    """A buffer wrapping (borrowing) memory of another library; keeps its owner alive."""

    __slots__ = ("_owner",)

    @classmethod
    def _wrap(cls, manager, ptr, nbytes, kind, owner, name="ptr"):
        """A buffer of the `nbytes` from address `ptr` (the lowest byte an import reaches,
        named after its source, `name`, in errors)."""
        # ctypes passes a Python int to a uint64_t parameter modulo 2^64: an import reaching below
        # address 0 or past 2^64 - 1 (huge strides or byte_offset) became a small buffer at
        # another address, while every bounds check here used the true, unwrapped numbers.
        if ptr < 0 or ptr + nbytes > _args.U64_MAX + 1:
            raise BufferError("the imported memory (from %s) spans addresses %d..%d, outside 0..2^64 - 1"
                              % (name, ptr, ptr + nbytes))
        out = ctypes.c_uint64()
        check(_lib_.kmm_buffer_wrap(manager._live(), ptr, nbytes, kind, _lib.KMM_BORROW, ctypes.byref(out)))
        self = cls.__new__(cls)
        self._manager = manager
        self._handle = out.value
        self._ptr = ptr
        self._nbytes = nbytes
        self._kind = kind
        self._exports = 0
        self._pending = 0
        self._owner = owner
        manager._count_import(1)
        return self

    def _freeing(self, manager, handle):
        return _free_import, (manager, handle, self._owner)
