#!/usr/bin/env python3
"""Allocation + free of one 1 MiB array per operation from Python, Kmm's plugins against RAPIDS
RMM's plugins and each library's own allocator, in one run on one GPU:

    numba.cuda.device_array   Numba default | Kmm (kmm.numba) | RMM (rmm.allocators.numba, pool)
                              | floor (a plugin handing out one held pointer: Numba's own cost)
    cupy.empty                CuPy pool     | Kmm (kmm.cupy)  | RMM (rmm_cupy_allocator, pool)
    torch.empty               caching alloc | Kmm (kmm.torch CUDAPluggableAllocator)
    kmm Manager.alloc         (the bare Python binding, for reference)

Each measurement runs in a fresh process (allocators must be chosen before a library's first
allocation), in rounds: one sample of every variant per round, `--repeats` rounds, the median
reported. Prints a table (ns/op and ratios) and writes JSON to the path given.

    python bench/python_alloc.py /tmp/python_alloc.json [--iters 20000] [--repeats 5] [--pin CPU]

The JSON is a working file (for bench/pooled_ratio.py), not kept in the repository: the figures
go into bench/results/python_alloc.md, replacing that page (device, date, commit, each ratio
against its target). The JSON records the commit from KMM_COMMIT or `git rev-parse`.

--numba-interleaved and --cupy-interleaved measure that library's variants in one process
instead, taking turns (the allocator is swapped between turns): samples that share the process's
luck, which removes the spread between fresh processes (on an H200 host, one process ran
cupy.empty at 2.3 us and the next at 4.0, whichever allocator it used).

--cupy-interleaved also runs `cupy/floor`, an allocator in Python that wraps one held pointer in
the MemoryPointer(UnownedMemory(...)) CuPy needs from any allocator outside its own pool; with
--allocator-only each operation is CuPy's call of the allocator alone (`cupy.cuda.memory.alloc`,
the result dropped), without the array cupy.empty builds around it.

--pin runs every sample on one CPU (sched_setaffinity): the samples then differ less from
process to process, since each does not land on whatever core the scheduler picked.

RMM is used when `import rmm` works (e.g. PYTHONPATH=/tmp/site after installing the rmm-cu13,
librmm-cu13 and rapids-logger wheels there); its variants are reported as unavailable otherwise.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
NBYTES = 1 << 20
TARGETS = {"rmm_speedup_min": 2.0, "own_pool_ratio_max": 1.5}

VARIANTS = [
    ("numba", "default"), ("numba", "kmm"), ("numba", "rmm"), ("numba", "floor"),
    ("cupy", "default"), ("cupy", "kmm"), ("cupy", "rmm"),
    ("torch", "default"), ("torch", "kmm"),
    ("kmm", "bare"),
]


def ensure_kmm_importable():
    try:
        import kmm  # noqa: F401
    except ImportError:
        sys.path.insert(0, os.path.join(REPO, "python"))


def rmm_pool():
    import rmm

    rmm.reinitialize(pool_allocator=True, initial_pool_size=1 << 30)
    return rmm


def floor_plugin():
    """An NBEP 7 plugin whose `memalloc` returns one pointer made at `initialize`, with nothing
    to free: what `device_array` costs around any plugin, the bound on a plugin's speedup."""
    from numba import cuda
    from numba.cuda.cudadrv import driver

    class FloorPlugin(cuda.HostOnlyCUDAMemoryManager):
        _held = None

        def initialize(self):  # Numba calls it at every device_array
            if self._held is None:
                self._held = driver.MemoryPointer(weakref.proxy(self.context), driver.driver.cuMemAlloc(NBYTES), NBYTES)

        def memalloc(self, size):
            return self._held

        def get_memory_info(self):
            return driver.MemoryInfo(free=1 << 30, total=1 << 30)

        def get_ipc_handle(self, memory):
            raise NotImplementedError

        @property
        def interface_version(self):
            return 1

    return FloorPlugin


def setup(lib, variant):
    """Returns a function that allocates one 1 MiB array (freed when dropped)."""
    if lib == "numba":
        if variant == "kmm":
            os.environ["NUMBA_CUDA_MEMORY_MANAGER"] = "kmm.numba"
        from numba import cuda

        if variant == "rmm":
            rmm_pool()
            from rmm.allocators.numba import RMMNumbaManager

            cuda.set_memory_manager(RMMNumbaManager)
        elif variant == "floor":
            cuda.set_memory_manager(floor_plugin())
        import numpy as np

        cuda.current_context()
        name = type(cuda.current_context().memory_manager).__name__
        return (lambda: cuda.device_array(NBYTES // 4, np.float32)), name
    if lib == "cupy":
        import cupy

        if variant == "kmm":
            import kmm.cupy

            cupy.cuda.set_allocator(kmm.cupy.allocator)
        elif variant == "rmm":
            rmm_pool()
            from rmm.allocators.cupy import rmm_cupy_allocator

            cupy.cuda.set_allocator(rmm_cupy_allocator)
        return (lambda: cupy.empty(NBYTES // 4, cupy.float32)), variant
    if lib == "torch":
        import torch

        if variant == "kmm":
            import kmm.torch

            torch.cuda.memory.change_current_allocator(kmm.torch.allocator())
        torch.cuda.init()
        return (lambda: torch.empty(NBYTES // 4, dtype=torch.float32, device="cuda")), variant
    if lib == "kmm":
        import kmm

        m = kmm.Manager(backend=os.environ.get("KMM_BENCH_BACKEND", "auto"))
        return (lambda: m.alloc(NBYTES)), m.backend
    raise ValueError(lib)


def synchronize(lib):
    if lib == "numba":
        from numba import cuda

        cuda.synchronize()
    elif lib == "cupy":
        import cupy

        cupy.cuda.Device().synchronize()
    elif lib == "torch":
        import torch

        torch.cuda.synchronize()


def worker(lib, variant, iters, repeats, pin):
    if pin is not None:
        os.sched_setaffinity(0, {pin})
    ensure_kmm_importable()
    alloc, detail = setup(lib, variant)
    for _ in range(min(iters, 2000)):  # warm up: pools grown, code paths compiled
        x = alloc()
        del x
    synchronize(lib)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            x = alloc()
            del x
        t1 = time.perf_counter_ns()
        samples.append((t1 - t0) / iters)
    synchronize(lib)
    samples.sort()
    return {"ns_per_op": samples[len(samples) // 2], "min_ns_per_op": samples[0], "samples": samples, "detail": detail}


NUMBA_PLUGINS = ("default", "kmm", "rmm", "floor")


def numba_interleaved(iters, rounds, pin):
    """All Numba variants in one process and one context, taking turns: the context's memory
    manager is swapped for the next plugin's (one instance each, made once). Samples seconds
    apart in one process share that process's luck (where its memory and code landed, what the
    machine was doing), which fresh-process samples do not; the order turns each round."""
    if pin is not None:
        os.sched_setaffinity(0, {pin})
    ensure_kmm_importable()
    import numpy as np
    from numba import cuda
    from numba.cuda.cudadrv import driver

    import kmm.numba

    rmm_pool()
    from rmm.allocators.numba import RMMNumbaManager

    ctx = cuda.current_context()
    classes = {"default": driver.NumbaCUDAMemoryManager, "kmm": kmm.numba.KmmNumbaMemoryManager,
               "rmm": RMMNumbaManager, "floor": floor_plugin()}
    plugins = {}
    for name, cls in classes.items():
        plugins[name] = cls(context=ctx)
        plugins[name].initialize()
    samples = take_turns(
        NUMBA_PLUGINS, rounds,
        iters_of=lambda name: iters // 10 if name == "default" else iters,  # Numba's own is 10x slower
        select=lambda name: setattr(ctx, "memory_manager", plugins[name]),
        selected=lambda name: ctx.memory_manager is plugins[name],
        alloc=lambda: cuda.device_array(NBYTES // 4, np.float32),
        synchronize=cuda.synchronize)
    return {"numba/" + name: v for name, v in samples.items()}


def take_turns(names, rounds, iters_of, select, selected, alloc, synchronize):
    """Rounds in which each variant of `names` takes a turn: `select(name)`, a warm-up, then
    `iters_of(name)` timed allocations; the order turns each round. ns/op per variant, a sample
    per round; `selected(name)` must still hold after its turn (nothing swapped it meanwhile)."""
    samples = {name: [] for name in names}
    order = list(names)
    for r in range(rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            select(name)
            n = iters_of(name)
            for _ in range(min(n, 2000)):
                x = alloc()
                del x
            synchronize()
            t0 = time.perf_counter_ns()
            for _ in range(n):
                x = alloc()
                del x
            t1 = time.perf_counter_ns()
            samples[name].append((t1 - t0) / n)
            assert selected(name), name
            synchronize()
    return samples


CUPY_ALLOCATORS = ("default", "kmm", "rmm", "floor")


def cupy_floor_allocator():
    """A CuPy allocator, in Python, that wraps one pointer made at the start in the
    `MemoryPointer(UnownedMemory(...))` CuPy needs from an outside allocator, with nothing to
    free: what CuPy costs around any allocator written outside CuPy's own pool."""
    import cupy

    held = cupy.cuda.memory._malloc(NBYTES)  # CuPy's plain cudaMalloc, kept for the whole run
    memory, pointer, ptr, device = cupy.cuda.memory.UnownedMemory, cupy.cuda.memory.MemoryPointer, held.ptr, held.device_id
    return lambda nbytes: pointer(memory(ptr, nbytes, held, device), 0)


def cupy_interleaved(iters, rounds, pin, allocator_only=False):
    """The CuPy variants in one process, taking turns (`cupy.cuda.set_allocator` swapped between
    CuPy's pool, Kmm's allocator, RMM's and the floor, each made once), as `numba_interleaved`
    does for Numba: samples that share the process's luck, the order turned each round.
    `allocator_only`: each operation calls the allocator and drops what it returned, without
    the array `cupy.empty` builds around it: the allocators' own costs."""
    if pin is not None:
        os.sched_setaffinity(0, {pin})
    ensure_kmm_importable()
    import cupy

    import kmm.cupy

    rmm_pool()
    from rmm.allocators.cupy import rmm_cupy_allocator

    allocators = {"default": cupy.get_default_memory_pool().malloc, "kmm": kmm.cupy.allocator,
                  "rmm": rmm_cupy_allocator, "floor": cupy_floor_allocator()}
    if allocator_only:
        alloc = lambda: cupy.cuda.memory.alloc(NBYTES)  # noqa: E731 (CuPy's call of the allocator set)
    else:
        alloc = lambda: cupy.empty(NBYTES // 4, cupy.float32)  # noqa: E731
    samples = take_turns(
        CUPY_ALLOCATORS, rounds,
        iters_of=lambda name: iters,
        select=lambda name: cupy.cuda.set_allocator(allocators[name]),
        selected=lambda name: cupy.cuda.get_allocator() is allocators[name],
        alloc=alloc,
        synchronize=lambda: cupy.cuda.Device().synchronize())
    return {"cupy/" + name: v for name, v in samples.items()}


INTERLEAVED = {"numba": numba_interleaved, "cupy": cupy_interleaved}


def run_variant(lib, variant, args, repeats=1):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", lib, variant,
           "--iters", str(args.iters), "--repeats", str(repeats)]
    cmd += (["--allocator-only"] if args.allocator_only else []) + ([] if args.pin is None else ["--pin", str(args.pin)])
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after %d s" % args.timeout}
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
    return {"error": "exit %d: %s" % (r.returncode, " | ".join(tail))}


def device_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0]
    except Exception:
        return "unknown"


def versions():
    v = {"python": platform.python_version()}
    for mod in ("numpy", "numba", "numba_cuda", "cupy", "torch", "rmm"):
        try:
            m = __import__(mod)
            v[mod] = getattr(m, "__version__", "?")
        except Exception as e:
            v[mod] = "unavailable (%s)" % type(e).__name__
    return v


def plugin_calls_module():
    """Which implementation of kmm.numba's per-allocation calls this run used."""
    try:
        ensure_kmm_importable()
        import kmm.numba

        return kmm.numba._calls.__name__
    except Exception as e:
        return "unavailable (%s)" % type(e).__name__


def ratios(results):
    """Each ratio is the median over rounds of the ratio within a round (both samples taken
    minutes apart at most), which a drifting machine disturbs less than a ratio of medians."""

    def paired(a, b):
        ra, rb = results.get(a, {}).get("samples"), results.get(b, {}).get("samples")
        if not ra or not rb:
            return None
        per_round = sorted(x / y for x, y in zip(ra, rb))
        return per_round[len(per_round) // 2]

    out = {}
    v = paired("numba/rmm", "numba/floor")
    if v:
        out["numba: RMM / floor (any plugin's best)"] = {"value": v}
    v = paired("cupy/floor", "cupy/default")
    if v:
        out["cupy: floor / own pool (any outside allocator's best)"] = {"value": v}
    for lib in ("numba", "cupy"):
        v = paired("%s/rmm" % lib, "%s/kmm" % lib)
        if v:
            out["%s: RMM / Kmm (speedup)" % lib] = {"value": v, "target": ">= %.1f" % TARGETS["rmm_speedup_min"],
                                                     "met": v >= TARGETS["rmm_speedup_min"]}
    for lib in ("numba", "cupy", "torch"):
        v = paired("%s/kmm" % lib, "%s/default" % lib)
        if v:
            entry = {"value": v}
            if lib in ("cupy", "torch"):
                entry.update(target="<= %.1f" % TARGETS["own_pool_ratio_max"], met=v <= TARGETS["own_pool_ratio_max"])
            out["%s: Kmm / own allocator" % lib] = entry
    return out


def commit():
    """The commit being measured: KMM_COMMIT (the GPU machine has no git), else git's HEAD."""
    if os.environ.get("KMM_COMMIT"):
        return os.environ["KMM_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json_out", nargs="?", help="where to write the JSON results")
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--pin", type=int, help="run every sample on this CPU")
    p.add_argument("--only", default="", help="comma-separated libraries (numba,cupy,torch,kmm)")
    p.add_argument("--numba-interleaved", action="store_true",
                   help="the Numba variants take turns in one process instead of a process per sample")
    p.add_argument("--cupy-interleaved", action="store_true",
                   help="the CuPy variants take turns in one process instead of a process per sample")
    p.add_argument("--allocator-only", action="store_true",
                   help="with --cupy-interleaved: time CuPy's call of the allocator alone (no array around it)")
    p.add_argument("--worker", nargs=2, metavar=("LIB", "VARIANT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        if args.worker[1] == "interleaved":
            extra = {"allocator_only": True} if args.allocator_only else {}
            print(json.dumps(INTERLEAVED[args.worker[0]](args.iters, args.repeats, args.pin, **extra)))
        else:
            print(json.dumps(worker(args.worker[0], args.worker[1], args.iters, args.repeats, args.pin)))
        return
    if not args.json_out:
        p.error("give the path of the JSON output")
    if args.allocator_only and not args.cupy_interleaved:
        p.error("--allocator-only times CuPy's allocators: give --cupy-interleaved (and --only cupy)")
    if os.path.abspath(args.json_out).startswith(os.path.join(HERE, "results") + os.sep):
        p.error("bench/results/ holds one page per benchmark, no per-run files: write the JSON "
                "elsewhere (e.g. /tmp) and put the figures in bench/results/python_alloc.md")
    only = set(filter(None, args.only.split(",")))
    chosen = [v for v in VARIANTS if not only or v[0] in only]
    # Rounds: every variant once per round, each in a fresh process, so a drift of the machine
    # (other tenants, clocks) spreads over all variants instead of favouring the ones run early.
    samples = {"%s/%s" % v: [] for v in chosen}
    errors, details = {}, {}
    interleaved = {"numba": args.numba_interleaved, "cupy": args.cupy_interleaved}
    for lib in [lib for lib, on in interleaved.items() if on and any(v[0] == lib for v in chosen)]:
        chosen = [v for v in chosen if v[0] != lib]
        r = run_variant(lib, "interleaved", args, repeats=args.repeats)
        samples.update({key: [] for key in r if key.startswith(lib + "/")})  # variants only run here (cupy/floor)
        for key in samples:
            if key.startswith(lib + "/"):
                if "error" in r:
                    errors[key] = r["error"]
                else:
                    samples[key], details[key] = r[key], "interleaved in one process"
        for i in range(args.repeats if "error" not in r else 0):
            print("  %s turn %d: %s" % (lib, i + 1, ", ".join("%s %.0f" % (k, r[k][i]) for k in sorted(r))), flush=True)
    for round_ in range(args.repeats):
        for lib, variant in chosen:
            key = "%s/%s" % (lib, variant)
            if key in errors:
                continue
            r = run_variant(lib, variant, args)
            if "error" in r:
                errors[key] = r["error"]
                continue
            samples[key] += r["samples"]
            details[key] = r["detail"]
        keys = ["%s/%s" % v for v in chosen]
        if keys:
            print("  round %d: %s" % (round_ + 1, ", ".join("%s %.0f" % (k, samples[k][-1]) for k in keys if samples[k])),
                  flush=True)
    results = {}
    for key, v in samples.items():
        if key in errors:
            results[key] = {"error": errors[key]}
        else:
            ranked = sorted(v)  # samples stay in round order, for the paired ratios
            results[key] = {"ns_per_op": ranked[len(v) // 2], "min_ns_per_op": ranked[0], "samples": v,
                            "detail": details[key]}
    report = {
        "benchmark": "python_alloc: allocate + free one 1 MiB array per operation",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device_name(),
        "commit": commit(),
        "host": platform.node(),
        "versions": versions(),
        "iters": args.iters,
        "repeats": args.repeats,
        "pinned_to_cpu": args.pin,
        "numba_interleaved": args.numba_interleaved,
        "cupy_interleaved": args.cupy_interleaved,
        "allocator_only": args.allocator_only,
        "numba_plugin_calls": plugin_calls_module(),
        "results": results,
        "ratios": ratios(results),
    }
    print()
    print("%-16s %12s %12s" % ("variant", "ns/op", "min ns/op"))
    for key, r in results.items():
        if "ns_per_op" in r:
            print("%-16s %12.0f %12.0f" % (key, r["ns_per_op"], r["min_ns_per_op"]))
        else:
            print("%-16s %12s   %s" % (key, "-", r["error"][:90]))
    print()
    for name, r in report["ratios"].items():
        met = "" if "met" not in r else ("  target %s: %s" % (r["target"], "met" if r["met"] else "NOT met"))
        print("%-40s %6.2f%s" % (name, r["value"], met))
    print("\ndevice: %s; kmm.numba calls: %s; pinned to CPU: %s" % (report["device"], report["numba_plugin_calls"], args.pin))
    print("date: %s; commit: %s" % (report["date"], report["commit"]))
    os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
    with open(args.json_out, "w") as f:
        json.dump(report, f, indent=2)
    print("wrote %s" % args.json_out)


if __name__ == "__main__":
    main()
