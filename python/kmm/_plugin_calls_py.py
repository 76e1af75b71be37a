"""The per-allocation calls of kmm.numba in Python (ctypes): the interface of the compiled
`kmm._plugin_calls` (see _plugin_calls.c, which says why it exists), used when that module was
not built. tests/test_plugin_calls.py runs the same checks on both."""

import ctypes
import threading

from ._lib import KMM_MEMORY_DEVICE

_alloc = None
_free = None
#: Numba allocates without a stream: its memory is for the legacy default stream.
_NUMBA_STREAM = 0


def bind(alloc_address, free_address):
    """The addresses of libkmm's `kmm_plugin_alloc` and `kmm_plugin_free`."""
    global _alloc, _free
    if not alloc_address or not free_address:
        raise ValueError("bind: the function addresses must not be 0")
    u32, u64, out = ctypes.c_uint32, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)
    _alloc = ctypes.CFUNCTYPE(u32, u64, u64, u32, u64, out, out)(alloc_address)
    _free = ctypes.CFUNCTYPE(u32, u64, u64, u64)(free_address)


class Deferral:
    """Holds back the frees of its allocations between enter() and the last exit()."""

    __slots__ = ("depth", "_pending", "_lock")

    def __init__(self):
        self.depth = 0
        self._pending = []
        self._lock = threading.Lock()  # the compiled module has the GIL for this

    def enter(self):
        with self._lock:
            self.depth += 1

    def exit(self):
        with self._lock:
            if self.depth == 0:
                raise RuntimeError("Deferral.exit() without a matching enter()")
            self.depth -= 1
            if self.depth:
                return
        self.flush()

    def flush(self):
        with self._lock:
            pending, self._pending = self._pending, []
        for manager, buffer in pending:
            _free(manager, buffer, _NUMBA_STREAM)
        return len(pending)

    def discard(self):
        self._pending = []

    @property
    def pending(self):
        return len(self._pending)


def _free_once(pointer):
    """Frees `pointer`'s buffer, once: into its Deferral while that defers, else now."""
    if not pointer.alive:
        return
    pointer.alive = False
    d = pointer._kmm_deferral
    if d is not None and d.depth > 0:
        with d._lock:  # flush() swaps the list under it
            if d.depth > 0:
                d._pending.append((pointer._kmm_manager, pointer._kmm_buffer))
                return
    _free(pointer._kmm_manager, pointer._kmm_buffer, _NUMBA_STREAM)


def pointer_type(base, device_pointer_factory):
    """KmmPointer, a subclass of `base` (Numba's MemoryPointer) whose device_pointer is
    device_pointer_factory(address), made on first use."""

    class KmmPointer(base):
        """Numba's MemoryPointer for one Kmm allocation; freed once, by free() or when collected."""

        is_managed = True
        _owner = None
        _device_pointer_factory = staticmethod(device_pointer_factory)

        def __init__(self, context, manager, buffer, address, size, deferral):
            self.context = context
            self.refct = 1
            self._kmm_manager, self._kmm_buffer, self._kmm_deferral = manager, buffer, deferral
            self._kmm_device_pointer = None
            self.address = address
            self.size = self._cuda_memsize_ = size
            self.alive = True

        @property
        def device_pointer(self):
            if self._kmm_device_pointer is None:
                self._kmm_device_pointer = self._device_pointer_factory(self.address)
            return self._kmm_device_pointer

        handle = device_pointer

        def free(self):
            if not self.alive:
                raise RuntimeError("Freeing dead memory")  # Numba's message
            _free_once(self)

        __del__ = _free_once

    return KmmPointer


class Allocator:
    """Allocator(pointer_type, deferral, fallback): a Numba plugin's memalloc."""

    __slots__ = ("manager", "context", "pointer_type", "deferral", "fallback")

    def __init__(self, pointer_type, deferral, fallback):
        if _alloc is None:
            raise RuntimeError("Allocator: kmm._plugin_calls_py.bind() was not called")
        if not (isinstance(pointer_type, type) and hasattr(pointer_type, "_device_pointer_factory")):
            raise TypeError("Allocator: pointer_type must come from pointer_type()")
        if deferral is not None and not isinstance(deferral, Deferral):
            raise TypeError("Allocator: deferral must be a kmm._plugin_calls_py.Deferral or None")
        if not callable(fallback):
            raise TypeError("Allocator: fallback must be callable")
        self.manager, self.context = 0, None
        self.pointer_type, self.deferral, self.fallback = pointer_type, deferral, fallback

    def memalloc(self, size):
        """A KmmPointer of size bytes, or what fallback(size) returns when this cannot serve it
        (no manager, an empty or unusual size, libkmm failed)."""
        if self.manager and type(size) is int and size > 0:
            pointer = self.allocate(size)
            if pointer is not None:
                return pointer
        return self.fallback(size)

    def allocate(self, size):
        """A KmmPointer of size (>= 1) bytes, or None when libkmm failed (kmm_last_status says why)."""
        # Read once: the call releases the GIL, and a close() on another thread may change it
        # meanwhile (the pointer must name the manager that made the buffer, or it cannot free it).
        manager, context = self.manager, self.context
        if not manager:
            raise RuntimeError("Allocator.allocate: manager is 0 (no Kmm manager yet)")
        if not isinstance(size, int) or not 0 < size < 1 << 64:
            raise ValueError("size must be an int in [1, 2**64), got %r" % (size,))
        buffer, address = ctypes.c_uint64(), ctypes.c_uint64()
        if _alloc(manager, size, KMM_MEMORY_DEVICE, _NUMBA_STREAM, buffer, address):
            return None
        return self.pointer_type(context, manager, buffer.value, address.value, size, self.deferral)
