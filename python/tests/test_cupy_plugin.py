"""The CuPy allocators' contract without a GPU: CuPy's device and stream queries are replaced."""

import gc

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
    kc.configure(backend=BACKEND, hard_limit=64 << 20)
    kc._managers.clear()
    yield kc.manager(0)
    kc._managers.clear()
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
