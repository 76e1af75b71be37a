"""The CuPy allocators' contract without a GPU: CuPy's device and stream queries are replaced."""

import gc
import os
import threading

import pytest

try:
    import cupy
except Exception as e:
    pytest.skip("cupy unavailable: %s" % type(e).__name__, allow_module_level=True)

import kmm
import kmm.cupy as kc
from conftest import BACKEND


class _Stream:
    ptr = 0


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(kc, "_get_device_id", lambda: 0)
    monkeypatch.setattr(kc, "_get_current_stream", lambda: _Stream())
    monkeypatch.setattr(kc, "_c_malloc", None)  # CuPy's C allocator asks the CUDA runtime for the device
    monkeypatch.setattr(kc, "allocator", kc._uncompiled_allocator)  # so does the compiled one
    kc.configure(backend=BACKEND, hard_limit=64 << 20)
    kc._clear_managers()
    yield kc.manager(0)
    kc._clear_managers()
    kc.configure()


def test_allocator_returns_memory_pointer(fake_cuda):
    mp = kc.allocator(1 << 20)
    assert isinstance(mp, cupy.cuda.MemoryPointer)
    assert mp.ptr != 0 and mp.mem.size == 1 << 20
    assert fake_cuda.stats("device")["in_use"] == 1 << 20
    del mp
    gc.collect()
    assert fake_cuda.stats("device")["live_buffers"] == 0


def test_oom_is_cupys_error(fake_cuda):
    with pytest.raises(cupy.cuda.memory.OutOfMemoryError) as e:
        kc.allocator(128 << 20)
    assert isinstance(e.value.__cause__, kmm.OutOfMemoryError)


def test_pinned_allocator(fake_cuda):
    p = kc.pinned_allocator(4096)
    assert isinstance(p, cupy.cuda.PinnedMemoryPointer)
    assert p.ptr != 0 and p.size() == 4096
    assert fake_cuda.stats("pinned")["in_use"] == 4096
    del p
    gc.collect()
    assert fake_cuda.stats("pinned")["live_buffers"] == 0


def test_one_manager_per_device(fake_cuda):
    assert kc.manager(0) is fake_cuda


# -- the C path: CuPy's CFunctionAllocator over kmm_cupy_malloc / kmm_cupy_free -------------------
import ctypes  # noqa: E402

from kmm import _lib  # noqa: E402

_SOURCE = ctypes.CFUNCTYPE(ctypes.c_ssize_t)
_HOOK = ctypes.CFUNCTYPE(None)


@pytest.fixture
def c_path(fake_cuda):
    """The C functions with a stream source standing in for CuPy's (which needs a GPU)."""
    state = {"stream": 0, "hook_calls": 0}
    source = _SOURCE(lambda: state["stream"])
    hook = _HOOK(lambda: state.__setitem__("hook_calls", state["hook_calls"] + 1))
    assert _lib.lib.kmm_cupy_set_stream_source(ctypes.cast(source, ctypes.c_void_p), ctypes.cast(hook, ctypes.c_void_p)) == 0
    yield fake_cuda, state
    kc._c_function_allocator()  # CuPy's own stream source again


def test_c_malloc_allocates_from_the_devices_manager_and_free_returns_it(c_path):
    m, _ = c_path
    before = kc.live_allocations()
    ptr = _lib.lib.kmm_cupy_malloc(None, 3 << 20, 0)
    assert ptr
    assert m.stats("device")["in_use"] == 3 << 20
    assert kc.live_allocations() == before + 1
    _lib.lib.kmm_cupy_free(None, ptr, 0)
    assert m.stats("device")["in_use"] == 0
    assert kc.live_allocations() == before


def test_c_malloc_failures_are_null_with_a_message(c_path):
    m, state = c_path
    assert not _lib.lib.kmm_cupy_malloc(None, 1 << 20, 7)
    assert "device = 7 has no Kmm manager" in _lib.lib.kmm_last_error().decode()
    assert not _lib.lib.kmm_cupy_malloc(None, 128 << 20, 0)  # hard limit 64 MiB
    assert "64 MiB" in _lib.lib.kmm_last_error().decode() or "67108864" in _lib.lib.kmm_last_error().decode()
    state["stream"] = -1
    assert not _lib.lib.kmm_cupy_malloc(None, 1 << 20, 0)
    assert "current stream could not be read" in _lib.lib.kmm_last_error().decode()
    assert state["hook_calls"] == 1
    assert m.stats("device")["in_use"] == 0


def test_c_free_of_an_unknown_pointer_is_ignored(c_path):
    m, _ = c_path
    ptr = _lib.lib.kmm_cupy_malloc(None, 4096, 0)
    _lib.lib.kmm_cupy_free(None, ptr + 256, 0)
    assert "was not allocated by kmm_cupy_malloc" in _lib.lib.kmm_last_error().decode()
    assert m.stats("device")["in_use"] == 4096
    _lib.lib.kmm_cupy_free(None, ptr, 0)
    _lib.lib.kmm_cupy_free(None, None, 0)
    assert m.stats("device")["in_use"] == 0


class _Pointer:
    def __init__(self, ptr):
        self.ptr = ptr


def test_allocator_takes_the_c_path_and_falls_back_to_python(fake_cuda, monkeypatch):
    calls = []
    monkeypatch.setattr(kc, "_c_malloc", lambda n: calls.append(n) or _Pointer(0xA000))
    assert kc.allocator(256).ptr == 0xA000
    monkeypatch.setattr(kc, "_c_malloc", lambda n: calls.append(n) or _Pointer(0))
    mp = kc.allocator(1 << 20)  # the C path failed: the Python path serves it
    assert isinstance(mp, cupy.cuda.MemoryPointer) and mp.ptr
    assert fake_cuda.stats("device")["in_use"] == 1 << 20
    with pytest.raises(cupy.cuda.memory.OutOfMemoryError):
        kc.allocator(128 << 20)
    assert calls == [256, 1 << 20, 128 << 20]
    del mp
    gc.collect()
    assert fake_cuda.stats("device")["in_use"] == 0


def test_cupy_exports_the_stream_function_the_c_path_reads():
    capsule = cupy.cuda.stream.__pyx_capi__["get_current_stream_ptr"]
    assert "intptr_t (void)" in repr(capsule)
    assert kc._c_malloc is not None


# -- the compiled allocator: kmm._plugin_calls.cupy_allocate ---------------------------------------
_DEVICE_SOURCE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)
_PLUGIN_FREE = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64)
_address = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731


def _allocation(mp):
    """What frees `mp`'s buffer: the compiled path's CupyAllocation (the memory itself), or the
    Python path's owner of the UnownedMemory."""
    return mp.mem if isinstance(mp.mem, kc._compiled.CupyAllocation) else mp.mem._owner


@pytest.fixture
def compiled(fake_cuda, monkeypatch):
    """cupy_allocate with device and stream sources standing in for CuPy's (which need a GPU);
    state["fallbacks"] lists what it handed to Python, as (nbytes, status)."""
    if kc._compiled is None:
        pytest.skip("kmm._plugin_calls was not built")
    state = {"device": 0, "stream": 0, "fallbacks": []}
    monkeypatch.setattr(kc, "_get_device_id", lambda: state["device"])  # the Python path's
    stream = _SOURCE(lambda: state["stream"])
    device = _DEVICE_SOURCE(lambda skip_dispatch: state["device"])

    def fallback(nbytes, status):
        state["fallbacks"].append((nbytes, status))
        return kc._allocate_in_python(nbytes, status)

    allocate = kc._compiled_allocator(_address(stream), _address(device), fallback)
    yield fake_cuda, state, allocate
    kc._compiled_allocator()  # CuPy's own sources again


def test_compiled_allocator_is_the_default_where_built():
    if kc._compiled is None:
        # tools/test.sh builds it and sets KMM_REQUIRE_COMPILED=1: there a missing module fails.
        assert os.environ.get("KMM_REQUIRE_COMPILED") != "1", "kmm._plugin_calls is required but was not built"
        pytest.skip("kmm._plugin_calls was not built")
    assert kc.allocator is kc._compiled.cupy_allocate


def test_compiled_allocator_serves_from_the_devices_manager_and_frees_when_cupy_lets_go(compiled):
    m, state, allocate = compiled
    before = kc.live_allocations()
    mp = allocate(3 << 20)
    assert isinstance(mp, cupy.cuda.MemoryPointer) and isinstance(mp.mem, cupy.cuda.memory.UnownedMemory)
    owner = mp.mem
    assert isinstance(owner, kc._compiled.CupyAllocation)
    assert (owner.manager, owner.ptr, owner.size, owner.stream) == (m, mp.ptr, 3 << 20, 0)
    assert mp.ptr != 0 and mp.mem.size == 3 << 20 and mp.device_id == 0
    assert m.stats("device")["in_use"] == 3 << 20
    assert kc.live_allocations() == before + 1
    assert state["fallbacks"] == []
    with pytest.raises(TypeError):
        type(owner)()  # only the allocator makes them
    del mp, owner
    gc.collect()
    assert m.stats("device")["in_use"] == 0
    assert kc.live_allocations() == before


def test_compiled_allocator_gives_empty_requests_no_buffer(compiled):
    m, state, allocate = compiled
    mp = allocate(0)
    assert (mp.ptr, mp.mem.size, mp.device_id) == (0, 0, 0)
    assert m.stats("device")["live_buffers"] == 0 and state["fallbacks"] == []


def test_compiled_allocator_makes_the_first_manager_through_python(compiled):
    _, state, allocate = compiled
    kc._clear_managers()
    first = allocate(4096)  # no manager on device 0 yet: the Python path makes it
    assert not isinstance(first.mem, kc._compiled.CupyAllocation)
    assert state["fallbacks"] == [(4096, 0)]
    made = kc._managers[0]
    second = allocate(4096)  # then the compiled path serves the device
    assert isinstance(second.mem, kc._compiled.CupyAllocation)
    assert second.mem.manager is made
    assert first.ptr != second.ptr and len(state["fallbacks"]) == 1
    del first, second
    gc.collect()
    assert made.stats("device")["in_use"] == 0


@pytest.mark.parametrize("device", [-1, -5, 64, 1000])
def test_compiled_allocator_hands_devices_past_its_table_to_python(compiled, device):
    _, state, allocate = compiled
    state["device"] = device
    with pytest.raises(kmm.KmmError, match="device"):
        allocate(4096)  # the Python path: no such device on the host backend
    assert state["fallbacks"] == [(4096, 0)]


def test_compiled_allocator_raises_cupys_oom_after_one_try_and_keeps_what_is_stored(compiled):
    m, state, allocate = compiled
    kept = allocate(8 << 20)
    before = kc.live_allocations()
    with pytest.raises(cupy.cuda.memory.OutOfMemoryError) as e:
        allocate(128 << 20)  # hard limit 64 MiB
    assert isinstance(e.value.__cause__, kmm.OutOfMemoryError)
    assert state["fallbacks"] == [(128 << 20, kmm.OutOfMemoryError.status)]
    assert m.stats("device")["failed_allocs"] == 1, "the ladder was climbed once"
    assert kc.live_allocations() == before
    assert m.stats("device")["in_use"] == 8 << 20 and kept.mem.size == 8 << 20


@pytest.mark.parametrize("bad", [-1, 2**64, 1.5, "10"])
def test_compiled_allocator_hands_bad_sizes_to_python_which_refuses_them(compiled, bad):
    m, _, allocate = compiled
    with pytest.raises((TypeError, kmm.KmmError), match="nbytes = "):
        allocate(bad)
    assert m.stats("device")["in_use"] == 0


def test_closing_the_manager_while_cupy_holds_its_memory_is_refused(compiled):
    # close() freed memory CuPy arrays still used, and the next manager could hand the same
    # addresses to new arrays.
    m, state, allocate = compiled
    mp = allocate(4096)
    if BACKEND == "host":
        ctypes.memset(mp.ptr, 0x5A, 4096)
    with pytest.raises(kmm.BufferMappedError, match="holds 1 live buffers"):
        m.close()
    assert not m.closed and kc.manager(0) is m, "nothing changed"
    assert m.stats("device")["in_use"] == 4096
    if BACKEND == "host":
        assert ctypes.string_at(mp.ptr, 4096) == b"\x5a" * 4096
    kept = allocate(4096)  # still served by the compiled path, from the same manager
    assert kept.mem.manager is m and state["fallbacks"] == []
    del mp, kept
    gc.collect()
    m.close()  # nothing held: closed


def test_close_waits_for_a_python_path_allocation_in_flight_and_counts_it(fake_cuda, monkeypatch):
    # The Python path's allocation releases the GIL inside libkmm: a close() on another thread
    # counted the manager's buffers before it landed and destroyed the manager after, under it.
    m = fake_cuda
    closing = {}

    def close_in_thread():
        try:
            m.close()
        except Exception as e:
            closing["error"] = e

    real_alloc = kc._plugin_alloc
    thread = threading.Thread(target=close_in_thread)

    def alloc_while_closing(*args):
        thread.start()
        thread.join(0.3)  # close() must wait for this allocation
        closing["closed_meanwhile"] = m.closed
        return real_alloc(*args)

    monkeypatch.setattr(kc, "_plugin_alloc", alloc_while_closing)
    p = kc.pinned_allocator(4096)
    thread.join(5)
    assert closing["closed_meanwhile"] is False
    assert isinstance(closing.get("error"), kmm.BufferMappedError), "close() counted the new buffer"
    assert not m.closed and p.mem.manager is m and m.stats("pinned")["live_buffers"] == 1
    del p
    gc.collect()
    m.close()


def test_close_force_and_a_second_close(compiled):
    m, _, allocate = compiled
    mp = allocate(4096)
    m.close(force=True)  # the caller's word: nothing uses the memory any more
    assert m.closed and kc.manager(0) is not m
    m.close()  # closed already: nothing to do
    del mp
    gc.collect()


def test_compiled_allocator_replaces_a_closed_manager(compiled):
    m, state, allocate = compiled
    before = kc.live_allocations()
    m.close()
    again = allocate(4096)  # the closed manager is replaced, through the Python path
    assert state["fallbacks"] == [(4096, 0)], "the compiled path no longer knows the closed manager"
    assert kc.manager(0) is not m and not kc.manager(0).closed
    assert kc.manager(0).stats("device")["in_use"] == 4096
    newer = allocate(4096)  # and serves the compiled path from then on
    assert isinstance(newer.mem, kc._compiled.CupyAllocation) and len(state["fallbacks"]) == 1
    assert kc.live_allocations() == before + 1
    del again, newer


def test_c_malloc_forgets_a_closed_manager(c_path):
    m, _ = c_path
    m.close()
    assert not _lib.lib.kmm_cupy_malloc(None, 4096, 0), "no allocation from the closed manager"
    assert "device = 0 has no Kmm manager" in _lib.lib.kmm_last_error().decode()
    fresh = kc.manager(0)  # made again, and the C path serves from it
    ptr = _lib.lib.kmm_cupy_malloc(None, 4096, 0)
    assert ptr and fresh is not m and fresh.stats("device")["in_use"] == 4096
    _lib.lib.kmm_cupy_free(None, ptr, 0)


@pytest.mark.skipif(BACKEND != "host", reason="another manager's host-backend stream stands in for CuPy's")
def test_compiled_allocator_allocates_and_frees_on_cupys_current_stream(compiled):
    m, state, allocate = compiled
    freed = []
    real_free = _lib.lib.kmm_plugin_free
    recorder = _PLUGIN_FREE(lambda h, b, s: freed.append((h, b, s)) or real_free(h, b, s))
    kc._compiled.bind(_lib.address_of(_lib.lib.kmm_plugin_alloc), _address(recorder))
    try:
        with kmm.Manager(backend=BACKEND) as other:
            state["stream"] = other.stream  # CuPy's current stream, a foreign one
            m.trace_start()
            mp = allocate(1 << 20)
            buffer = mp.mem.buffer
            assert mp.mem.stream == other.stream
            state["stream"] = 0  # CuPy's current stream changes before the memory is dropped
            del mp
            gc.collect()
            assert freed == [(m._handle, buffer, other.stream)], "freed after the allocation's stream"
            allocated = [r.stream for r in m.trace() if r.action == "allocate" and r.bytes == 1 << 20]
            assert allocated == [other.stream]
            assert m.stats("device")["in_use"] == 0
    finally:
        kc._compiled.bind(_lib.address_of(_lib.lib.kmm_plugin_alloc), _lib.address_of(real_free))


class _UserStream:
    """Stands in for a `cupy.cuda.Stream` the user made: destroyed when collected (then
    `on_destroy()` runs, as CUDA's cuStreamDestroy would)."""

    def __init__(self, ptr, on_destroy):
        self.ptr, self._on_destroy = ptr, on_destroy

    def __del__(self):
        self._on_destroy()


@pytest.mark.skipif(BACKEND != "host", reason="another manager's host-backend stream stands in for CuPy's")
@pytest.mark.parametrize("path", ["compiled", "python"])
def test_allocations_keep_a_user_stream_alive_until_their_free(compiled, monkeypatch, path):
    """An array allocated inside `with cupy.cuda.Stream():` outlives the block, and its Stream
    object may be collected (which destroys the CUDA stream) before the array: the free, ordered
    after that stream, would record an event on a destroyed stream (refused: the buffer leaked).
    The allocation holds the Stream until its free; CuPy's default streams (0, 1, 2) are not held."""
    import weakref

    m, state, allocate = compiled
    if path == "python":
        allocate = kc._allocate_in_python
    with kmm.Manager(backend=BACKEND) as other:
        in_use_at_destroy = []
        user = _UserStream(other.stream, lambda: in_use_at_destroy.append(m.stats("device")["in_use"]))
        monkeypatch.setattr(kc, "_get_current_stream", lambda: user)  # read by both paths
        state["stream"] = other.stream
        mp = allocate(1 << 20)
        owner = _allocation(mp)
        assert owner.stream == other.stream and owner.stream_owner is user
        gone = weakref.ref(user)
        del user, owner
        state["stream"] = 0
        monkeypatch.setattr(kc, "_get_current_stream", lambda: _Stream())
        gc.collect()
        assert gone() is not None, "the stream was let go while memory allocated for it lives"
        del mp
        gc.collect()
        assert gone() is None, "the stream was kept after the free"
        assert in_use_at_destroy == [0], "the stream was let go before the free ordered after it"
        assert m.stats("device")["in_use"] == 0
        mp = allocate(4096)  # CuPy's default stream: nothing held
        assert _allocation(mp).stream_owner is None
        del mp
        gc.collect()


@pytest.mark.skipif(BACKEND != "host", reason="another manager's host-backend stream stands in for CuPy's")
@pytest.mark.parametrize("path", ["compiled", "python"])
def test_a_stream_holding_its_own_workspace_is_collected(compiled, monkeypatch, path):
    """A Stream that keeps memory allocated for it (`s.workspace = cupy.empty(...)`) and that
    memory's allocation, which holds the Stream, make a cycle: the collector ends it (the
    compiled allocation is tracked by it), and the buffer comes back (found by review, 2026-11-28:
    the compiled path leaked both for good)."""
    import weakref

    m, state, allocate = compiled
    if path == "python":
        allocate = kc._allocate_in_python
    with kmm.Manager(backend=BACKEND) as other:
        user = _UserStream(other.stream, lambda: None)
        monkeypatch.setattr(kc, "_get_current_stream", lambda: user)
        state["stream"] = other.stream
        user.workspace = allocate(1 << 20)
        assert _allocation(user.workspace).stream_owner is user
        gone = weakref.ref(user)
        del user
        state["stream"] = 0
        monkeypatch.setattr(kc, "_get_current_stream", lambda: _Stream())
        gc.collect()
        assert gone() is None, "the stream and its workspace were kept for good"
        assert m.stats("device")["in_use"] == 0
