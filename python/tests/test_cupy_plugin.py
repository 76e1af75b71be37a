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
