"""CuPy allocators backed by Kmm.

    import cupy, kmm.cupy
    cupy.cuda.set_allocator(kmm.cupy.allocator)
    cupy.cuda.set_pinned_memory_allocator(kmm.cupy.pinned_allocator)

Device memory comes from one Kmm manager per CUDA device (`manager(device)`, created on first
use with the options of `configure(**config)`), stream-ordered on CuPy's current stream: an
allocation is ready for work on that stream, and its free is ordered after the work queued on
that stream when CuPy drops it. Out of memory raises `cupy.cuda.memory.OutOfMemoryError`.

Speed: `allocator` is a C function of `kmm._plugin_calls` (see _cupy_calls.c): it reads CuPy's
current device and stream through CuPy's own C functions, allocates with one libkmm call by
buffer handle, and returns a `MemoryPointer` to a `kmm._plugin_calls.CupyAllocation`, a
subclass of CuPy's `UnownedMemory` that frees the buffer when CuPy drops it. No Python runs between CuPy and Kmm.
Where that module was not built, `allocator` hands CuPy a `CFunctionAllocator` over libkmm's
`kmm_cupy_malloc` and `kmm_cupy_free` (freed by address) instead. Either way only what the fast
path does not serve takes the Python path: the first allocation on a device or one after its
manager was closed (a manager is made), out of memory and a size that is not an integer in
[0, 2**64) (raised). CuPy builds without those C functions use the Python path throughout.
"""

import atexit
import ctypes
import threading

import cupy

from . import _args, _lib
from ._errors import InvalidHandleError, NotCopyable, OutOfMemoryError, check, error
from .buffer import take_slots
from .manager import Manager, checked_config, make_config

try:  # compiled when the wheel was built with a C compiler and Python's headers
    from . import _plugin_calls as _compiled
except ImportError:
    _compiled = None

__all__ = ["allocator", "pinned_allocator", "manager", "configure", "live_allocations"]

_plugin_alloc = _lib.lib.kmm_plugin_alloc
_plugin_free = _lib.lib.kmm_plugin_free
_OOM = OutOfMemoryError.status
_INVALID_HANDLE = InvalidHandleError.status
_DEVICE, _PINNED = _lib.KMM_MEMORY_DEVICE, _lib.KMM_MEMORY_PINNED

_UnownedMemory = cupy.cuda.memory.UnownedMemory
_MemoryPointer = cupy.cuda.memory.MemoryPointer
_PinnedMemoryPointer = cupy.cuda.pinned_memory.PinnedMemoryPointer
_get_current_stream = cupy.cuda.get_current_stream
_get_device_id = cupy.cuda.runtime.getDevice

_managers = {}
# Guards the tables of managers, and orders the Python path's allocations with close(): one
# never lands between close()'s count of a manager's buffers and its destroy. Reentrant: the
# allocation makes the device's manager under it.
_lock = threading.RLock()
_config = {}
_local = threading.local()


def configure(**config):
    """Options (as for `kmm.Manager`) of the managers created from now on (call before the
    first allocation)."""
    checked_config(**config)  # a bad option raises here, not at CuPy's next allocation
    _config.clear()
    _config.update(config)


class _CupyManager(Manager):
    """The manager CuPy allocates from on one device (`manager(device)`)."""

    def __init__(self, **config):
        super().__init__(**config)
        # The limits it was made with (`configure` later changes only managers made later):
        # what an out-of-memory error reports as CuPy's limit.
        c = make_config(**config)
        self.hard_limit, self.pinned_limit = c.hard_limit, c.pinned_limit

    def close(self, force=False):
        """As `Manager.close`, refused (`kmm.BufferMappedError`, nothing changed) while the
        manager holds live buffers: CuPy's arrays (or blocks a `cupy.cuda.MemoryPool` over this
        allocator caches), and Kmm buffers made on it directly. Closing would free that memory
        under them, and the next manager made for CuPy could hand the same addresses to new
        arrays. Drop them (and collect them) first; CuPy's next allocation then makes a new
        manager. `force=True` closes all the same: memory still in use is freed under its users."""
        force = _args.flag(force, "force")
        with _lock:
            if self.closed:
                return
            device = self.device
            # Out of CuPy's tables first: the compiled paths (which hold the GIL from their
            # table read through the allocation) then allocate from a new manager, and the
            # Python path waits for the lock.
            serving = _managers.get(device) is self
            if serving:
                _set_manager(device, None)
            try:
                if not force:
                    self._refuse_close_while_held("kmm.cupy's manager", "CuPy arrays, blocks a CuPy memory "
                                                  "pool caches, or Kmm buffers made on it")
            except BaseException:
                if serving:
                    _set_manager(device, self)  # as it was
                raise
            super().close()


def _set_manager(device, m):
    """Makes `m` the manager every allocator path serves `device` from (None: none; the next
    allocation makes one). Under `_lock`."""
    if m is None:
        _managers.pop(device, None)
    else:
        _managers[device] = m
    check(_lib.lib.kmm_cupy_set_manager(device, m._handle if m is not None else 0))
    if _compiled is not None:
        _compiled.cupy_set_manager(device, m._handle if m is not None else 0, m)


def manager(device=None):
    """The Kmm manager serving CuPy on `device` (default: CuPy's current device): made on first
    use, and made again after it was closed."""
    return _serving(_get_device_id() if device is None else _args.device(device))


def _serving(device):
    """`manager(device)` for a device already checked."""
    m = _managers.get(device)
    if m is None or m.closed:
        with _lock:
            m = _managers.get(device)
            if m is None or m.closed:
                config = dict(_config)
                config["device"] = device
                m = _CupyManager(**config)
                _set_manager(device, m)
    return m


class _Allocation(NotCopyable):
    """Owner of one Kmm buffer; frees it (ordered after `stream`) when CuPy drops it."""

    # stream_owner: CuPy's Stream for a stream other than CuPy's defaults (0, 1, 2), which may be
    # destroyed when collected: held until the free, which is ordered after it (see
    # _cupy_calls.c). Slots are cleared after __del__, so the stream outlives the free.
    __slots__ = ("manager", "handle", "buffer", "stream", "ptr", "size", "stream_owner")
    # Held by the class: at interpreter exit the module's globals may be gone before the last
    # allocations are dropped.
    _free = staticmethod(_plugin_free)

    def __del__(self):
        self._free(self.handle, self.buffer, self.stream)


def _oom_limit(m, kind):
    """The limit an out-of-memory error reports: the manager's own (hard_limit, pinned_limit)
    where it has one, else the device's total memory (device) or none (0, pinned)."""
    if kind == _DEVICE:
        total = m.memory_info()[1]
        limit = getattr(m, "hard_limit", 0)
        return min(total, limit) if limit else total
    return getattr(m, "pinned_limit", 0)


def _raise(status, m, nbytes, kind):
    e = error(status)
    if status == _OOM:
        total = m.stats("device" if kind == _DEVICE else "pinned")["reserved"]
        try:
            raise cupy.cuda.memory.OutOfMemoryError(nbytes, total, _oom_limit(m, kind)) from e
        except TypeError:
            raise cupy.cuda.memory.OutOfMemoryError(str(e)) from e
    raise e


def _alloc(nbytes, kind, device):
    nbytes = _args.nbytes(nbytes)
    current = _get_current_stream()
    stream = current.ptr
    slots = take_slots(_local)
    scratch, addr = slots
    with _lock:  # the call releases the GIL: a close() meanwhile would not count this buffer
        m = _serving(device)
        handle = m._handle
        status = _plugin_alloc(handle, nbytes, kind, stream, addr, addr + 8)
        buffer, ptr = scratch[0], scratch[1]
    _local.spares.append(slots)
    if status:
        _raise(status, m, nbytes, kind)
    a = _Allocation()
    a.manager = m  # keeps the manager (and its handle) alive
    a.handle = handle
    a.buffer = buffer
    a.ptr = ptr
    a.size = nbytes
    a.stream = stream
    a.stream_owner = current if stream > 2 else None
    return a


def _allocate_in_python(nbytes, status=0):
    """The allocator's Python path: creates the device's manager if needed; raises on failure.
    `status` is the compiled path's failure, if it tried: out of memory is raised at once (the
    manager climbed its whole ladder already); a closed manager is replaced."""
    device = _get_device_id()
    m = _managers.get(device)
    if status and status != _INVALID_HANDLE and m is not None and not m.closed:
        _raise(status, m, nbytes, _DEVICE)
    a = _alloc(nbytes, _DEVICE, device)
    return _MemoryPointer(_UnownedMemory(a.ptr, nbytes, a, device), 0)


def _clear_managers():
    """Forgets every device's manager (tests)."""
    with _lock:
        _managers.clear()
        if _compiled is not None:
            _compiled.cupy_clear_managers()


def _capsule_function(module, name, signature):
    """The address of the C function `module` exports as `name` (Cython's `__pyx_capi__`), or
    None when it is missing or its signature is not `signature`."""
    capsule = getattr(module, "__pyx_capi__", {}).get(name)
    if capsule is None:
        return None
    # Own prototypes, so ctypes.pythonapi's shared function objects keep their settings.
    api = ctypes.pythonapi
    capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", api))
    capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", api))
    found = capsule_name(capsule)
    return capsule_pointer(capsule, found) if found == signature else None


def _stream_object():
    """CuPy's current Stream (`_get_current_stream` looked up at each call: tests replace it)."""
    return _get_current_stream()


def _compiled_allocator(stream_source=None, device_source=None, fallback=None, stream_object=None):
    """`kmm._plugin_calls.cupy_allocate` bound to CuPy's current stream and device (or, for tests,
    the C functions at the addresses given, and another fallback), or None where that module was
    not built or this CuPy does not export those functions with the expected signatures."""
    if _compiled is None:
        return None
    stream_source = stream_source or _capsule_function(cupy.cuda.stream, "get_current_stream_ptr", b"intptr_t (void)")
    device_source = device_source or _capsule_function(cupy.cuda.device, "get_device_id", b"int (int __pyx_skip_dispatch)")
    if not stream_source or not device_source:
        return None
    _compiled.bind(_lib.address_of(_plugin_alloc), _lib.address_of(_plugin_free))
    try:
        _compiled.cupy_bind(stream_source, device_source, _UnownedMemory, _MemoryPointer,
                            fallback or _allocate_in_python, stream_object or _stream_object)
    except TypeError:  # a CuPy whose UnownedMemory cannot be subclassed: the C-function path
        return None
    return _compiled.cupy_allocate


def _c_function_allocator():
    """`CFunctionAllocator.malloc` over kmm_cupy_malloc/kmm_cupy_free, or None when this CuPy
    does not export `get_current_stream_ptr` with the expected signature."""
    source = _capsule_function(cupy.cuda.stream, "get_current_stream_ptr", b"intptr_t (void)")
    c_allocator = getattr(cupy.cuda.memory, "CFunctionAllocator", None)
    if source is None or c_allocator is None:
        return None
    address = _lib.address_of
    check(_lib.lib.kmm_cupy_set_stream_source(source, address(ctypes.pythonapi.PyErr_Clear)))
    malloc, free = address(_lib.lib.kmm_cupy_malloc), address(_lib.lib.kmm_cupy_free)
    return c_allocator(0, malloc, free, _lib.lib).malloc


_c_malloc = _c_function_allocator()


def _uncompiled_allocator(nbytes):
    """`allocator` where `kmm._plugin_calls` was not built: CuPy's `CFunctionAllocator` over
    `kmm_cupy_malloc`, or the Python path."""
    if _c_malloc is not None:
        mp = _c_malloc(nbytes)
        if mp.ptr or not nbytes:
            return mp
    return _allocate_in_python(nbytes)


#: For `cupy.cuda.set_allocator`: `allocator(nbytes)` is `nbytes` of device memory on CuPy's
#: current device and stream, as a `cupy.cuda.MemoryPointer`.
allocator = _compiled_allocator() or _uncompiled_allocator
if _compiled is not None:
    # The compiled allocator holds the managers, and (through its Python fallback) this module's
    # globals: it lets them go at exit, so that the managers' teardown runs.
    atexit.register(_compiled.cupy_release)


def live_allocations():
    """How many allocations of the fast paths (`allocator`'s C function, `kmm_cupy_malloc`) are
    live."""
    out = ctypes.c_uint64()
    check(_lib.lib.kmm_cupy_live_allocations(ctypes.byref(out)))
    return out.value + (_compiled.cupy_live() if _compiled is not None else 0)


def pinned_allocator(nbytes):
    """For `cupy.cuda.set_pinned_memory_allocator`: `nbytes` of page-locked host memory from
    Kmm's pinned pool, as a `cupy.cuda.PinnedMemoryPointer`. Its free is ordered after the
    work queued on CuPy's current stream of the allocation (pinned frees always wait for it)."""
    a = _alloc(nbytes, _PINNED, _get_device_id())
    return _PinnedMemoryPointer(a, 0)
