"""The Numba EMM plugin's contract, checked without a GPU (host backend, no Numba context)."""

import gc

import pytest

try:
    import numba.cuda as numba_cuda
    from numba.cuda import HostOnlyCUDAMemoryManager, MemoryPointer  # noqa: F401 (import check)
except Exception as e:  # not installed, or numba-cuda without the CUDA runtime library
    pytest.skip("numba.cuda unavailable: %s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else ""),
                allow_module_level=True)

import kmm
import kmm.numba as kn
from conftest import BACKEND


@pytest.fixture
def plugin():
    kn.configure(backend=BACKEND)
    p = kn.KmmNumbaMemoryManager(context=None)
    p.initialize()
    yield p
    p.reset()
    kn.configure()


def test_is_an_nbep7_plugin():
    assert issubclass(kn.KmmNumbaMemoryManager, numba_cuda.HostOnlyCUDAMemoryManager)
    assert issubclass(kn.KmmNumbaMemoryManager, numba_cuda.GetIpcHandleMixin)
    assert kn._numba_memory_manager is kn.KmmNumbaMemoryManager
    p = kn.KmmNumbaMemoryManager(context=None)  # what set_memory_manager does to check the version
    assert p.interface_version == 1


def test_initialize_is_idempotent(plugin):
    m = plugin.manager
    plugin.initialize()
    assert plugin.manager is m
    assert plugin.deallocations.memory_capacity == plugin.get_memory_info().total


def test_memalloc_returns_memory_pointer(plugin):
    mem = plugin.memalloc(1 << 20)
    assert isinstance(mem, numba_cuda.MemoryPointer)
    assert mem.size == 1 << 20
    ptr = int(mem.device_pointer)
    assert ptr != 0 and ptr % 256 == 0
    s = plugin.manager.stats("device")
    assert s["in_use"] == 1 << 20 and s["live_buffers"] == 1
    del mem
    gc.collect()
    assert plugin.manager.stats("device")["live_buffers"] == 0


def test_pointer_frees_once_when_dropped_or_freed(plugin):
    stats = lambda: plugin.manager.stats("device")["live_buffers"]  # noqa: E731
    mem = plugin.memalloc(4096)
    view = mem.view(256)  # Numba's views keep their owner alive
    del mem
    assert stats() == 1
    del view  # reference counting alone frees it, as weakref.finalize would
    assert stats() == 0
    mem = plugin.memalloc(4096)
    mem.free()  # Numba's explicit free
    assert stats() == 0 and not mem.alive
    with pytest.raises(RuntimeError, match="dead memory"):
        mem.free()
    del mem
    assert plugin.manager.stats("device")["frees"] == 2


def test_memalloc_oom_raises(plugin):
    kn.configure(backend=BACKEND, hard_limit=2 << 20, chunk_size=1 << 20)
    p = kn.KmmNumbaMemoryManager(context=None)
    with pytest.raises(kmm.OutOfMemoryError):
        p.memalloc(4 << 20)
    p.reset()


def test_get_memory_info_from_kmm_stats(plugin):
    info = plugin.get_memory_info()
    assert info.free <= info.total and info.total > 0
    kn.configure(backend=BACKEND, hard_limit=64 << 20)
    p = kn.KmmNumbaMemoryManager(context=None)
    mem = p.memalloc(16 << 20)
    info = p.get_memory_info()
    assert info.total == 64 << 20
    assert info.free == (64 - 16) << 20
    del mem
    p.reset()


def test_defer_cleanup_holds_frees(plugin):
    with plugin.defer_cleanup():
        mem = plugin.memalloc(4096)
        del mem
        gc.collect()
        with plugin.defer_cleanup():  # nested
            pass
        assert plugin.manager.stats("device")["live_buffers"] == 1
    assert plugin.manager.stats("device")["live_buffers"] == 0


def test_reset_frees_everything(plugin):
    mems = [plugin.memalloc(1000) for _ in range(10)]
    old = plugin.manager
    plugin.reset()
    assert old.closed
    del mems  # finalizers on the destroyed manager are harmless
    gc.collect()
    assert plugin.manager is not old  # a fresh manager on next use
    assert plugin.manager.stats("device")["live_buffers"] == 0


def test_ipc_handle_needs_cuda(plugin):
    mem = plugin.memalloc(256)
    if plugin.manager.backend == "host":
        with pytest.raises(kmm.NotSupportedError, match="CUDA backend"):
            plugin.get_ipc_handle(mem)


def test_oom_frees_what_defer_cleanup_holds_and_retries():
    kn.configure(backend=BACKEND, hard_limit=2 << 20, chunk_size=1 << 20)
    p = kn.KmmNumbaMemoryManager(context=None)
    try:
        with p.defer_cleanup():
            mem = p.memalloc(2 << 20)
            del mem  # held back: the pool is full
            assert p.manager.stats("device")["live_buffers"] == 1
            mem = p.memalloc(2 << 20)  # out of memory, so the held free happens, then the retry
            assert p.manager.stats("device")["live_buffers"] == 1 and mem.size == 2 << 20
    finally:
        p.reset()
        kn.configure()


def test_memalloc_is_the_compiled_allocators_unless_a_subclass_overrides_it(plugin):
    assert plugin.memalloc.__self__ is plugin._allocator  # no Python frame per allocation

    class Counting(kn.KmmNumbaMemoryManager):
        calls = 0

        def memalloc(self, size):
            Counting.calls += 1
            return super().memalloc(size)

    p = Counting(context=None)
    try:
        mem = p.memalloc(4096)
        assert Counting.calls == 1 and mem.size == 4096 and mem.alive
    finally:
        p.reset()
