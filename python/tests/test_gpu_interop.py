"""Zero-copy round trips between Kmm, PyTorch, CuPy, Numba and JAX on a GPU, with the data
checked on both sides. Skipped unless KMM_TEST_GPU=1 (each library is skipped when missing)."""

import numpy as np
import pytest

import kmm
from kmm import dlpack
from conftest import requires_gpu

pytestmark = requires_gpu


@pytest.fixture(scope="module")
def mgr():
    m = kmm.Manager(backend="cuda")
    yield m
    m.close()


def source(mgr, n=1000):
    return mgr.asarray(np.arange(n, dtype=np.float32))


def test_cuda_exports(mgr):
    a = source(mgr)
    assert a.__dlpack_device__() == (dlpack.kDLCUDA, mgr.device)
    cai = a.__cuda_array_interface__
    assert cai["stream"] == mgr.stream and cai["stream"] not in (None, 0, 1, 2)
    p = mgr.alloc(64, kind="pinned")
    assert p.__dlpack_device__() == (dlpack.kDLCUDAHost, 0)
    p.host_view()[:3] = b"abc"
    assert bytes(p.copy_to_host(nbytes=3)) == b"abc"


def test_torch(mgr):
    torch = pytest.importorskip("torch")
    a = source(mgr)
    t = torch.from_dlpack(a)
    assert t.device.type == "cuda" and t.data_ptr() == a.ptr
    assert torch.equal(t.cpu(), torch.arange(1000, dtype=torch.float32))
    t.mul_(2)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(a.get(), 2 * np.arange(1000, dtype=np.float32))
    # torch -> kmm
    u = torch.arange(12, device="cuda", dtype=torch.int64).reshape(3, 4).t()  # strided
    k = kmm.DeviceArray.from_dlpack(u, manager=mgr)
    assert k.ptr == u.data_ptr() and k.shape == (4, 3) and k.strides == (8, 32)
    np.testing.assert_array_equal(k.get(), u.cpu().numpy())
    k2 = kmm.DeviceArray.from_cuda_array_interface(u, manager=mgr)
    np.testing.assert_array_equal(k2.get(), u.cpu().numpy())


def test_cupy(mgr):
    cupy = pytest.importorskip("cupy")
    a = source(mgr)
    c = cupy.asarray(a)  # __cuda_array_interface__
    assert c.data.ptr == a.ptr
    np.testing.assert_array_equal(cupy.asnumpy(c), np.arange(1000, dtype=np.float32))
    d = cupy.from_dlpack(a)
    assert d.data.ptr == a.ptr
    d += 1
    cupy.cuda.get_current_stream().synchronize()
    np.testing.assert_array_equal(a.get(), np.arange(1000, dtype=np.float32) + 1)
    x = cupy.arange(20, dtype=cupy.int32)[::2]
    k = kmm.asarray(x, manager=mgr)
    assert k.ptr == x.data.ptr and k.strides == (8,)
    np.testing.assert_array_equal(k.get(), np.arange(0, 20, 2))
    k3 = kmm.DeviceArray.from_dlpack(x, manager=mgr)
    np.testing.assert_array_equal(k3.get(), np.arange(0, 20, 2))


def test_numba(mgr):
    cuda = pytest.importorskip("numba.cuda")
    a = source(mgr)
    n = cuda.as_cuda_array(a)
    assert n.__cuda_array_interface__["data"][0] == a.ptr

    @cuda.jit
    def square(x):
        i = cuda.grid(1)
        if i < x.size:
            x[i] = x[i] * x[i]

    square.forall(n.size)(n)
    cuda.synchronize()
    np.testing.assert_array_equal(a.get(), np.arange(1000, dtype=np.float32) ** 2)
    m = cuda.to_device(np.arange(5, dtype=np.int16))
    k = kmm.DeviceArray.from_cuda_array_interface(m, manager=mgr)
    assert k.ptr == m.__cuda_array_interface__["data"][0]
    np.testing.assert_array_equal(k.get(), np.arange(5))


def test_jax(mgr):
    jax = pytest.importorskip("jax")
    import jax.dlpack

    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("jax has no GPU device")
    a = source(mgr)
    j = jax.dlpack.from_dlpack(a)
    np.testing.assert_array_equal(np.asarray(j), np.arange(1000, dtype=np.float32))
    y = jax.numpy.arange(8, dtype=jax.numpy.float32) * 3
    k = kmm.DeviceArray.from_dlpack(y, manager=mgr)
    np.testing.assert_array_equal(k.get(), np.arange(8, dtype=np.float32) * 3)


def test_chain_through_all_libraries(mgr):
    torch = pytest.importorskip("torch")
    cupy = pytest.importorskip("cupy")
    cuda = pytest.importorskip("numba.cuda")
    a = source(mgr)
    t = torch.from_dlpack(a)
    c = cupy.from_dlpack(t)
    n = cuda.as_cuda_array(c)
    back = kmm.DeviceArray.from_cuda_array_interface(n, manager=mgr)
    assert t.data_ptr() == c.data.ptr == n.__cuda_array_interface__["data"][0] == back.ptr == a.ptr
    t.add_(1)
    torch.cuda.synchronize()
    c *= 2
    cupy.cuda.get_current_stream().synchronize()
    np.testing.assert_array_equal(back.get(), (np.arange(1000, dtype=np.float32) + 1) * 2)
