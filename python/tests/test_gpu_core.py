"""The core API on the CUDA backend. Skipped unless KMM_TEST_GPU=1."""

import gc

import numpy as np
import pytest

import kmm
from conftest import requires_gpu

pytestmark = requires_gpu


def test_cuda_manager_alloc_copy_stats():
    with kmm.Manager(backend="cuda") as m:
        assert m.backend == "cuda" and m.stream != 0
        h = np.random.rand(1 << 20)
        a = m.asarray(h)
        np.testing.assert_array_equal(a.get(), h)
        p = m.alloc(h.nbytes, kind="pinned")
        p.copy_from(a.buffer)
        m.synchronize()
        np.testing.assert_array_equal(np.frombuffer(p.host_view(), np.float64), h)
        assert m.stats("device")["in_use"] >= h.nbytes
        free, total = m.memory_info()
        assert 0 < free < total
        del a
        gc.collect()
        assert m.stats("device")["live_buffers"] == 0
        with pytest.raises(kmm.OutOfMemoryError):
            m.alloc(1 << 47)


def test_cuda_hard_limit_oom():
    with kmm.Manager(backend="cuda", hard_limit=64 << 20) as m:
        with pytest.raises(kmm.OutOfMemoryError):
            m.alloc(128 << 20)


def _open_in_child(handle, offset, nbytes, queue):
    import cupy

    ptr = cupy.cuda.runtime.ipcOpenMemHandle(handle)
    try:
        mem = cupy.cuda.UnownedMemory(ptr + offset, nbytes, None)
        arr = cupy.ndarray((nbytes // 4,), cupy.float32, cupy.cuda.MemoryPointer(mem, 0))
        queue.put(cupy.asnumpy(arr))
    finally:
        cupy.cuda.runtime.ipcCloseMemHandle(ptr)


def test_buffer_ipc_handle_of_suballocation_in_second_process():
    pytest.importorskip("cupy")
    import multiprocessing as mp

    with kmm.Manager(backend="cuda") as m:
        arrays = [m.asarray(np.arange(1024, dtype=np.float32) + i) for i in range(4)]
        pairs = [(i, a.buffer.ipc_handle()) for i, a in enumerate(arrays)]
        inner = [(i, h, off) for i, (h, off) in pairs if off > 0]
        assert inner, "no sub-allocation at a non-zero offset"
        i, handle, offset = inner[-1]
        assert len(handle) == 64
        with pytest.raises(kmm.WrongKindError):
            m.alloc(64, kind="pinned").ipc_handle()
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=_open_in_child, args=(handle, offset, 4096, q))
        p.start()
        got = q.get(timeout=120)
        p.join(timeout=120)
        np.testing.assert_array_equal(got, np.arange(1024, dtype=np.float32) + i)
