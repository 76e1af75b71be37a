#!/usr/bin/env python3
"""Plants one known bug at a time in a scratch git worktree and runs the trust suite against it,
to show each test family catches the bug it targets. Never touches the main checkout.

    python3 tools/plant_bugs.py [--worktree /tmp/kmm-plant] [--only NAME]

Each plant: (name, file, old text, new text, test commands that must FAIL). Prints a table.
"""
import argparse, os, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PLANTS = [
    ("double-free-accepted", "rust/kmm/src/manager/mod.rs",
     "    pub fn free(&mut self, handle: u64, mode: FreeMode) -> Result<()> {\n",
     "    pub fn free(&mut self, handle: u64, mode: FreeMode) -> Result<()> {\n        if self.buffers.get(handle).is_err() {\n            return Ok(());\n        }\n",
     ["trust_model", "trust_stress"]),
    ("stats-not-decremented", "rust/kmm/src/pool/stats.rs",
     "        self.in_use -= bytes;\n        self.frees += 1;",
     "        self.frees += 1;",
     ["trust_model", "trust_faults", "trust_stress"]),
    ("missing-stream-wait-copy-buffer", "rust/kmm/src/manager/copy.rs",
     "        order(src_manager.backend.as_ref(), &src_manager.stream, &dst_manager.stream)?;",
     "",
     ["trust_model", "trust_stress"]),
    ("staging-slot-reused-before-dma", "rust/kmm/src/manager/staging.rs",
     "let waited = event.synchronize();",
     "let waited: Result<()> = Ok(());",
     ["trust_model", "trust_stress"]),
    ("deferred-free-loses-block-on-fault", "rust/kmm/src/pool/deferred.rs",
     "            Err(_) if self.stream.synchronize().is_ok() => self.inner.deallocate(block),\n            Err(_) => {\n                self.orphans.push(block);\n                Ok(())\n            }",
     "            Err(e) => Err(e),",
     ["trust_faults"]),
    ("sync-copy-returns-with-work-queued", "rust/kmm/src/manager/copy.rs",
     "                    for _ in 0..3 {\n                        if self.stream.synchronize().is_ok() {\n                            break;\n                        }\n                    }\n",
     "",
     ["trust_faults"]),
    ("compaction-moves-at-once-not-queued", "rust/kmm/src/manager/mod.rs",
     "unsafe { self.stream.copy_d2d(r.to.addr, r.from.addr, record.bytes.min(r.from.size))? };",
     "unsafe { std::ptr::copy_nonoverlapping(r.from.addr as *const u8, r.to.addr as *mut u8, record.bytes.min(r.from.size) as usize) };",
     ["abi_compaction"]),
    ("compaction-moves-mapped-buffers", "rust/kmm/src/manager/mod.rs",
     "self.buffers.at(owner).is_some_and(|r| r.pins == 0)",
     "self.buffers.at(owner).is_some()",
     ["abi_compaction"]),
    ("map-skips-the-move-fence", "rust/kmm/src/manager/mod.rs",
     "let wait = if r.settling { fence.clone() } else { None };",
     "let wait: Option<Arc<dyn Event>> = { let _ = fence; None };",
     ["abi_compaction"]),
    ("lanes-no-cross-lane-rung", "rust/kmm/src/manager/mod.rs",
     "(0..=last).filter(move |&lane| lane != own)",
     "(0..=last).filter(move |&lane| lane != own && false)",
     ["abi_lanes"]),
    ("lanes-trim-budget-per-lane", "rust/kmm/src/manager/mod.rs",
     "            budget = budget.saturating_sub(resource.counters().reserved);\n",
     "",
     ["abi_lanes"]),
    ("lanes-release-own-lane-only", "rust/kmm/src/manager/mod.rs",
     "        self.stream.synchronize()?;\n        self.trim_lanes(kind, 0)",
     "        self.stream.synchronize()?;\n        self.lane(registry::alloc_lane(kind, self.lane_mask())).resources[kind as usize].trim(0)",
     ["abi_lanes"]),
    ("summary-writes-past-buffer", "rust/kmm/src/ffi/manager.rs",
     "*buf.add(n) = 0;",
     "*buf.add(n + 1) = 0;",
     ["valgrind"]),
]

def sh(cmd, cwd, env=None, timeout=900):
    t = time.time()
    p = subprocess.run(cmd, cwd=cwd, shell=True, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, (p.stdout + p.stderr), time.time() - t

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worktree", default="/tmp/kmm-plant")
    ap.add_argument("--only")
    a = ap.parse_args()
    wt = a.worktree
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()
    if not os.path.isdir(wt):
        subprocess.run(["git", "worktree", "add", "--detach", wt, head], cwd=ROOT, check=True)
    # A worktree left by an earlier run is moved to this HEAD: plants are judged on today's code.
    subprocess.run(["git", "checkout", "-q", "--detach", head], cwd=wt, check=True)
    env = dict(os.environ, CARGO_TARGET_DIR=os.environ.get("KMM_PLANT_TARGET", "/tmp/kmm-plant-target"),
               CARGO_PROFILE_RELEASE_LTO="false", CARGO_PROFILE_RELEASE_CODEGEN_UNITS="16",
               KMM_TRUST_CASES="12", KMM_TRUST_STEPS="1500", KMM_TRUST_STRESS_SECS="4",
               KMM_TRUST_FAULT_ROUNDS="200", RUST_BACKTRACE="0")
    rows = []
    for name, path, old, new, tests in PLANTS:
        if a.only and a.only != name:
            continue
        f = os.path.join(wt, path)
        src = open(f).read()
        if old not in src:
            rows.append((name, "PLANT FAILED: pattern not found", "")); continue
        open(f, "w").write(src.replace(old, new, 1))
        try:
            for t in tests:
                if t == "valgrind":
                    rc, out, dt = sh("tools/valgrind_c_abi.sh", wt, env)
                else:
                    rc, out, dt = sh(f"cargo test -q --release -p kmm --test {t}", os.path.join(wt, "rust"), env)
                lines = [l for l in out.splitlines() if "panicked" in l or "seed" in l or "Invalid" in l
                         or "ERROR SUMMARY" in l or "leak" in l or "SIGSEGV" in l or "assertion" in l or "expects" in l]
                why = " | ".join(lines[:3])[:300]
                if "could not compile" in out:
                    verdict = "PLANT DID NOT BUILD"
                else:
                    verdict = "CAUGHT (failed)" if rc != 0 else "MISSED (passed)"
                rows.append((name, t, f"{verdict} in {dt:.0f}s: {why}"))
                print(rows[-1], flush=True)
        finally:
            open(f, "w").write(src)
    print("\n| planted bug | test | result |\n|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")

if __name__ == "__main__":
    main()
