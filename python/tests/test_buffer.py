import numpy as np
import pytest

import kmm


def test_alloc_and_info(manager):
    b = manager.alloc(1 << 20)
    assert isinstance(b, kmm.Buffer)
    assert len(b) == b.nbytes == 1 << 20
    assert b.kind == "device"
    assert b.ptr != 0 and b.ptr % 256 == 0
    info = b.info()
    assert info == {"bytes": 1 << 20, "kind": "device", "pins": 1, "spilled": False, "never_spill": False}
    assert "device" in repr(b)
    b.close()
    assert b.closed and "closed" in repr(b)
    with pytest.raises(kmm.InvalidHandleError):
        b.ptr


def test_zero_bytes(manager):
    b = manager.alloc(0)
    assert b.nbytes == 0
    assert b.copy_to_host() == bytearray()


@pytest.mark.parametrize("kind", ["device", "pinned"])
def test_copies_roundtrip(manager, kind):
    src = np.arange(1000, dtype=np.float64)
    b = manager.alloc(src.nbytes, kind=kind)
    b.copy_from_host(src)
    out = np.empty_like(src)
    b.copy_to_host(out)
    np.testing.assert_array_equal(out, src)
    assert bytes(b.copy_to_host(offset=8, nbytes=8)) == src[1:2].tobytes()


def test_copies_from_any_buffer_protocol(manager):
    b = manager.alloc(16)
    b.copy_from_host(b"0123456789abcdef")
    assert bytes(b.copy_to_host()) == b"0123456789abcdef"
    b.copy_from_host(bytearray(b"XY"), offset=4)
    b.copy_from_host(memoryview(b"zz"), offset=14)
    assert bytes(b.copy_to_host()) == b"0123XY6789abcdzz"
    import array
    a = array.array("i", [0, 0])
    b.copy_to_host(a)
    assert a.tobytes() == b"0123XY67"


def test_copy_errors(manager):
    b = manager.alloc(8)
    with pytest.raises(IndexError):
        b.copy_from_host(b"123456789")
    with pytest.raises(IndexError):
        b.copy_to_host(bytearray(4), offset=6)
    with pytest.raises(ValueError, match="read-only"):
        b.copy_to_host(b"12345678")
    with pytest.raises(ValueError, match="contiguous"):
        b.copy_from_host(np.zeros(4, np.int32)[::2])


def test_fill_and_buffer_copies(manager):
    a = manager.alloc(64).fill(b"\xab")
    b = manager.alloc(64).fill(b"\x01\x02\x03\x04")
    a.copy_from(b, dst_offset=8, src_offset=0, nbytes=16)
    out = bytes(a.copy_to_host())
    assert out[:8] == b"\xab" * 8 and out[8:24] == b"\x01\x02\x03\x04" * 4 and out[24:] == b"\xab" * 40
    with kmm.Manager(backend=manager.backend) as other:
        c = other.alloc(64)
        c.copy_from(b)
        assert bytes(c.copy_to_host()) == b"\x01\x02\x03\x04" * 16
        c.close()


def test_pinned_host_view(manager):
    p = manager.alloc(32, kind="pinned")
    v = p.host_view()
    v[:4] = b"kmm!"
    assert bytes(p.copy_to_host(nbytes=4)) == b"kmm!"


def test_context_manager(manager):
    with manager.alloc(10) as b:
        assert not b.closed
    assert b.closed
    assert manager.stats("device")["live_buffers"] == 0


def test_ipc_handle_needs_cuda(manager):
    b = manager.alloc(256)
    if manager.backend == "host":
        with pytest.raises(kmm.NotSupportedError, match="CUDA backend"):
            b.ipc_handle()


def test_record_stream_checks_its_arguments(manager):
    b = manager.alloc(1024)
    b.record_stream(manager.stream)  # the manager's own: allowed, changes nothing
    if manager.backend == "host":
        with kmm.Manager(backend="host") as other:
            b.record_stream(other.stream)
            with pytest.raises(kmm.InvalidArgumentError, match="not a live host-backend stream"):
                b.record_stream(0x1234)
            b.close()  # the free is ordered after the other manager's stream, which is still alive
    b.close()
    with pytest.raises(kmm.InvalidHandleError):
        b.record_stream(manager.stream)


def test_dlpack_records_the_consumers_stream(manager):
    from kmm import dlpack

    cuda = dlpack.kDLCUDA
    assert dlpack.consumer_stream(manager, cuda, None) == 1  # DLPack's default: the legacy stream
    assert dlpack.consumer_stream(manager, cuda, 2) == 2
    assert dlpack.consumer_stream(manager, cuda, 0xABC0) == 0xABC0
    assert dlpack.consumer_stream(manager, cuda, -1) is None  # the consumer asked for no ordering
    assert dlpack.consumer_stream(manager, cuda, manager.stream) is None
    assert dlpack.consumer_stream(manager, dlpack.kDLCPU, None) is None


@pytest.mark.parametrize("kind", ["pinned", "device"])
def test_host_view_shows_the_work_queued_before_it(manager, kind):
    # fill and copy_from are queued on the manager's stream; a host view is read at once, so it
    # is made after that work has run (a queue of fills long enough that a view made without
    # waiting reads the old bytes; round 4 of the adversarial tests).
    n = 64 << 20
    b = manager.alloc(n, kind=kind)
    b.fill(b"\x00")
    manager.synchronize()
    for i in range(4):
        b.fill(bytes([i + 1]))
    b.fill(b"\x07")
    assert int(np.asarray(b.host_view())[-1]) == 7
    src = manager.alloc(n)
    src.fill(b"\x05")
    for _ in range(4):
        b.copy_from(src)
    assert int(np.asarray(b.host_view())[-1]) == 5
    for x in (b, src):
        x.close()
