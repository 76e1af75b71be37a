"""CuPy computing on Kmm allocations (device and pinned). Skipped unless KMM_TEST_GPU=1."""

import gc

import numpy as np
import pytest

from conftest import requires_gpu

pytestmark = requires_gpu


@pytest.fixture
def kc():
    cupy = pytest.importorskip("cupy")
    import kmm.cupy

    cupy.cuda.set_allocator(kmm.cupy.allocator)
    cupy.cuda.set_pinned_memory_allocator(kmm.cupy.pinned_allocator)
    yield kmm.cupy
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
    cupy.cuda.set_pinned_memory_allocator(cupy.get_default_pinned_memory_pool().malloc)


def test_cupy_computes_on_kmm_memory(kc):
    import cupy

    m = kc.manager()
    assert m.backend == "cuda"
    before = m.stats("device")["allocs"]
    x = cupy.arange(1_000_000, dtype=cupy.float64)
    assert m.stats("device")["allocs"] > before
    assert float((x * 2).sum()) == float(2 * np.arange(1_000_000, dtype=np.float64).sum())
    a = cupy.random.rand(256, 256, dtype=cupy.float32)
    b = cupy.random.rand(256, 256, dtype=cupy.float32)
    np.testing.assert_allclose(cupy.asnumpy(a @ b), cupy.asnumpy(a) @ cupy.asnumpy(b), rtol=1e-4)
    live = m.stats("device")["live_buffers"]
    del x, a, b
    gc.collect()
    assert m.stats("device")["live_buffers"] < live


def test_cupy_allocates_through_the_c_path_on_its_current_stream(kc):
    import cupy

    assert kc._c_malloc is not None, "this CuPy has no get_current_stream_ptr: Python path only"
    kc.manager()  # registered with libkmm, so the C path serves from the first allocation on
    before = kc.live_allocations()
    x = cupy.arange(4096, dtype=cupy.int64)
    assert kc.live_allocations() == before + 1
    with cupy.cuda.Stream(non_blocking=True) as s:
        y = cupy.ones(1 << 20, dtype=cupy.float32)  # allocated for, and freed after, stream s
        total = float(y.sum())
        del y
        z = cupy.full(1 << 20, 2, dtype=cupy.float32)  # may reuse y's block: ordered by s
        assert float(z.sum()) == 2 * total
        del z
        s.synchronize()
    assert int(x.sum()) == 4095 * 4096 // 2
    del x
    gc.collect()
    assert kc.live_allocations() == before


def test_cupy_on_non_default_streams(kc):
    import cupy

    results = []
    for _ in range(2):
        with cupy.cuda.Stream(non_blocking=True) as s:
            x = cupy.ones(1 << 20, dtype=cupy.float32)
            results.append(float(x.sum()))
            del x
            s.synchronize()
    x = cupy.full(1000, 5, dtype=cupy.int32)  # back on the default stream
    assert results == [float(1 << 20)] * 2 and int(x.sum()) == 5000


def test_cupy_oom_is_cupys_error(kc):
    import cupy

    with pytest.raises(cupy.cuda.memory.OutOfMemoryError):
        cupy.empty(1 << 47, dtype=cupy.uint8)  # 128 TiB
    assert float(cupy.ones(10).sum()) == 10  # still usable


def test_cupy_pinned_allocator(kc):
    import cupy

    m = kc.manager()
    p = cupy.cuda.alloc_pinned_memory(1 << 20)
    assert m.stats("pinned")["in_use"] >= 1 << 20
    h = np.frombuffer(p, np.uint8, 1 << 20)
    h[:] = 7
    d = cupy.asarray(h)
    assert int(d.sum()) == 7 << 20


def test_arrays_outliving_their_stream_are_freed(kc):
    """Arrays made inside `with cupy.cuda.Stream():` outlive the block and its Stream object:
    each allocation holds the Stream until its free (ordered after that stream), so the CUDA
    stream is not destroyed first and every buffer comes back."""
    import cupy

    m = kc.manager()
    x = cupy.zeros(1, dtype=cupy.float32)  # the manager exists and serves the fast path
    in_use, live = m.stats("device")["in_use"], kc.live_allocations()
    kept = []
    for i in range(20):
        with cupy.cuda.Stream(non_blocking=True):
            kept.append(cupy.full(1 << 18, i, dtype=cupy.float32))
        gc.collect()  # the Stream object would be collected here
    assert [float(a[-1]) for a in kept] == [float(i) for i in range(20)]
    del kept
    gc.collect()
    cupy.cuda.Device().synchronize()
    assert kc.live_allocations() == live
    assert m.stats("device")["in_use"] == in_use, "buffers freed after a destroyed stream were kept"
    del x
