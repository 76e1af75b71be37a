"""The PyTorch pluggable-allocator functions of libkmm, called through ctypes (no torch needed)."""

import ctypes
import os
import subprocess
import sys

import pytest

import kmm
import kmm.torch as kt
from kmm import _lib

lib = _lib.lib


def test_exports_have_pytorch_signatures():
    # void* malloc(size_t, int, cudaStream_t); void free(void*, size_t, int, cudaStream_t)
    handle = ctypes.CDLL(kt.library_path)
    assert handle.kmm_torch_malloc and handle.kmm_torch_free


def test_malloc_free_roundtrip():
    kt.set_oom_policy("abort")
    m = kt.manager(0)
    before = m.stats("device")["live_buffers"]
    n0 = kt.live_allocations()
    p = lib.kmm_torch_malloc(1 << 20, 0, None)
    assert p and p % 256 == 0
    assert kt.live_allocations() == n0 + 1
    assert m.stats("device")["live_buffers"] == before + 1
    lib.kmm_torch_free(p, 1 << 20, 0, None)
    assert kt.live_allocations() == n0
    assert m.stats("device")["live_buffers"] == before
    assert lib.kmm_torch_malloc(0, 0, None) is None  # zero bytes: NULL
    lib.kmm_torch_free(None, 0, 0, None)  # NULL: ignored
    lib.kmm_torch_free(12345, 8, 0, None)  # unknown pointer: ignored, error recorded
    assert b"not allocated by kmm_torch_malloc" in lib.kmm_last_error()


def test_manager_is_shared_and_not_closed_by_python():
    m = kt.manager(0)
    assert kt.manager(0).handle == m.handle
    m.close()
    assert not kt.manager(0).closed


def test_oom_policy_null_returns_null():
    kt.set_oom_policy("null")
    try:
        assert lib.kmm_torch_malloc(1 << 60, 0, None) is None
        assert b"exceeds" in lib.kmm_last_error()
    finally:
        kt.set_oom_policy("abort")
    with pytest.raises(ValueError):
        kt.set_oom_policy("raise")


def test_oom_policy_abort_aborts():
    code = "import kmm._lib as l; l.lib.kmm_torch_malloc(1 << 60, 0, None)"
    env = dict(os.environ, KMM_BACKEND=os.environ.get("KMM_BACKEND", "host"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(kmm.__file__))))
    assert r.returncode != 0
    assert "kmm_torch_malloc: cannot allocate" in r.stderr and "aborting" in r.stderr


def test_allocator_object_needs_torch_cuda():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not hasattr(torch._C, "_cuda_customAllocator"):
        pytest.skip("this torch build has no CUDA (CUDAPluggableAllocator needs one)")
    assert kt.allocator() is kt.allocator()


class _Storage:
    def __init__(self, ptr):
        self._ptr = ptr

    def data_ptr(self):
        return self._ptr


class _Tensor:
    """What `record_stream` reads of a torch tensor: its storage's base address."""

    def __init__(self, ptr):
        self._storage = _Storage(ptr)

    def untyped_storage(self):
        return self._storage


class _Stream:
    def __init__(self, raw):
        self.cuda_stream = raw


def test_record_stream_records_on_the_buffer():
    m = kt.manager(0)
    other = kmm.Manager()  # on the host backend another manager's stream is a valid foreign stream
    try:
        p = lib.kmm_torch_malloc(1 << 16, 0, None)
        kt.record_stream(_Tensor(p), _Stream(other.stream))
        kt.record_stream(_Tensor(p), other.stream)
        with pytest.raises(TypeError, match="stream = "):
            kt.record_stream(_Tensor(p), "s")
        with pytest.raises(kmm.InvalidArgumentError, match="stream = "):
            kt.record_stream(_Tensor(p), -1)
        lib.kmm_torch_free(p, 1 << 16, 0, None)
        with pytest.raises(kmm.KmmError, match="not allocated by kmm_torch_malloc"):
            kt.record_stream(_Tensor(p), other.stream)
        m.synchronize()
    finally:
        other.close()
