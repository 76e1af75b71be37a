"""Cases of the GPU tests that need a fresh process (allocator plugins must be chosen before the
library's first CUDA allocation). Run: python _gpu_worker.py CASE; prints OK on success."""

import gc
import os
import sys

import numpy as np

# numba-cuda 0.30 registers an overload for np.row_stack, which NumPy 2.5 removed (the GPU
# machine's image has both); without this alias its kernel compiler fails to import.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def numba_kernel():
    from numba import cuda

    import kmm.numba

    ctx = cuda.current_context()
    mm = ctx.memory_manager
    assert isinstance(mm, kmm.numba.KmmNumbaMemoryManager), type(mm)

    @cuda.jit
    def fill(out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = 2 * i + 1

    before = mm.manager.stats("device")["in_use"]
    d = cuda.device_array(100_000, np.float32)
    assert mm.manager.stats("device")["in_use"] >= before + 400_000
    fill.forall(d.size)(d)
    np.testing.assert_array_equal(d.copy_to_host(), 2 * np.arange(100_000, dtype=np.float32) + 1)
    free, total = ctx.get_memory_info()
    assert 0 < free <= total
    # defer_cleanup holds frees
    live = mm.manager.stats("device")["live_buffers"]
    with cuda.defer_cleanup():
        e = cuda.device_array(1000)
        del e
        gc.collect()
        assert mm.manager.stats("device")["live_buffers"] == live + 1
    assert mm.manager.stats("device")["live_buffers"] == live
    del d
    gc.collect()
    assert mm.manager.stats("device")["live_buffers"] == live - 1
    # reset frees all and the plugin keeps working
    keep = cuda.device_array(10)
    ctx.reset()
    x = cuda.to_device(np.arange(10.0))
    np.testing.assert_array_equal(x.copy_to_host(), np.arange(10.0))
    del keep


def _ipc_child(handle, queue):
    with handle as arr:
        queue.put(arr.copy_to_host())


def numba_ipc():
    import multiprocessing as mp

    from numba import cuda

    import kmm.numba

    mm = cuda.current_context().memory_manager
    assert isinstance(mm, kmm.numba.KmmNumbaMemoryManager)
    data = np.arange(4096, dtype=np.float32) * 3
    arrays = [cuda.to_device(data + i) for i in range(4)]  # sub-allocations of one pool chunk
    handles = [a.get_ipc_handle() for a in arrays]
    # DeviceNDArray.get_ipc_handle wraps the plugin's IpcHandle in an IpcArrayHandle
    inner = [(i, h) for i, h in enumerate(handles) if h._ipc_handle.offset > 0]
    assert inner, "no sub-allocation at a non-zero offset: %s" % [h._ipc_handle.offset for h in handles]
    i, handle = inner[-1]
    data = data + i
    assert handle._ipc_handle.size == data.nbytes
    direct = mm.get_ipc_handle(arrays[i].gpu_data)  # the plugin's own answer
    assert direct.offset == handle._ipc_handle.offset and direct.size == data.nbytes
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_ipc_child, args=(handle, q))
    p.start()
    got = q.get(timeout=120)
    p.join(timeout=120)
    assert p.exitcode == 0
    np.testing.assert_array_equal(got, data)


def torch_allocator():
    import torch

    import kmm.torch

    torch.cuda.memory.change_current_allocator(kmm.torch.allocator())
    n0 = kmm.torch.live_allocations()
    x = torch.arange(1_000_000, device="cuda", dtype=torch.int64)
    assert kmm.torch.live_allocations() > n0
    m = kmm.torch.manager(0)
    assert m.backend == "cuda"
    assert m.stats("device")["in_use"] >= 8_000_000
    assert int((x * 2).sum()) == 2 * (999_999 * 1_000_000 // 2)
    a = torch.randn(512, 512, device="cuda")
    b = torch.randn(512, 512, device="cuda")
    c = a @ b
    np.testing.assert_allclose(c.cpu().numpy(), a.cpu().numpy() @ b.cpu().numpy(), rtol=1e-3, atol=1e-3)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = torch.ones(1000, device="cuda") * 3
        z = y.sum()
    s.synchronize()
    assert float(z) == 3000
    # a Kmm array seen by torch under the Kmm allocator
    k = m.asarray(np.arange(10, dtype=np.float32))
    t = torch.from_dlpack(k)
    assert t.data_ptr() == k.ptr and float(t.sum()) == 45
    # freeing returns the memory to Kmm (cuBLAS workspaces and the like may stay allocated)
    n1 = kmm.torch.live_allocations()
    del x
    gc.collect()
    assert kmm.torch.live_allocations() == n1 - 1
    del a, b, c, y, z, t


CASES = {f.__name__: f for f in (numba_kernel, numba_ipc, torch_allocator)}

if __name__ == "__main__":
    CASES[sys.argv[1]]()
    print("OK")
