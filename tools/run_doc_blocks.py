#!/usr/bin/env python3
"""Runs the code blocks of README.md and docs/*.md, the way a reader would, and fails on a block
that fails or that nobody runs.

    python3 tools/run_doc_blocks.py [--list] [--gpu] [PAGE.md ...]

Every fenced block says what it is by its info string:
  ```julia   run by test/docs.jl inside the Julia suite (listed here, not run)
  ```python  run here: python3 (this interpreter), cwd the repository, PYTHONPATH=python
  ```sh      run here: bash -euo pipefail, cwd the repository
  ```text    not code (a layout, an output); never run
Any other info string (an empty one too) is an error: a block must say how it is checked.

A block that cannot run in CI carries a marker on the line right above its opening fence, with
its reason; test/docs.jl reads the same markers:
  <!-- gpu: what it needs -->      needs a GPU (CUDA); run by hand on the GPU machine
  <!-- no-run: why -->             not run, e.g. it is this runner's own caller or a long job

Blocks run in a fresh home folder (HOME is a temporary folder, JULIA_DEPOT_PATH, JULIA_PROJECT
and JULIA_LOAD_PATH are unset: a new Julia depot, as on a newcomer's machine; CARGO_HOME,
RUSTUP_HOME, PYENV_ROOT and pip's cache keep pointing at the real ones). `<this repository>` in
a sh block stands for this checkout (its committed HEAD, when the block clones it); such a
block runs in a scratch folder instead of the repository. A block identical to one already run
is not run again. Ends with one summary line, "docs: ..."; exits 1 when a block failed or a
page has an unlabelled block or a bad marker.

--gpu (on the GPU machine, which has Python with the GPU libraries but no Rust or Julia): runs
only the python blocks marked gpu, with PYTHONPATH=python as above (KMM_LIBRARY naming a
libkmm.so built here, and python/kmm/_plugin_calls.abi3.so carried along), and lists the rest.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^```(\S*)(.*)$")
MARKER = re.compile(r"^<!--\s*(gpu|no-run)\s*:\s*(.*?)\s*-->\s*$")
LANGS = ("julia", "python", "sh", "text")
PLACEHOLDER = "<this repository>"
TIMEOUT_S = 1200


class Block:
    def __init__(self, page, line, lang, code, marker, reason):
        self.page, self.line, self.lang, self.code = page, line, lang, code
        self.marker, self.reason = marker, reason

    def where(self):
        return "%s:%d" % (self.page, self.line)


def parse(page):
    """The page's fenced blocks and the problems of their labels."""
    blocks, problems = [], []
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        if j == len(lines):
            problems.append("%s:%d: the block never closes" % (page, start + 1))
            break
        mk = MARKER.match(lines[start - 1]) if start > 0 else None
        marker, reason = (mk.group(1), mk.group(2)) if mk else (None, None)
        where = "%s:%d" % (page, start + 1)
        if lang not in LANGS:
            problems.append("%s: info string %r; use one of %s" % (where, lang, ", ".join(LANGS)))
        elif marker and not reason:
            problems.append("%s: the %s marker gives no reason" % (where, marker))
        elif marker and lang == "text":
            problems.append("%s: a text block is never run; drop the %s marker" % (where, marker))
        blocks.append(Block(page, start + 1, lang, "\n".join(lines[start + 1:j]) + "\n", marker, reason))
        i = j + 1
    return blocks, problems


def block_env(home):
    real_home = os.path.expanduser("~")
    env = dict(os.environ)
    for var in ("JULIA_DEPOT_PATH", "JULIA_PROJECT", "JULIA_LOAD_PATH"):
        env.pop(var, None)
    # toolchains installed under the real home stay reachable from the fresh one
    for var, default in (("CARGO_HOME", ".cargo"), ("RUSTUP_HOME", ".rustup"),
                         ("PYENV_ROOT", ".pyenv"), ("PIP_CACHE_DIR", ".cache/pip")):
        path = os.path.join(real_home, default)
        if var not in env and os.path.isdir(path):
            env[var] = path
    env["HOME"] = home
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "python"), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run(block, home, scratch):
    """Runs one block; returns (ok, seconds)."""
    code, cwd = block.code, ROOT
    if block.lang == "python":
        env = block_env(home)
        cmd = [sys.executable, "-c", code]
    else:
        env = block_env(home)
        env.pop("PYTHONPATH")  # a shell block sets up its own Python, as the reader would
        if PLACEHOLDER in code:
            code, cwd = code.replace(PLACEHOLDER, ROOT), tempfile.mkdtemp(dir=scratch)
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=TIMEOUT_S)
        out, ok = p.stdout.decode(errors="replace"), p.returncode == 0
    except subprocess.TimeoutExpired as e:
        out, ok = (e.stdout or b"").decode(errors="replace") + "\n(timed out after %d s)" % TIMEOUT_S, False
    for line in out.rstrip("\n").split("\n") if out.strip() else []:
        print("    " + line)
    return ok, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("pages", nargs="*", help="pages relative to the repository (default: README.md docs/*.md)")
    ap.add_argument("--list", action="store_true", help="list the blocks and what happens to each")
    ap.add_argument("--gpu", action="store_true", help="run only the python blocks marked gpu (on a GPU machine)")
    args = ap.parse_args()
    pages = args.pages or ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))

    blocks, problems = [], []
    for page in pages:
        b, p = parse(page)
        blocks += b
        problems += p
    for p in problems:
        print("=== label problem: " + p)

    home = tempfile.mkdtemp(prefix="kmm-doc-home-")
    scratch = tempfile.mkdtemp(prefix="kmm-doc-scratch-")
    counts = dict(passed=0, failed=0, same=0, gpu=0, norun=0, julia=0, text=0)
    done = {}
    failed = []
    try:
        for b in blocks:
            head = "=== %s %s" % (b.where(), b.lang)
            if b.lang == "text" or b.lang not in LANGS:
                counts["text"] += b.lang == "text"
                continue
            if args.gpu and not (b.marker == "gpu" and b.lang == "python"):
                counts["norun"] += 1
                print("%s: not run (--gpu runs the python blocks marked gpu only)" % head)
            elif b.marker == "gpu" and not args.gpu:
                counts["gpu"] += 1
                print("%s: needs a GPU, not run (%s)" % (head, b.reason))
            elif b.marker == "no-run":
                counts["norun"] += 1
                print("%s: not run (%s)" % (head, b.reason))
            elif b.lang == "julia":
                counts["julia"] += 1
                print("%s: run by test/docs.jl" % head)
            elif (b.lang, b.code) in done:
                counts["same"] += 1
                print("%s: identical to %s, not run again" % (head, done[(b.lang, b.code)]))
            elif args.list:
                done[(b.lang, b.code)] = b.where()
                print("%s: would run" % head)
            else:
                print("%s: running" % head, flush=True)
                ok, secs = run(b, home, scratch)
                done[(b.lang, b.code)] = b.where()
                counts["passed" if ok else "failed"] += 1
                if not ok:
                    failed.append(b.where())
                print("%s: %s (%.1f s)" % (head, "ok" if ok else "FAILED", secs), flush=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)

    if failed:
        print("=== failed: " + ", ".join(failed))
    print("docs: %d passed, %d failed (python and sh blocks of %d pages); %d identical to one run, "
          "%d need a GPU, %d marked no-run, %d julia left to test/docs.jl, %d label problems"
          % (counts["passed"], counts["failed"], len(pages), counts["same"], counts["gpu"],
             counts["norun"], counts["julia"], len(problems)))
    return 1 if failed or problems else 0


if __name__ == "__main__":
    sys.exit(main())
