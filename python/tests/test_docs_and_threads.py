import os
import re
import threading

import numpy as np
import pytest

from conftest import BACKEND

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "python.md")


def blocks():
    if not os.path.exists(DOC):
        pytest.skip("docs/python.md not found (not a source checkout)")
    with open(DOC) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


def test_doc_examples_compile():
    for code in blocks():
        compile(code, "docs/python.md", "exec")


def test_core_doc_example_runs(monkeypatch):
    monkeypatch.setenv("KMM_BACKEND", BACKEND)
    core = next(b for b in blocks() if "mgr.alloc(1 << 20)" in b)
    exec(compile(core, "docs/python.md", "exec"), {})


def test_threads_allocate_and_free(manager):
    errors = []

    def work():
        try:
            for i in range(200):
                b = manager.alloc(1024 + i)
                b.copy_from_host(np.full(256, i, np.int32))
                assert np.frombuffer(b.copy_to_host(nbytes=1024), np.int32)[0] == i
                b.close()
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    s = manager.stats("device")
    assert s["live_buffers"] == 0 and s["allocs"] == 800
