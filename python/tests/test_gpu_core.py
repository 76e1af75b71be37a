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
