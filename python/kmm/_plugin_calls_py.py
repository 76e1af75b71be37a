"""The per-allocation calls of kmm.numba in Python (ctypes): the interface of the compiled
`kmm._plugin_calls` (see _plugin_calls.c, which says why it exists), used when that module was
not built. tests/test_plugin_calls.py runs the same checks on both."""

import ctypes
import threading

_alloc = None
_free = None
_KMM_MEMORY_DEVICE = 0


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
        for manager, buffer, stream in pending:
            _free(manager, buffer, stream)
        return len(pending)

    def discard(self):
        self._pending = []

    @property
    def pending(self):
        return len(self._pending)


class Allocation:
    """One allocation of kmm_plugin_alloc; calling it or collecting it frees it, once."""

    __slots__ = ("manager", "buffer", "address", "stream", "alive", "deferral")

    def __init__(self, manager, buffer, address, stream, deferral):
        self.manager, self.buffer, self.address, self.stream = manager, buffer, address, stream
        self.deferral = deferral
        self.alive = True

    def __call__(self):
        if self.alive:
            self.alive = False
            d = self.deferral
            if d is not None and d.depth > 0:
                with d._lock:  # flush() swaps the list under it
                    if d.depth > 0:
                        d._pending.append((self.manager, self.buffer, self.stream))
                        return
            _free(self.manager, self.buffer, self.stream)

    __del__ = __call__


def allocate(manager, nbytes, stream, deferral):
    """An `Allocation` of device memory, or None when libkmm failed (kmm_last_status says why)."""
    if _alloc is None:
        raise RuntimeError("kmm._plugin_calls_py: bind() was not called")
    buffer, address = ctypes.c_uint64(), ctypes.c_uint64()
    if _alloc(manager, nbytes, _KMM_MEMORY_DEVICE, stream, buffer, address):
        return None
    return Allocation(manager, buffer.value, address.value, stream, deferral)
