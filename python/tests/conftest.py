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
