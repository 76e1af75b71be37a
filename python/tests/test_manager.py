import gc
import re

import pytest

import kmm
from conftest import BACKEND


def test_config_and_identity(manager):
    assert manager.backend == BACKEND
    assert manager.device == 0
    assert manager.alloc_mode == "pool"
    assert manager.suballocator == "binned"
    assert isinstance(manager.stream, int) and manager.stream != 0
    assert "kmm.Manager" in repr(manager)


def test_config_options():
    with kmm.Manager(backend=BACKEND, suballocator="heap", chunk_size=1 << 20, hard_limit=8 << 20,
                     release_threshold=None) as m:
        assert m.suballocator == "heap"
    with pytest.raises(TypeError, match="unknown Kmm config option 'chunk'"):
        kmm.Manager(chunk=1)
    with pytest.raises(ValueError, match="backend = 'gpu'"):
        kmm.Manager(backend="gpu")
    with pytest.raises(kmm.InvalidArgumentError) as e:
        kmm.Manager(backend=BACKEND, alignment=3)
    assert e.value.status == 1002
    assert e.value.name == "KMM_ERROR_INVALID_ARGUMENT"
    assert "alignment" in e.value.message


def test_stats_dict_and_summary(manager):
    s = manager.stats()
    assert set(s) == {"device", "pinned"}
    for key in ("in_use", "peak_in_use", "reserved", "peak_reserved", "allocs", "frees",
                "failed_allocs", "live_buffers", "pool_hits", "pool_misses", "upstream_allocs",
                "upstream_frees", "largest_free_block", "compactions", "relocated_bytes"):
        assert key in s["device"]
    b = manager.alloc(1000)
    p = manager.alloc(3000, kind="pinned")
    d = manager.stats("device")
    assert d["in_use"] == 1000 and d["live_buffers"] == 1 and d["allocs"] == 1
    assert manager.stats("pinned")["in_use"] == 3000
    text = manager.summary()
    assert "device" in text and "pinned" in text and "in use" in text
    assert str(manager) == text
    b.close()
    p.close()
    d = manager.stats("device")
    assert d["in_use"] == 0 and d["frees"] == 1
    manager.reset_peaks()
    assert manager.stats("device")["peak_in_use"] == 0
    manager.trim(0)
    assert manager.stats("device")["reserved"] == 0


def test_compaction_ratio_option():
    with pytest.raises(kmm.InvalidArgumentError) as e:
        kmm.Manager(backend=BACKEND, compaction_ratio_pct=50)
    assert "compaction_ratio_pct = 50" in e.value.message
    # Python's buffers stay mapped for their life, so a compacting pool grows around them.
    with kmm.Manager(backend=BACKEND, chunk_size=2 << 20, compaction_ratio_pct=100) as m:
        bufs = [m.alloc(256 << 10) for _ in range(8)]
        for b in bufs[1::2]:
            b.close()
        big = m.alloc(768 << 10)
        s = m.stats("device")
        assert s["compactions"] == 0 and s["reserved"] == 4 << 20
        big.close()


def test_memory_info_synchronize_streams(manager):
    free, total = manager.memory_info()
    assert 0 < free <= total
    manager.synchronize()
    with kmm.Manager(backend=BACKEND) as other:
        manager.wait_stream(other.stream)
        manager.signal_stream(other.stream)
    manager.wait_stream(manager.stream)


def test_out_of_memory_is_typed():
    with kmm.Manager(backend=BACKEND, hard_limit=4 << 20, chunk_size=1 << 20) as m:
        with pytest.raises(kmm.OutOfMemoryError) as e:
            m.alloc(8 << 20)
        assert isinstance(e.value, MemoryError)
        assert e.value.status == 3001
        assert e.value.name == "KMM_ERROR_OUT_OF_MEMORY"
        assert re.search(r"\d+ bytes", e.value.message)
        assert m.stats("device")["failed_allocs"] == 1


def test_error_classes():
    assert issubclass(kmm.OutOfMemoryError, kmm.KmmError)
    assert kmm.status_name(3001) == "KMM_ERROR_OUT_OF_MEMORY"
    assert kmm.status_name(12345) == "KMM_UNKNOWN_STATUS"
    with pytest.raises(kmm.SizeOverflowError):
        kmm.Manager(backend=BACKEND).alloc(1 << 60)
    with pytest.raises(ValueError, match="kind"):
        kmm.Manager(backend=BACKEND).alloc(10, kind="managed")


def test_close_is_idempotent_and_invalidates():
    m = kmm.Manager(backend=BACKEND)
    b = m.alloc(100)
    m.close()
    m.close()
    assert m.closed
    with pytest.raises(kmm.InvalidHandleError):
        m.alloc(10)
    with pytest.raises(kmm.InvalidHandleError):
        m.stats()
    with pytest.raises(kmm.InvalidHandleError):
        b.copy_to_host()
    b.close()  # freeing after the manager is gone is a no-op, never an error


def test_garbage_collection_frees(manager):
    for _ in range(100):
        manager.alloc(4096)
    gc.collect()
    s = manager.stats("device")
    assert s["live_buffers"] == 0 and s["frees"] == 100


def test_manager_collected_while_buffers_live():
    m = kmm.Manager(backend=BACKEND)
    b = m.alloc(64)
    del m
    gc.collect()
    assert b.manager.stats("device")["live_buffers"] == 1  # the buffer keeps its manager alive
    b.close()


def test_default_manager():
    assert kmm.default_manager() is kmm.default_manager()
