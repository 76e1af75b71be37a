import os

import pytest

import kmm

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
