//! Compressed matching: scores are cosines in the full TR space (the norms of the uncompressed
//! atom and signal), comparable between dictionary batches; batches share one basis; voxels
//! and batches that match nothing never report a match. Host backend in CI; CUDA with
//! KMM_TEST_GPU=1.

mod common;
mod qmri_common;
use common::*;
use qmri_common::*;

/// Outputs of a match, allocated on `m`; `score` starts at -1 (for accumulating).
struct Outs {
    o: KmmMatchOutputs,
    nvox: usize,
}

impl Outs {
    fn new(m: &Mgr, nvox: usize) -> Outs {
        let o = KmmMatchOutputs {
            index: upload(m, &vec![-7i32; nvox]),
            score: upload(m, &vec![-1f32; nvox]),
            pd: m.alloc(nvox as u64 * 8, DEVICE),
            params: m.alloc(nvox as u64 * 16, DEVICE),
        };
        Outs { o, nvox }
    }
    fn read(&self, m: &Mgr) -> Matched {
        m.sync();
        Matched {
            index: download(m, self.o.index, self.nvox),
            score: download(m, self.o.score, self.nvox),
            pd: download(m, self.o.pd, self.nvox),
            params: download(m, self.o.params, self.nvox),
        }
    }
}

fn cos(a: &[Cf], b: &[Cf]) -> f64 {
    let (mut re, mut im, mut aa, mut bb) = (0f64, 0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let (x0, x1, y0, y1) = (x[0] as f64, x[1] as f64, y[0] as f64, y[1] as f64);
        re += x0 * y0 + x1 * y1;
        im += x0 * y1 - x1 * y0;
        aa += x0 * x0 + x1 * x1;
        bb += y0 * y0 + y1 * y1;
    }
    (re * re + im * im).sqrt() / (aa * bb).sqrt()
}

/// Two one-atom batches, ntr = 3, rank 1: each batch's own rank-1 basis is its atom, so a score
/// normalised by the projected signal is 1 in both and the first batch wins. With the norms
/// of the uncompressed signal the score is the true cosine and the closer atom wins.
#[test]
fn one_atom_batches_at_rank_one_keep_the_closer_atom() {
    let m = Mgr::new();
    let ntr = 3;
    let atoms: [Cf; 6] = [[1.0, 0.0], [0.0, 0.0], [0.2, 0.0], [0.0, 0.0], [1.0, 0.0], [0.1, 0.0]];
    let x: Vec<Cf> = vec![[0.02, 0.0], [1.0, 0.0], [0.12, 0.0]];
    let want = [cos(&atoms[..3], &x), cos(&atoms[3..], &x)];
    assert!(want[1] > 0.999 && want[0] < 0.2, "the signal is atom 1's: cosines {want:?}");
    let params = [[1.0f32, 0.1, 1.0, 0.0], [2.0, 0.2, 1.0, 0.0]];
    let p = upload(&m, &params);
    let sig = upload(&m, &x);
    for rank in [0u32, 1, 2] {
        let outs = Outs::new(&m, 1);
        for j in 0..2 {
            let d = upload(&m, &atoms[j * ntr..(j + 1) * ntr]);
            ok(kmm_qmri_match(m.0, d, ntr as u64, 1, j as u64, sig, 1, rank, p, &outs.o, KMM_MATCH_ACCUMULATE));
            m.free(d);
        }
        let r = outs.read(&m);
        assert_eq!(r.index[0], 1, "rank {rank}: atom 1 (cosine {}) must beat atom 0 (cosine {})", want[1], want[0]);
        assert!((r.score[0] as f64 - want[1]).abs() < 1e-5, "rank {rank}: score {} is not the true cosine {}", r.score[0], want[1]);
        assert_eq!(r.params[0], params[1]);
    }
}

/// A basis computed once and shared by the batches: the batched compressed match equals the
/// match of the whole dictionary in that basis, and scores are the true cosines of atoms in
/// the basis' span.
#[test]
fn batches_in_one_basis_equal_the_whole_dictionary_in_it() {
    let m = Mgr::new();
    let ntr = 3;
    let atoms: [Cf; 6] = [[1.0, 0.0], [0.0, 0.0], [0.2, 0.0], [0.0, 0.0], [1.0, 0.0], [0.1, 0.0]];
    let x: Vec<Cf> = vec![[0.02, 0.0], [1.0, 0.0], [0.12, 0.0]];
    let d = upload(&m, &atoms);
    let sig = upload(&m, &x);
    let basis = m.alloc(ntr as u64 * 2 * 8, DEVICE);
    ok(kmm_qmri_compression_basis(m.0, d, ntr as u64, 2, 2, basis));
    let outs = Outs::new(&m, 1);
    for j in 0..2u64 {
        let dj = upload(&m, &atoms[j as usize * ntr..(j as usize + 1) * ntr]);
        ok(kmm_qmri_match_in_basis(m.0, dj, ntr as u64, 1, j, sig, 1, basis, 2, 0, &KmmMatchOutputs { params: 0, ..outs.o }, KMM_MATCH_ACCUMULATE));
        m.free(dj);
    }
    let r = outs.read(&m);
    assert_eq!(r.index[0], 1);
    // Atom 1 lies in the span of the rank-2 basis of the two atoms: its score is its cosine.
    let want = cos(&atoms[3..], &x);
    assert!((r.score[0] as f64 - want).abs() < 1e-5, "score {} vs cosine {want}", r.score[0]);
    // PD relative to the normalised whole atom: d^H x / ||d||.
    let n1 = (1.0f64 + 0.01).sqrt();
    let pd = (1.0 * 1.0 + 0.1 * 0.12) / n1;
    assert!((r.pd[0][0] as f64 - pd).abs() < 1e-5 && r.pd[0][1].abs() < 1e-6, "pd {:?} vs {pd}", r.pd[0]);
}

/// A realistic dictionary: FISP, 1000 TRs, rank 32 from a sample of every third atom, matched
/// in batches in that basis: at least 99% of the noisy voxels find the atom the uncompressed
/// match finds, and the scores are within 1e-3 of the uncompressed ones.
#[test]
fn rank_32_on_1000_trs_agrees_with_uncompressed_matching() {
    let m = Mgr::new();
    let ntr = 1000;
    let seq = FispSpec::mrf(ntr, 12);
    let params = grid(24, 24);
    let natoms = params.len();
    let dict = fisp(&m, &seq, &params);
    // Voxels: atoms times a PD, with 1% complex noise.
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut rnd = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f32 / (1u64 << 53) as f32 - 0.5
    };
    let nvox = 400;
    let mut signals = Vec::with_capacity(nvox * ntr);
    for v in 0..nvox {
        let j = (v * 7919) % natoms;
        let col = &dict[j * ntr..(j + 1) * ntr];
        let scale = col.iter().map(|c| c[0].abs() + c[1].abs()).sum::<f32>() / ntr as f32;
        for c in col {
            signals.push([0.8 * c[0] + 0.02 * scale * rnd(), 0.8 * c[1] + 0.02 * scale * rnd()]);
        }
    }
    let full = match_signals(&m, &dict, ntr, &params, &signals, 0);

    let sample: Vec<Cf> = dict.chunks(ntr).step_by(3).flatten().copied().collect();
    let s = upload(&m, &sample);
    let rank = 32u32;
    let basis = m.alloc(ntr as u64 * rank as u64 * 8, DEVICE);
    ok(kmm_qmri_compression_basis(m.0, s, ntr as u64, (sample.len() / ntr) as u64, rank, basis));
    let p = upload(&m, &params);
    let x = upload(&m, &signals);
    let outs = Outs::new(&m, nvox);
    let batch = 150;
    let mut first = 0;
    while first < natoms {
        let n = batch.min(natoms - first);
        let d = upload(&m, &dict[first * ntr..(first + n) * ntr]);
        let flags = if first == 0 { 0 } else { KMM_MATCH_ACCUMULATE };
        ok(kmm_qmri_match_in_basis(m.0, d, ntr as u64, n as u64, first as u64, x, nvox as u64, basis, rank, p, &outs.o, flags));
        m.free(d);
        first += n;
    }
    let r = outs.read(&m);
    let same = (0..nvox).filter(|&v| r.index[v] == full.index[v]).count();
    let worst = (0..nvox).map(|v| (r.score[v] - full.score[v]).abs()).fold(0f32, f32::max);
    println!("rank {rank} of {ntr} TRs, {natoms} atoms in batches of {batch}: {same}/{nvox} indices as uncompressed, worst score difference {worst:.2e}");
    assert!(same * 100 >= nvox * 99, "{same}/{nvox} indices equal to uncompressed matching");
    assert!(worst < 1e-3, "compressed scores differ from the true cosines by {worst}");
    for b in [s, basis, p, x] {
        m.free(b);
    }
}

/// Voxels and batches that match nothing: a zero or NaN signal gets index -1 and score 0; a
/// batch of zero atoms or of NaN atoms, accumulated, keeps the earlier result; matched alone
/// it reports no match.
#[test]
fn nothing_matches_zero_or_nan_signals_or_batches() {
    let m = Mgr::new();
    let ntr = 4;
    let good: Vec<Cf> = vec![[1.0, 0.0], [0.5, 0.5], [0.0, 1.0], [0.2, 0.1]];
    let zero = vec![[0f32; 2]; ntr];
    let nan = vec![[f32::NAN, 0.0]; ntr];
    let params = [[1.0f32, 0.1, 1.0, 0.0], [2.0, 0.2, 1.0, 0.0], [3.0, 0.3, 1.0, 0.0]];
    let p = upload(&m, &params);
    // Voxels: the good atom, a zero signal, a NaN signal.
    let x: Vec<Cf> = good.iter().chain(&zero).chain(&nan).copied().collect();
    let sig = upload(&m, &x);
    for rank in [0u32, 2] {
        // The good atom first, then a zero batch and a NaN batch accumulated.
        let outs = Outs::new(&m, 3);
        for (j, atom) in [&good, &zero, &nan].into_iter().enumerate() {
            let d = upload(&m, atom);
            let flags = if j == 0 { 0 } else { KMM_MATCH_ACCUMULATE };
            ok(kmm_qmri_match(m.0, d, ntr as u64, 1, j as u64, sig, 3, rank, p, &outs.o, flags));
            m.free(d);
        }
        let r = outs.read(&m);
        assert_eq!(r.index, vec![0, -1, -1], "rank {rank}");
        assert!((r.score[0] - 1.0).abs() < 1e-5, "rank {rank}: score {}", r.score[0]);
        assert_eq!(&r.score[1..], &[0.0, 0.0], "rank {rank}: nothing matched, score 0");
        assert_eq!(r.params[0], params[0]);
        assert_eq!(r.params[1], [0.0; 4], "rank {rank}: no match, a record of zeros");
        // A zero batch, then a NaN batch, each matched alone: no match anywhere.
        for (j, atom) in [&zero, &nan].into_iter().enumerate() {
            let outs = Outs::new(&m, 3);
            let d = upload(&m, atom);
            ok(kmm_qmri_match(m.0, d, ntr as u64, 1, j as u64 + 1, sig, 3, rank, p, &outs.o, 0));
            m.free(d);
            let r = outs.read(&m);
            assert_eq!(r.index, vec![-1, -1, -1], "rank {rank}, batch {}", j + 1);
            assert_eq!(r.score, vec![0.0; 3]);
            assert_eq!(r.pd, vec![[0.0; 2]; 3]);
        }
        // Every batch accumulated from the documented start (score -1, index garbage): the zero
        // and NaN voxels end with the no-match record, not the garbage.
        let outs = Outs::new(&m, 3);
        for (j, atom) in [&good, &zero].into_iter().enumerate() {
            let d = upload(&m, atom);
            ok(kmm_qmri_match(m.0, d, ntr as u64, 1, j as u64, sig, 3, rank, p, &outs.o, KMM_MATCH_ACCUMULATE));
            m.free(d);
        }
        let r = outs.read(&m);
        assert_eq!(r.index, vec![0, -1, -1], "rank {rank}: accumulated from score -1");
        assert_eq!(&r.score[1..], &[0.0, 0.0]);
        // Accumulating after a zero batch (score 0 written): the good atom replaces it.
        let outs = Outs::new(&m, 3);
        for (j, atom) in [&zero, &good].into_iter().enumerate() {
            let d = upload(&m, atom);
            let flags = if j == 0 { 0 } else { KMM_MATCH_ACCUMULATE };
            ok(kmm_qmri_match(m.0, d, ntr as u64, 1, j as u64, sig, 3, rank, p, &outs.o, flags));
            m.free(d);
        }
        assert_eq!(outs.read(&m).index, vec![1, -1, -1], "rank {rank}");
    }
}

#[test]
fn bad_bases_are_rejected_and_nothing_is_written() {
    let m = Mgr::new();
    let (ntr, natoms) = (6u64, 4u64);
    let dict: Vec<Cf> = (0..ntr * natoms).map(|i| [(i as f32 * 0.37).sin(), (i as f32 * 0.11).cos()]).collect();
    let d = upload(&m, &dict);
    let x = upload(&m, &dict[..ntr as usize * 2]);
    let basis = m.alloc(ntr * 3 * 8, DEVICE);
    expect_err(kmm_qmri_compression_basis(m.0, d, ntr, natoms, 0, basis), KMM_ERROR_INVALID_ARGUMENT, &["rank = 0", "1..=ntr (6)"]);
    expect_err(kmm_qmri_compression_basis(m.0, d, ntr, natoms, 7, basis), KMM_ERROR_INVALID_ARGUMENT, &["rank = 7", "1..=ntr (6)"]);
    expect_err(kmm_qmri_compression_basis(m.0, d, ntr, natoms, 4, basis), KMM_ERROR_OUT_OF_RANGE, &["basis", "192"]);
    expect_err(kmm_qmri_compression_basis(m.0, d, ntr, natoms + 1, 3, basis), KMM_ERROR_OUT_OF_RANGE, &["dictionary"]);
    expect_err(kmm_qmri_compression_basis(m.0, d, 0, natoms, 3, basis), KMM_ERROR_INVALID_ARGUMENT, &["ntr = 0"]);
    ok(kmm_qmri_compression_basis(m.0, d, ntr, natoms, 3, basis));
    let outs = Outs::new(&m, 2);
    let o = KmmMatchOutputs { params: 0, ..outs.o };
    ok(kmm_qmri_match_in_basis(m.0, d, ntr, natoms, 0, x, 2, basis, 3, 0, &o, 0));
    let good = outs.read(&m);
    assert_eq!(good.index, vec![0, 1]);
    // Not orthonormal: a basis of ones.
    let ones = upload(&m, &vec![[1f32, 0.0]; ntr as usize * 3]);
    expect_err(kmm_qmri_match_in_basis(m.0, d, ntr, natoms, 0, x, 2, ones, 3, 0, &o, 0), KMM_ERROR_INVALID_ARGUMENT, &["basis", "orthonormal"]);
    expect_err(kmm_qmri_match_in_basis(m.0, d, ntr, natoms, 0, x, 2, basis, 0, 0, &o, 0), KMM_ERROR_INVALID_ARGUMENT, &["rank = 0"]);
    expect_err(kmm_qmri_match_in_basis(m.0, d, ntr, natoms, 0, x, 2, basis, 4, 0, &o, 0), KMM_ERROR_OUT_OF_RANGE, &["basis"]);
    expect_err(kmm_qmri_match_in_basis(m.0, d, ntr, natoms, 0, x, 2, basis, 3, 0, &o, 16), KMM_ERROR_INVALID_ARGUMENT, &["flags"]);
    expect_err(kmm_qmri_match(m.0, d, ntr, natoms, 0, x, 2, 3, 0, &o, KMM_MATCH_SKIP_CHECKS), KMM_ERROR_INVALID_ARGUMENT, &["flags"]);
    // The earlier results are untouched by the refused calls.
    let after = outs.read(&m);
    assert_eq!(after.index, good.index);
    assert_eq!(after.score, good.score);
}

/// The basis the backend computes (on CUDA: Gram by CHERK, orthogonal iteration with cuSOLVER's
/// QR) keeps, for every atom, the energy the f64 reference's basis keeps, and is orthonormal.
#[test]
fn the_backend_basis_captures_what_the_reference_basis_captures() {
    let m = Mgr::new();
    let ntr = 300;
    let seq = FispSpec::mrf(ntr, 12);
    // Over 4096 atoms: the CUDA basis splits its products over slices of 2048 atoms, and a rest.
    let params: Vec<[f32; 4]> = (0..11).flat_map(|b| grid(24, 24).into_iter().map(move |a| [a[0], a[1], 0.8 + 0.04 * b as f32, a[3]])).collect();
    let natoms = params.len();
    assert!(natoms > 2 * 2048 && natoms % 2048 != 0, "{natoms} atoms");
    let dict = fisp(&m, &seq, &params);
    for rank in [8usize, 24] {
        let d = upload(&m, &dict);
        let b = m.alloc((ntr * rank * 8) as u64, DEVICE);
        ok(kmm_qmri_compression_basis(m.0, d, ntr as u64, natoms as u64, rank as u32, b));
        m.sync();
        let got: Vec<Cf> = download(&m, b, ntr * rank);
        let want = kmm::qmri::svd::compression_basis(&dict, ntr, rank);
        let kept = |u: &dyn Fn(usize, usize) -> (f64, f64), j: usize| -> f64 {
            let col = &dict[j * ntr..(j + 1) * ntr];
            let total: f64 = col.iter().map(|c| (c[0] as f64).powi(2) + (c[1] as f64).powi(2)).sum();
            let mut e = 0.0;
            for r in 0..rank {
                let (mut re, mut im) = (0f64, 0f64);
                for (t, c) in col.iter().enumerate() {
                    let (a, b) = u(r, t);
                    re += a * c[0] as f64 + b * c[1] as f64;
                    im += a * c[1] as f64 - b * c[0] as f64;
                }
                e += re * re + im * im;
            }
            e / total
        };
        let g = |r: usize, t: usize| (got[r * ntr + t][0] as f64, got[r * ntr + t][1] as f64);
        let w = |r: usize, t: usize| (want[r * ntr + t].re, want[r * ntr + t].im);
        let worst = (0..natoms).map(|j| (kept(&g, j) - kept(&w, j)).abs()).fold(0f64, f64::max);
        let lost = (0..natoms).map(|j| 1.0 - kept(&g, j)).fold(0f64, f64::max);
        // The dominant subspace keeps the most energy summed over atoms: the backend's must keep
        // as much as the reference's (to f32 rounding); single atoms may shift a little.
        let (total_g, total_w) = ((0..natoms).map(|j| kept(&g, j)).sum::<f64>(), (0..natoms).map(|j| kept(&w, j)).sum::<f64>());
        println!("rank {rank}: per-atom energy kept differs from the reference's by at most {worst:.2e}; at most {lost:.2e} of an atom lost; total kept {total_g:.6} vs {total_w:.6} of {natoms}");
        assert!(total_g >= total_w * (1.0 - 1e-6), "rank {rank}: the basis keeps {total_g} of the atoms' energy, the reference's {total_w}");
        assert!(worst < 1e-3, "rank {rank}: the basis keeps {worst} less or more of some atom than the reference's");
        for a in 0..rank {
            for c in a..rank {
                let (mut re, mut im) = (0f64, 0f64);
                for t in 0..ntr {
                    let (x, y) = (g(a, t), g(c, t));
                    re += x.0 * y.0 + x.1 * y.1;
                    im += x.0 * y.1 - x.1 * y.0;
                }
                let want = if a == c { 1.0 } else { 0.0 };
                assert!((re - want).abs() < 1e-4 && im.abs() < 1e-4, "rank {rank}: U^H U[{a},{c}] = {re} + {im}i");
            }
        }
        m.free(d);
        m.free(b);
    }
}
