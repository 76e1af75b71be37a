#!/usr/bin/env python3
"""Where the time of one allocation goes, per plugin: the whole library call (as in
bench/python_alloc.py), the allocator call alone, and a cProfile of the whole call.

    python bench/python_alloc_profile.py numba:kmm numba:rmm cupy:kmm cupy:default [--iters N]

Each variant runs in a fresh process, as in python_alloc.py (whose `setup` it reuses).
"""

import argparse
import cProfile
import os
import pstats
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import python_alloc as pa  # noqa: E402


def allocator_only(lib):
    """The library's call into its allocator, without building an array around it."""
    if lib == "numba":
        from numba import cuda

        ctx = cuda.current_context()
        return lambda: ctx.memalloc(pa.NBYTES)
    if lib == "cupy":
        import cupy

        return lambda: cupy.cuda.alloc(pa.NBYTES)
    return None


def per_op(f, iters):
    for _ in range(min(iters, 2000)):
        x = f()
        del x
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            x = f()
            del x
        best = min(best, (time.perf_counter_ns() - t0) / iters)
    return best


def worker(lib, variant, iters):
    pa.ensure_kmm_importable()
    alloc, detail = pa.setup(lib, variant)
    print("== %s/%s (%s)" % (lib, variant, detail))
    print("whole call      %8.0f ns/op" % per_op(alloc, iters))
    only = allocator_only(lib)
    if only is not None:
        print("allocator only  %8.0f ns/op" % per_op(only, iters))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        x = alloc()
        del x
    prof.disable()
    pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(18)
    sys.stdout.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variants", nargs="*", default=["numba:kmm", "numba:rmm", "cupy:kmm", "cupy:default"])
    p.add_argument("--iters", type=int, default=5000)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(*args.variants[0].split(":"), args.iters)
        return
    for v in args.variants:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", v, "--iters", str(args.iters)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        print(r.stdout)
        if r.returncode:
            print("exit %d: %s" % (r.returncode, r.stderr[-2000:]))


if __name__ == "__main__":
    main()
