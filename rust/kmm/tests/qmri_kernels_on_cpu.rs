//! The CUDA C of the qMRI kernels, compiled as C++ with a small CUDA shim and run on the CPU
//! (threads stand in for the lanes of an atom, shuffles go through a barrier), against the
//! Rust reference. Guards the kernels' math and lane exchange in CI, where there is no GPU.
//! Skipped when no C++ compiler (`c++`) is found.

#[path = "qmri_common/harness.rs"]
mod harness;
use harness::have_cxx;
use kmm::qmri::{cpu, Atom, Fisp, Pssfp};
use std::path::{Path, PathBuf};
use std::process::Command;

fn build(ns: u32, lanes: u32, dir: &Path) -> Option<PathBuf> {
    compile("kernel_harness.cpp", ns, lanes, dir)
}

fn compile(source: &str, ns: u32, lanes: u32, dir: &Path) -> Option<PathBuf> {
    harness::compile(source, "kernels.cu", &[("NS", ns), ("LANES", lanes)], dir)
}

fn f32s(buf: &mut Vec<u8>, vals: impl IntoIterator<Item = f32>) {
    for v in vals {
        buf.extend(v.to_le_bytes());
    }
}

fn worst(g: &[[f32; 2]], w: &[[f32; 2]], ntr: usize) -> f64 {
    g.chunks(ntr)
        .zip(w.chunks(ntr))
        .map(|(g, w)| {
            let (mut n, mut d) = (0f64, 0f64);
            for (x, y) in g.iter().zip(w) {
                n += ((x[0] - y[0]) as f64).powi(2) + ((x[1] - y[1]) as f64).powi(2);
                d += (y[0] as f64).powi(2) + (y[1] as f64).powi(2);
            }
            (n / d).sqrt()
        })
        .fold(0.0, f64::max)
}

#[test]
fn kernels_run_on_the_cpu_equal_the_reference() {
    if !have_cxx() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("kmm-kernel-harness-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ntr = 200;
    let mut atoms = Vec::new();
    for t1 in [0.3f32, 2.5] {
        for t2 in [0.02f32, 0.25] {
            for (b1, b0) in [(1.0f32, 0.0f32), (0.8, 12.0), (1.15, -25.0)] {
                atoms.push(Atom { t1, t2, b1, b0 });
            }
        }
    }
    atoms.push(Atom { t1: f32::INFINITY, t2: f32::INFINITY, b1: 1.0, b0: 3.0 });
    atoms.push(Atom { t1: 1.0, t2: f32::INFINITY, b1: 1.0, b0: -7.0 });
    // Flips past pi (up to 3.75 rad).
    atoms.push(Atom { t1: 1.2, t2: 0.08, b1: 3.0, b0: 5.0 });
    let flip: Vec<f32> = (0..ntr).map(|n| (n as f32 / 40.0).sin().abs() * 1.2 + 0.05).collect();
    // A linear phase ramp alone is an off-resonance, which a spoiled sequence's signal does not
    // see; the quadratic part (RF spoiling) makes each pulse's phase matter.
    let phase: Vec<f32> = (0..ntr).map(|n| 0.07 * n as f32 + 0.013 * (n * n) as f32).collect();
    let pssfp = Pssfp {
        flip: flip.clone(),
        phase: phase.clone(),
        rf_shape: vec![0.1; 10],
        z: vec![-0.05, 0.0, 0.05],
        dt_ex: 1e-4,
        dt_inv: 0.015,
        dt_pr: 0.002,
        gz_ex: 2.0,
        gz_pr: -10.0,
    };
    // (Ns, lanes, profile positions): the default layouts (8 and 32 states a thread), padded
    // states, more lanes than states.
    for (ns, lanes, nprof) in [(32u32, 4u32, 0usize), (32, 1, 0), (64, 2, 2), (32, 2, 2), (32, 32, 0), (17, 4, 2), (5, 1, 0), (3, 4, 0)] {
        let Some(exe) = build(ns, lanes, &dir) else {
            eprintln!("skipped: c++ did not run");
            return;
        };
        let profile: Vec<f32> = (0..ntr * nprof).map(|i| 0.6 + 0.4 * ((i % ntr) as f32 / ntr as f32) + 0.1 * (i / ntr) as f32).collect();
        let fisp = Fisp { flip: flip.clone(), phase: phase.clone(), tr: 0.0087, te: 0.0035, ti: 0.015, max_state: ns, profile };
        let np = fisp.positions();
        let mut buf = Vec::new();
        for v in [atoms.len() as i32, ntr as i32, np as i32, pssfp.rf_shape.len() as i32, pssfp.z.len() as i32] {
            buf.extend(v.to_le_bytes());
        }
        f32s(&mut buf, atoms.iter().flat_map(|a| [a.t1, a.t2, a.b1, a.b0]));
        for p in 0..np {
            for n in 0..ntr {
                let (s, c) = (phase[n] as f64).sin_cos();
                f32s(&mut buf, [flip[n] * fisp.scale(n, p), c as f32, s as f32, 0.0]);
            }
        }
        for n in 0..ntr {
            let (s, c) = (phase[n] as f64).sin_cos();
            f32s(&mut buf, [flip[n], c as f32, s as f32, 0.0]);
        }
        f32s(&mut buf, pssfp.rf_shape.iter().chain(&pssfp.z).copied());
        f32s(&mut buf, [fisp.tr, fisp.te, fisp.ti, pssfp.dt_ex, pssfp.dt_inv, pssfp.dt_pr, pssfp.gz_ex, pssfp.gz_pr]);
        let (input, output) = (dir.join("in.bin"), dir.join("out.bin"));
        std::fs::write(&input, &buf).unwrap();
        assert!(Command::new(&exe).arg(&input).arg(&output).status().unwrap().success());
        let raw = std::fs::read(&output).unwrap();
        let vals: Vec<[f32; 2]> = raw
            .chunks(8)
            .map(|c| [f32::from_le_bytes(c[0..4].try_into().unwrap()), f32::from_le_bytes(c[4..8].try_into().unwrap())])
            .collect();
        let (gf, gp) = vals.split_at(atoms.len() * ntr);
        let mut wf = vec![[0f32; 2]; gf.len()];
        let mut wp = vec![[0f32; 2]; gp.len()];
        cpu::simulate_fisp(&fisp, &atoms, &mut wf);
        cpu::simulate_pssfp(&pssfp, &atoms, &mut wp);
        let (ef, ep) = (worst(gf, &wf, ntr), worst(gp, &wp, ntr));
        println!("Ns {ns}, {lanes} lanes, {nprof} profile positions: kernels on the CPU vs reference: FISP {ef:.2e}, pSSFP {ep:.2e}");
        assert!(ef < 1e-4 && ep < 1e-4, "Ns {ns} lanes {lanes}: FISP {ef:e}, pSSFP {ep:e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn bytes_of<T: Copy>(v: &[T]) -> &[u8] {
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

#[test]
fn argmax_kernel_run_on_the_cpu_equals_the_reference() {
    if !have_cxx() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("kmm-argmax-harness-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(exe) = compile("argmax_harness.cpp", 32, 4, &dir) else { return };
    // A small dictionary with a zero atom, a NaN atom and a duplicate (ties go to the lower
    // index); voxels 5 and 6 are a zero and a NaN signal, which match nothing.
    let (ntr, natoms, nvox, offset) = (24usize, 301usize, 7usize, 1000u64);
    let mut dict: Vec<[f32; 2]> = (0..ntr * natoms).map(|i| [((i * 7919) % 97) as f32 / 50.0 - 1.0, ((i * 104729) % 89) as f32 / 45.0 - 1.0]).collect();
    for t in 0..ntr {
        dict[5 * ntr + t] = [0.0, 0.0];
        dict[9 * ntr + t] = [dict[8 * ntr + t][0] * 2.0, dict[8 * ntr + t][1] * 2.0]; // exact scaling: an exact tie
    }
    dict[7 * ntr + 3] = [f32::NAN, 0.0];
    let picks = [8usize, 0, 150, 300, 9];
    let mut sig: Vec<[f32; 2]> = picks.iter().flat_map(|&j| dict[j * ntr..(j + 1) * ntr].iter().map(|c| [0.5 * c[0] - 0.2 * c[1], 0.5 * c[1] + 0.2 * c[0]])).collect();
    sig.extend(vec![[0.0f32, 0.0]; ntr]);
    sig.extend(vec![[f32::NAN, 1.0]; ntr]);
    let mut c = vec![[0f32; 2]; natoms * nvox];
    for v in 0..nvox {
        for j in 0..natoms {
            let (mut re, mut im) = (0f64, 0f64);
            for t in 0..ntr {
                let (a, b) = (dict[j * ntr + t], sig[v * ntr + t]);
                re += a[0] as f64 * b[0] as f64 + a[1] as f64 * b[1] as f64;
                im += a[0] as f64 * b[1] as f64 - a[1] as f64 * b[0] as f64;
            }
            c[v * natoms + j] = [re as f32, im as f32];
        }
    }
    let params: Vec<[f32; 4]> = (0..offset as usize + natoms).map(|i| [i as f32, 0.5, 1.0, 0.0]).collect();
    let run = |accumulate: i64, score0: &[f32], dict: &[[f32; 2]], c: &[[f32; 2]]| {
        let mut buf = Vec::new();
        for v in [ntr as i64, natoms as i64, nvox as i64, offset as i64, accumulate] {
            buf.extend(v.to_le_bytes());
        }
        buf.extend(bytes_of(dict));
        buf.extend(bytes_of(&sig));
        buf.extend(bytes_of(c));
        buf.extend(bytes_of(&params));
        buf.extend(bytes_of(&vec![-7i32; nvox]));
        buf.extend(bytes_of(score0));
        buf.extend(bytes_of(&vec![[0f32; 2]; nvox]));
        buf.extend(bytes_of(&vec![[0f32; 4]; nvox]));
        let (input, output) = (dir.join("in.bin"), dir.join("out.bin"));
        std::fs::write(&input, &buf).unwrap();
        assert!(Command::new(&exe).arg(&input).arg(&output).status().unwrap().success());
        let raw = std::fs::read(&output).unwrap();
        let f = |i: usize| f32::from_le_bytes(raw[i..i + 4].try_into().unwrap());
        let inv: Vec<f32> = (0..natoms).map(|j| f(4 * j)).collect();
        let base = 4 * natoms;
        let index: Vec<i32> = (0..nvox).map(|v| f(base + 4 * v).to_bits() as i32).collect();
        let score: Vec<f32> = (0..nvox).map(|v| f(base + 4 * nvox + 4 * v)).collect();
        let pd: Vec<[f32; 2]> = (0..nvox).map(|v| [f(base + 8 * nvox + 8 * v), f(base + 8 * nvox + 8 * v + 4)]).collect();
        let outp: Vec<f32> = (0..nvox).map(|v| f(base + 16 * nvox + 16 * v)).collect();
        (inv, index, score, pd, outp)
    };
    let want = cpu::match_dictionary(&dict, ntr, &sig);
    let (inv, index, score, pd, outp) = run(0, &vec![0.0; nvox], &dict, &c);
    assert_eq!(inv[5], 0.0, "a zero atom gets a zero inverse norm");
    assert_eq!(inv[7], 0.0, "a NaN atom gets a zero inverse norm");
    assert_eq!((want[5].index, want[6].index), (-1, -1), "zero and NaN signals match nothing");
    for v in 0..nvox {
        let global = if want[v].index < 0 { -1 } else { want[v].index as i64 + offset as i64 };
        assert_eq!(index[v] as i64, global, "voxel {v}");
        assert_eq!(outp[v], global.max(0) as f32, "voxel {v}: parameters of the global index (zeros when unmatched)");
        assert!((score[v] - want[v].score).abs() < 1e-5, "voxel {v}: score {} vs {}", score[v], want[v].score);
        let d = ((pd[v][0] - want[v].pd[0]).powi(2) + (pd[v][1] - want[v].pd[1]).powi(2)).sqrt();
        assert!(d <= 1e-4 * (want[v].pd[0].hypot(want[v].pd[1])), "voxel {v}: pd {:?} vs {:?}", pd[v], want[v].pd);
    }
    assert_eq!(want[4].index, 8, "the duplicate atom 9 loses the tie to atom 8");
    // Accumulate: earlier scores of 2 (above any real score) are kept; -1 are replaced. A voxel
    // that matches nothing keeps an earlier match (score 0.5) and gets the no-match record
    // where it has none yet (score -1).
    let (_, index, score, _, _) = run(1, &[2.0, -1.0, 2.0, -1.0, -1.0, 0.5, -1.0], &dict, &c);
    assert_eq!(index[0], -7);
    assert_eq!(index[2], -7);
    assert_eq!(index[1] as u64, want[1].index as u64 + offset);
    assert_eq!(index[5], -7, "an unmatched voxel keeps the earlier match");
    assert_eq!((index[6], score[6]), (-1, 0.0), "an unmatched voxel with no match yet gets the no-match record");
    // A batch of zero atoms matches no voxel: index -1 and score 0 alone, nothing accumulated.
    let (zd, zc) = (vec![[0f32; 2]; ntr * natoms], vec![[0f32; 2]; natoms * nvox]);
    let (_, index, score, _, _) = run(0, &vec![0.0; nvox], &zd, &zc);
    assert_eq!(index, vec![-1; nvox], "a zero batch matches nothing");
    assert_eq!(score, vec![0.0; nvox]);
    let (_, index, _, _, _) = run(1, &vec![0.25; nvox], &zd, &zc);
    assert_eq!(index, vec![-7; nvox], "accumulated, a zero batch keeps every earlier result");
    let (_, index, _, _, _) = run(1, &vec![-1.0; nvox], &zd, &zc);
    assert_eq!(index, vec![-1; nvox], "accumulated from no result, a zero batch writes the no-match record");
    println!("argmax kernel on the CPU: {nvox} voxels as the reference, ties, zero atom, offset, accumulate");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The fused compressed-matching kernel (no GEMM scratch), run on the CPU: the same atoms,
/// scores, PD and parameters as the reference on the same coordinates, across partial voxel
/// blocks and atom tiles, with a zero atom, a NaN atom, a duplicate (tie), a zero voxel, and
/// accumulating over earlier results; at rank 20 and at rank 32 (the kernel's largest, whose
/// atom tiles are copied whole).
#[test]
fn fused_match_kernel_run_on_the_cpu_equals_the_reference() {
    if !have_cxx() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("kmm-fused-harness-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(exe) = compile("fused_harness.cpp", 32, 4, &dir) else { return };
    for k in [20usize, 32] {
        fused_case(&exe, &dir, k);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn fused_case(exe: &Path, dir: &Path, k: usize) {
    let (natoms, nvox, offset) = (150usize, 300usize, 7u64);
    let mut dict: Vec<[f32; 2]> = (0..k * natoms).map(|i| [((i * 7919) % 97) as f32 / 50.0 - 1.0, ((i * 104729) % 89) as f32 / 45.0 - 1.0]).collect();
    for t in 0..k {
        dict[5 * k + t] = [0.0, 0.0];
        dict[100 * k + t] = [dict[99 * k + t][0] * 2.0, dict[99 * k + t][1] * 2.0];
    }
    dict[70 * k + 2] = [f32::NAN, 0.0];
    let mut xs: Vec<[f32; 2]> = Vec::with_capacity(k * nvox);
    for v in 0..nvox {
        let j = (v * 37) % natoms;
        for t in 0..k {
            let c = dict[j * k + t];
            let noise = ((v * 31 + t * 17) % 23) as f32 / 23.0 - 0.5;
            xs.push([0.7 * c[0] - 0.1 * c[1] + 0.05 * noise, 0.7 * c[1] + 0.1 * c[0] - 0.03 * noise]);
        }
    }
    for t in 0..k {
        xs[4 * k + t] = [0.0, 0.0];
    }
    let dn = cpu::column_norms(&dict, k);
    // Whole-signal norms: larger than the coordinates' (the part outside the basis).
    let xn: Vec<f64> = cpu::column_norms(&xs, k).iter().enumerate().map(|(v, n)| n * (1.0 + (v % 5) as f64 * 0.1)).collect();
    let inv: Vec<f32> = dn.iter().map(|&n| if n > 0.0 && n.is_finite() { (1.0 / n) as f32 } else { 0.0 }).collect();
    let inv_x: Vec<f32> = xn.iter().map(|&n| if n > 0.0 { (1.0 / n) as f32 } else { 0.0 }).collect();
    let params: Vec<[f32; 4]> = (0..offset as usize + natoms).map(|i| [i as f32, 0.5, 1.0, 0.0]).collect();
    let want = cpu::match_columns(&dict, k, &xs, &dn, &xn);
    let run = |accumulate: i64, score0: &[f32]| {
        let mut buf = Vec::new();
        for v in [k as i64, natoms as i64, nvox as i64, offset as i64, accumulate] {
            buf.extend(v.to_le_bytes());
        }
        buf.extend(bytes_of(&dict));
        buf.extend(bytes_of(&xs));
        buf.extend(bytes_of(&inv));
        buf.extend(bytes_of(&inv_x));
        buf.extend(bytes_of(&params));
        buf.extend(bytes_of(&vec![-7i32; nvox]));
        buf.extend(bytes_of(score0));
        buf.extend(bytes_of(&vec![[0f32; 2]; nvox]));
        buf.extend(bytes_of(&vec![[0f32; 4]; nvox]));
        let (input, output) = (dir.join("in.bin"), dir.join("out.bin"));
        std::fs::write(&input, &buf).unwrap();
        assert!(Command::new(exe).arg(&input).arg(&output).status().unwrap().success());
        let raw = std::fs::read(&output).unwrap();
        let f = |i: usize| f32::from_le_bytes(raw[i..i + 4].try_into().unwrap());
        let index: Vec<i32> = (0..nvox).map(|v| f(4 * v).to_bits() as i32).collect();
        let score: Vec<f32> = (0..nvox).map(|v| f(4 * nvox + 4 * v)).collect();
        let pd: Vec<[f32; 2]> = (0..nvox).map(|v| [f(8 * nvox + 8 * v), f(8 * nvox + 8 * v + 4)]).collect();
        let outp: Vec<f32> = (0..nvox).map(|v| f(16 * nvox + 16 * v)).collect();
        (index, score, pd, outp)
    };
    let (index, score, pd, outp) = run(0, &vec![0.0; nvox]);
    assert_eq!(want[4].index, -1, "the zero voxel matches nothing");
    for v in 0..nvox {
        let global = if want[v].index < 0 { -1 } else { want[v].index as i64 + offset as i64 };
        assert_eq!(index[v] as i64, global, "voxel {v}");
        assert_eq!(outp[v], global.max(0) as f32, "voxel {v}: parameters of the global index");
        assert!((score[v] - want[v].score).abs() < 1e-5, "voxel {v}: score {} vs {}", score[v], want[v].score);
        let d = ((pd[v][0] - want[v].pd[0]).powi(2) + (pd[v][1] - want[v].pd[1]).powi(2)).sqrt();
        assert!(d <= 1e-4 * want[v].pd[0].hypot(want[v].pd[1]).max(1e-30), "voxel {v}: pd {:?} vs {:?}", pd[v], want[v].pd);
    }
    let ties = (0..nvox).filter(|&v| (v * 37) % natoms == 100).count();
    assert!(ties > 0 && (0..nvox).filter(|&v| (v * 37) % natoms == 100).all(|v| want[v].index == 99), "atom 100 (2x atom 99) loses the tie");
    // Accumulate: earlier scores of 2 are kept, -1 replaced, the zero voxel keeps its result.
    let score0: Vec<f32> = (0..nvox).map(|v| if v % 2 == 0 { 2.0 } else { -1.0 }).collect();
    let (index, _, _, _) = run(1, &score0);
    for v in 0..nvox {
        let kept = v % 2 == 0 || want[v].index < 0;
        let expect = if kept { -7 } else { want[v].index + offset as i32 };
        assert_eq!(index[v], expect, "voxel {v}, accumulating");
    }
    println!("fused matching kernel on the CPU: {nvox} voxels x {natoms} atoms at rank {k} as the reference");
}
