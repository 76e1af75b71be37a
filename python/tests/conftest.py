import os

import numpy as np
import pytest

import kmm

# numba-cuda 0.30 registers an overload for np.row_stack, which NumPy 2.5 removed (the GPU
# machine's image has both); without this alias its kernel compiler fails to import.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

#: Backend of the core tests: "host" unless KMM_TEST_BACKEND says otherwise (e.g. "cuda").
BACKEND = os.environ.get("KMM_TEST_BACKEND", "host")


@pytest.fixture
def manager():
    m = kmm.Manager(backend=BACKEND)
    yield m
    m.close()


def gpu_enabled():
    return os.environ.get("KMM_TEST_GPU") == "1"


requires_gpu = pytest.mark.skipif(not gpu_enabled(), reason="GPU test: set KMM_TEST_GPU=1 on a machine with CUDA")


def expect_named(exc_types, name, fn, *args, **kwargs):
    """`fn(*args, **kwargs)` raises one of `exc_types` whose message names `name`."""
    with pytest.raises(exc_types) as info:
        fn(*args, **kwargs)
    assert name in str(info.value), "the error does not name %r: %s" % (name, info.value)
    return info.value


def cupy_on_host(monkeypatch, python_path=False):
    """kmm.cupy with CuPy's device and stream queries stood in for (device 0, stream 0); with
    `python_path`, its allocator is the Python path (no compiled or C function allocator)."""
    try:
        import kmm.cupy as kc
    except Exception as e:  # pragma: no cover
        pytest.skip("cupy unavailable: %s" % e)

    class _Stream:
        ptr = 0

    monkeypatch.setattr(kc, "_get_device_id", lambda: 0)
    monkeypatch.setattr(kc, "_get_current_stream", lambda: _Stream())
    if python_path:
        monkeypatch.setattr(kc, "_c_malloc", None)
        monkeypatch.setattr(kc, "allocator", kc._uncompiled_allocator)
    return kc


def fresh_interpreter(script, timeout=120):
    """Runs `script` in a fresh interpreter (this one's environment, this kmm on its path)."""
    import subprocess
    import sys
    import textwrap

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(kmm.__file__)),
                                                      env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def import_holding_its_producer(m1, m2, nbytes, byte=0x22):
    """A CAI import into `m2` of a buffer of `m1` filled with `byte`, which only the import keeps
    alive: in a one-element list, which a test clears to free the import."""
    src = m1.alloc(nbytes)
    src.copy_from_host(np.full(nbytes, byte, np.uint8))
    m1.synchronize()
    return [kmm.from_cuda_array_interface(src, manager=m2)]


def lib_call_with_window(monkeypatch, name, step, after):
    """Replaces kmm.manager's library by one whose `name` call runs `step()` right before or
    `after` the real call: another thread's step played in that window, in this thread, so that
    the interleaving is certain. Returns a function that puts the real library back."""
    import kmm.manager as manager_module

    real = manager_module._lib_

    def call(*args):
        if not after:
            step()
        rc = getattr(real, name)(*args)
        if after:
            step()
        return rc

    class Lib:
        def __getattr__(self, attr):
            return call if attr == name else getattr(real, attr)

    monkeypatch.setattr(manager_module, "_lib_", Lib())
    return lambda: monkeypatch.setattr(manager_module, "_lib_", real)
