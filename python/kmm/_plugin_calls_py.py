"""The per-allocation calls of kmm.numba in Python (ctypes): the interface of the compiled
`kmm._plugin_calls` (see _plugin_calls.c, which says why it exists), used when that module was
not built. tests/test_plugin_calls.py runs the same checks on both."""

import ctypes
import threading

_malloc = None
_free = None


def bind(malloc_address, free_address):
    """The addresses of libkmm's `kmm_plugin_malloc` and `kmm_plugin_free_address`."""
    global _malloc, _free
    if not malloc_address or not free_address:
        raise ValueError("bind: the function addresses must not be 0")
    u64 = ctypes.c_uint64
    _malloc = ctypes.CFUNCTYPE(u64, u64, u64, u64)(malloc_address)
    _free = ctypes.CFUNCTYPE(ctypes.c_uint32, u64, u64, u64)(free_address)


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
        for manager, address, stream in pending:
            _free(manager, address, stream)
        return len(pending)

    def discard(self):
        self._pending = []

    @property
    def pending(self):
        return len(self._pending)


class Allocation:
    """One allocation of kmm_plugin_malloc; calling it or collecting it frees it, once."""

    __slots__ = ("manager", "address", "stream", "alive", "deferral")

    def __init__(self, manager, address, stream, deferral):
        self.manager, self.address, self.stream, self.deferral = manager, address, stream, deferral
        self.alive = True

    def __call__(self):
        if self.alive:
            self.alive = False
            d = self.deferral
            if d is not None and d.depth > 0:
                d._pending.append((self.manager, self.address, self.stream))
            else:
                _free(self.manager, self.address, self.stream)

    __del__ = __call__


def allocate(manager, nbytes, stream, deferral):
    """An `Allocation`, or None when libkmm failed (kmm_last_status says why)."""
    if _malloc is None:
        raise RuntimeError("kmm._plugin_calls_py: bind() was not called")
    address = _malloc(manager, nbytes, stream)
    return Allocation(manager, address, stream, deferral) if address else None
