"""Numba External Memory Management (NBEP 7) plugin: Numba's device arrays in Kmm memory.

    NUMBA_CUDA_MEMORY_MANAGER=kmm.numba python script.py
    # or, before any CUDA allocation:
    from numba import cuda; import kmm.numba
    cuda.set_memory_manager(kmm.numba.KmmNumbaMemoryManager)

Device memory comes from one Kmm manager per Numba context (its device), created by
`initialize()` with the options of `configure(**config)`. Pinned and mapped host memory stays
Numba's (the plugin subclasses `HostOnlyCUDAMemoryManager`).
"""

import contextlib
import functools
import threading
import weakref

from numba import cuda
from numba.cuda.cudadrv import driver as _driver

from . import _args, _lib
from ._errors import InvalidHandleError, NotSupportedError, OutOfMemoryError, error
from .manager import Manager, checked_config, make_config

try:  # compiled when the wheel was built with a C compiler and Python's headers
    from . import _plugin_calls as _calls
except ImportError:
    from . import _plugin_calls_py as _calls

__all__ = ["KmmNumbaMemoryManager", "configure", "_numba_memory_manager"]

_calls.bind(_lib.address_of(_lib.lib.kmm_plugin_alloc), _lib.address_of(_lib.lib.kmm_plugin_free))
_OOM = OutOfMemoryError.status
_INVALID_HANDLE = InvalidHandleError.status

if getattr(_driver, "USE_NV_BINDING", True):
    _devptr = _driver.binding.CUdeviceptr
else:  # Numba's ctypes binding
    import ctypes

    _devptr = ctypes.c_uint64

_SizeNotSet = getattr(_driver, "_SizeNotSet", None)
_config = {}


def configure(**config):
    """Options (as for `kmm.Manager`) of the managers that plugins create from now on."""
    checked_config(**config)  # a bad option raises here, not at some later allocation
    _config.clear()
    _config.update(config)


class _NumbaManager(Manager):
    """The manager a plugin allocates Numba's memory from (`KmmNumbaMemoryManager.manager`)."""

    def __init__(self, plugin, **config):
        super().__init__(**config)
        self._plugin = weakref.ref(plugin)
        #: the hard limit it was made with (`configure` later changes only managers made later)
        self.hard_limit = make_config(**config).hard_limit

    def close(self, force=False):
        """As `Manager.close`, refused (`kmm.BufferMappedError`, nothing changed) while the
        manager holds live buffers: Numba's device arrays (or ones `defer_cleanup` holds back),
        and Kmm buffers made on it directly. Closing would free that memory under them, and a
        new manager could hand the same addresses to new arrays. Drop them first; the plugin's
        next allocation then makes a new manager. `force=True` closes all the same (as the
        plugin's `reset()` does): memory still in use is freed under its users."""
        force = _args.flag(force, "force")
        plugin = self._plugin()
        if plugin is None:
            return super().close()
        plugin._close_manager(self, force)


class KmmNumbaMemoryManager(cuda.GetIpcHandleMixin, cuda.HostOnlyCUDAMemoryManager):
    """An NBEP 7 EMM plugin allocating Numba's device memory from a Kmm pool.

    - `memalloc`: one call into libkmm (allocate and map), made from C; the `MemoryPointer` it
      returns is freed, stream-ordered, when Numba drops it (or calls its `free`), or later
      when `defer_cleanup` is active.
    - `get_memory_info`: device free memory plus what Kmm's pool holds unused; total is the
      device's (or Kmm's hard limit).
    - `get_ipc_handle`: `cuIpcGetMemHandle` of the pool chunk holding the allocation plus the
      allocation's offset in it (pool and direct modes; not on the host backend).
    - `reset`: destroys the manager, freeing all its memory (pointers still held dangle, as
      with Numba's own `reset`); the next allocation starts a fresh one.
    - Collected while Numba's arrays it served live: its manager stays until they are freed
      (destroyed at a later plugin's next manager), so their memory is never handed out under
      them.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._manager = None
        self._lock = threading.Lock()
        self._deferral = _calls.Deferral()
        fallback = functools.partial(type(self).memalloc, weakref.proxy(self))
        self._allocator = _calls.Allocator(_KmmPointer, self._deferral, fallback)
        if type(self).memalloc is KmmNumbaMemoryManager.memalloc:  # not overridden by a subclass
            self.memalloc = self._allocator.memalloc  # see memalloc below

    # -- NBEP 7 -----------------------------------------------------------------------------
    @property
    def interface_version(self):
        return 1

    @property
    def manager(self):
        """The Kmm manager serving this context (created on first use, and again after it was
        closed)."""
        m = self._manager
        return m if m is not None and not m.closed else self._create()

    def _create(self):
        if _orphans:
            _close_finished_orphans()
        with self._lock:
            created = self._manager is None or self._manager.closed
            if created:
                config = dict(_config)
                if self.context is not None:  # the context's device, whatever configure says
                    config["device"] = self.context.device.id
                self._manager = _NumbaManager(self, **config)
                self._allocator.context = weakref.proxy(self.context) if self.context is not None else None
                self._allocator.manager = self._manager._handle
            manager = self._manager
        if created and _SizeNotSet is not None and self.deallocations.memory_capacity is _SizeNotSet:
            try:
                self.deallocations.memory_capacity = self._memory_info(manager).total
            except InvalidHandleError:  # closed on another thread meanwhile: the next one sets it
                pass
        return manager

    def initialize(self):
        """Creates the Kmm manager (once; later calls do nothing). Numba calls this at every
        `device_array`, so the created case costs one attribute test."""
        if self._manager is None:
            self._create()

    def memalloc(self, size):
        """Numba's allocation, paid at every `device_array`. So an instance's `memalloc` is its
        compiled allocator's (no Python frame), which serves allocations in one libkmm call and
        hands this method the rest: the first allocation (which creates the manager), empty
        ones, and failures (out of memory: the frees `defer_cleanup` holds back happen, then
        one retry)."""
        a = self._allocator
        size = _args.nbytes(size, "size")  # no bool (True would allocate 1 byte) or float
        if not size:  # nothing to allocate or free
            if self._manager is None or self._manager.closed:
                self._create()
            return _driver.MemoryPointer(a.context, _devptr(0), 0)
        retried_oom = False
        for _ in range(8):
            if self._manager is None or self._manager.closed or not a.manager:
                # No manager yet, or one closed, or a close in progress on another thread (it
                # detached the allocator): _create waits for the close's lock, then makes a
                # manager if the close went through.
                self._create()
                if not a.manager:
                    continue
            try:
                pointer = a.allocate(size)
            except RuntimeError:  # detached by a close between the test and the call
                continue
            status = _lib.lib.kmm_last_status() if pointer is None else 0
            if status == _INVALID_HANDLE:  # its manager was closed meanwhile: serve from the next
                continue
            if status == _OOM and not retried_oom and self._deferral.flush():
                retried_oom = True
                continue
            if pointer is None:
                raise error(status)
            return pointer
        raise error(_lib.lib.kmm_last_status())

    @contextlib.contextmanager
    def defer_cleanup(self):
        """While active, device memory dropped by Numba is not freed (Numba holds it for
        asynchronous work); the frees happen when the outermost block exits. A free of memory
        whose manager `reset()` destroyed fails harmlessly."""
        with super().defer_cleanup():
            self._deferral.enter()
            try:
                yield
            finally:
                self._deferral.exit()

    def get_memory_info(self):
        return self._memory_info(self.manager)

    def _memory_info(self, m):
        free, total = m.memory_info()
        s = m.stats("device")
        cached = s["reserved"] - s["in_use"]
        free = min(free + cached, total)
        limit = m.hard_limit
        if limit:
            total = min(total, limit)
            free = min(free, max(limit - s["in_use"], 0))
        return _driver.MemoryInfo(free=free, total=total)

    def get_ipc_handle(self, memory):
        m = self.manager
        if m.backend != "cuda":
            raise NotSupportedError(
                "IPC handles need the CUDA backend; this Kmm manager runs on the %s backend" % m.backend)
        try:
            return super().get_ipc_handle(memory)
        except Exception as e:
            raise NotSupportedError(
                "cannot export an IPC handle for Kmm memory (alloc_mode=%s; cuda_async pools are "
                "not IPC-exportable): %s" % (m.alloc_mode, e)) from e

    def reset(self):
        super().reset()
        m = self._manager
        if m is not None:
            self._close_manager(m, True)

    def _close_manager(self, m, force):
        """Closes `m`, this plugin's manager (now or before): unless `force`, only while it holds
        no live buffers."""
        with self._lock:
            if m.closed:
                return
            serving = self._manager is m
            if serving:
                # The compiled allocator now hands every allocation to `memalloc`, which waits
                # for this lock and then makes a new manager.
                self._allocator.manager = 0
            try:
                if not force:
                    m._refuse_close_while_held("the Numba plugin's manager", "Numba's device arrays, ones "
                                               "defer_cleanup holds back, or Kmm buffers made on it")
            except BaseException:
                if serving:
                    self._allocator.manager = m._handle  # as it was
                raise
            if serving:
                self._manager = None
                self._deferral.discard()
            Manager.close(m)

    def __del__(self):
        m = getattr(self, "_manager", None)
        if m is None or m.closed:
            return
        try:
            held = sum(m.stats(kind)["live_buffers"] for kind in ("device", "pinned"))
        except Exception:  # interpreter shutdown
            return
        if held:
            # Numba's pointers free themselves through the manager's handle, not this object:
            # destroyed now, their memory would be handed out again under them. Kept until they
            # are gone (looked at when a plugin makes its next manager).
            _orphans.append(m)
        else:
            m.__del__()


#: Managers of collected plugins that still held Numba's memory then.
_orphans = []


def _close_finished_orphans():
    """Destroys the managers in `_orphans` whose memory Numba has given back."""
    for m in list(_orphans):
        try:
            if not sum(m.stats(kind)["live_buffers"] for kind in ("device", "pinned")):
                _orphans.remove(m)
                Manager.close(m)
        except (InvalidHandleError, ValueError):
            pass


#: Numba's `MemoryPointer` for one Kmm allocation: freed once, by `free()` or when collected,
#: with no `weakref.finalize` (which costs more than the rest of an allocation); its
#: `device_pointer` is made when first asked for.
_KmmPointer = _calls.pointer_type(_driver.MemoryPointer, _devptr)


#: The class Numba loads for NUMBA_CUDA_MEMORY_MANAGER=kmm.numba.
_numba_memory_manager = KmmNumbaMemoryManager
