"""Helpers of the tests that run a script in a fresh interpreter to watch what the cyclic garbage
collector does to kmm's exports (test_adversarial_review_export_*.py, round 6)."""

import os
import subprocess
import sys
import textwrap

import kmm
from conftest import BACKEND

#: The kind `host_view` can show: device memory on the host backend, pinned otherwise.
KIND = "device" if BACKEND == "host" else "pinned"
PRELUDE = """
import gc, sys, os, time, threading, weakref, ctypes, copy, random
import numpy as np
BACKEND, KIND = %r, %r
""" % (BACKEND, KIND)
#: `#WATCHED` in a script: the watch list, the running count and the set of tokens whose holders
#: were not found (closure cells of kmm._lifetime), as `watched`, `running` and `tried`.
WATCHED = """
import kmm._lifetime as _lt
_fv = dict(zip(_lt.end_export.__code__.co_freevars, [c.cell_contents for c in _lt.end_export.__closure__]))
watched, running = _fv["watched"], _fv["running"]
_gv = dict(zip(_lt._on_gc.__code__.co_freevars, [c.cell_contents for c in _lt._on_gc.__closure__]))
tried = _gv["unmovable"]
"""
#: `#KEEP_AND_REUSE` in a script: a finalizer keeps a host_view past the collection; prints
#: same_address / new_buffer (whether the next buffer got its address, and what a write through
#: the kept view did to it).
KEEP_AND_REUSE = """
m = kmm.Manager(backend=BACKEND)
b = m.alloc(1 << 20)
addr = b.ptr
mv = b.host_view()
kept = []
class Holder:
    def __del__(self):
        kept.append(self.mv)
h = Holder(); h.me = h; h.mv = mv
del b, mv, h
gc.collect()
nb = m.alloc(1 << 20)
nb.copy_from_host(np.zeros(1 << 20, np.uint8))
print("same_address", nb.ptr == addr)
kept[0][:4] = b"\\xab\\xab\\xab\\xab"
print("new_buffer", bytes(nb.copy_to_host(nbytes=4)))
"""


def run(script, timeout=120, prelude=True):
    """Runs `script` (after PRELUDE, with #WATCHED and #KEEP_AND_REUSE expanded) in a fresh
    interpreter (this one's environment, this kmm on its path)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(kmm.__file__)),
                                                      env.get("PYTHONPATH")]))
    script = textwrap.dedent(script).replace("#WATCHED\n", WATCHED).replace("#KEEP_AND_REUSE\n", KEEP_AND_REUSE)
    return subprocess.run([sys.executable, "-c", (PRELUDE if prelude else "") + script], capture_output=True,
                          text=True, timeout=timeout, env=env)


def lines(r):
    return dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)


def ok(r):
    assert r.returncode == 0, "exit status %d\nstdout:\n%s\nstderr:\n%s" % (r.returncode, r.stdout[-3000:],
                                                                            r.stderr[-3000:])
    return lines(r)
