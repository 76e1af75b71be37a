"""GPU tests of the plugins that need a fresh process: Numba kernels writing into Kmm memory, the
IPC handle of a sub-allocation opened in a second process, PyTorch computing on Kmm memory.
Skipped unless KMM_TEST_GPU=1."""

import os
import subprocess
import sys

import pytest

from conftest import requires_gpu

pytestmark = requires_gpu
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_gpu_worker.py")


def run(case, **env):
    e = dict(os.environ, **env)
    e.pop("KMM_BACKEND", None)
    r = subprocess.run([sys.executable, WORKER, case], capture_output=True, text=True, env=e, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr


def test_numba_kernels_write_kmm_memory():
    pytest.importorskip("numba.cuda")
    run("numba_kernel", NUMBA_CUDA_MEMORY_MANAGER="kmm.numba")


def test_numba_ipc_of_suballocation_in_second_process():
    pytest.importorskip("numba.cuda")
    run("numba_ipc", NUMBA_CUDA_MEMORY_MANAGER="kmm.numba")


def test_torch_computes_on_kmm_allocations():
    pytest.importorskip("torch")
    run("torch_allocator")
