"""CuPy allocation pieces on one GPU machine, one process: CuPy's pool, then Kmm's C path."""
import ctypes, time
import cupy, kmm.cupy as kc
from kmm import _lib

N = 1 << 20


def per_op(f, n=20000):
    for _ in range(2000):
        f()
    out = []
    for _ in range(5):
        t = time.perf_counter_ns()
        for _ in range(n):
            f()
        out.append((time.perf_counter_ns() - t) / n)
    out.sort()
    return "min %6.0f  median %6.0f ns/op" % (out[0], out[2])


def empty():
    x = cupy.empty(N // 4, cupy.float32)
    del x


print("cupy.empty, CuPy pool      ", per_op(empty))
print("cupy.cuda.alloc, CuPy pool ", per_op(lambda: cupy.cuda.alloc(N)))
cupy.cuda.set_allocator(kc.allocator)
m = kc.manager()
print("cupy.empty, Kmm            ", per_op(empty))
print("cupy.cuda.alloc, Kmm       ", per_op(lambda: cupy.cuda.alloc(N)))
print("CFunctionAllocator.malloc  ", per_op(lambda: kc._c_malloc(N)))
ma, fr = _lib.lib.kmm_cupy_malloc, _lib.lib.kmm_cupy_free
print("ctypes malloc+free         ", per_op(lambda: fr(None, ma(None, N, 0), 0)))
print("ctypes abi_version         ", per_op(lambda: _lib.lib.kmm_abi_version()))
print(m.summary())
