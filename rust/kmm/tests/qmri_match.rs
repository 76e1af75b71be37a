//! Dictionary matching through the C ABI: noiseless signals recover their atom, with and
//! without rank compression. Host backend in CI; CUDA with KMM_TEST_GPU=1.

mod common;
mod qmri_common;
use common::*;
use qmri_common::*;

fn norm(v: &[Cf]) -> f64 {
    v.iter().map(|c| (c[0] as f64).powi(2) + (c[1] as f64).powi(2)).sum::<f64>().sqrt()
}

fn check_recovery(rank: u32) {
    let m = Mgr::new();
    let ntr = 240;
    let seq = FispSpec::mrf(ntr, 16);
    let params = grid(12, 12);
    let dict = fisp(&m, &seq, &params);
    let natoms = params.len();
    // Voxels: every 7th atom times a complex proton density.
    let picks: Vec<usize> = (0..natoms).step_by(7).collect();
    let pds: Vec<Cf> = picks.iter().map(|&j| [0.5 + j as f32 * 0.01, -0.3 + 0.002 * j as f32]).collect();
    let mut signals = Vec::new();
    for (&j, pd) in picks.iter().zip(&pds) {
        for d in &dict[j * ntr..(j + 1) * ntr] {
            signals.push([pd[0] * d[0] - pd[1] * d[1], pd[0] * d[1] + pd[1] * d[0]]);
        }
    }
    let r = match_signals(&m, &dict, ntr, &params, &signals, rank);
    for (v, &j) in picks.iter().enumerate() {
        assert_eq!(r.index[v] as usize, j, "rank {rank}: voxel {v} matched atom {} instead of {j}", r.index[v]);
        assert_eq!(r.params[v], params[j], "rank {rank}: voxel {v} parameters");
        assert!((r.score[v] - 1.0).abs() < 1e-3, "rank {rank}: voxel {v} score {}", r.score[v]);
        if rank == 0 {
            // PD relative to the normalised atom: pd * ||d_j||.
            let n = norm(&dict[j * ntr..(j + 1) * ntr]) as f32;
            let want = [pds[v][0] * n, pds[v][1] * n];
            let err = ((r.pd[v][0] - want[0]).powi(2) + (r.pd[v][1] - want[1]).powi(2)).sqrt();
            assert!(err < 1e-3 * n, "voxel {v}: pd {:?} vs {want:?}", r.pd[v]);
        }
    }
    println!("rank {rank}: {} voxels against {natoms} atoms all recovered", picks.len());
}

#[test]
fn noiseless_signals_recover_their_atom() {
    check_recovery(0);
}

#[test]
fn noiseless_signals_recover_their_atom_after_rank_compression() {
    check_recovery(12);
}

#[test]
fn batched_dictionary_with_accumulate_equals_one_match() {
    // Simulate in batches with first_atom (all parameters in one buffer), match each batch with
    // KMM_MATCH_ACCUMULATE and atom_offset: the same result as one match of the whole dictionary.
    let m = Mgr::new();
    let ntr = 120;
    let seq = FispSpec::mrf(ntr, 12);
    let params = grid(10, 10);
    let natoms = params.len();
    let whole = fisp(&m, &seq, &params);
    let picks: Vec<usize> = (0..natoms).step_by(5).collect();
    let signals: Vec<Cf> = picks.iter().flat_map(|&j| whole[j * ntr..(j + 1) * ntr].iter().map(|c| [c[0] * 0.8, c[1] * 0.8])).collect();
    let nvox = picks.len();
    let want = match_signals(&m, &whole, ntr, &params, &signals, 0);

    let p = upload(&m, &params);
    let x = upload(&m, &signals);
    let outs = KmmMatchOutputs {
        index: m.alloc(nvox as u64 * 4, DEVICE),
        score: upload(&m, &vec![-1f32; nvox]),
        pd: m.alloc(nvox as u64 * 8, DEVICE),
        params: m.alloc(nvox as u64 * 16, DEVICE),
    };
    let batch = 17;
    let raw = seq.raw();
    let mut first = 0;
    while first < natoms {
        let n = batch.min(natoms - first);
        let d = m.alloc((n * ntr * 8) as u64, DEVICE);
        ok(kmm_qmri_simulate_fisp(m.0, &raw, p, first as u64, n as u64, d, 0));
        ok(kmm_qmri_match(m.0, d, ntr as u64, n as u64, first as u64, x, nvox as u64, 0, p, &outs, KMM_MATCH_ACCUMULATE));
        m.free(d);
        first += n;
    }
    m.sync();
    let index: Vec<i32> = download(&m, outs.index, nvox);
    let got_params: Vec<[f32; 4]> = download(&m, outs.params, nvox);
    let score: Vec<f32> = download(&m, outs.score, nvox);
    assert_eq!(index, want.index);
    assert_eq!(got_params, want.params);
    for v in 0..nvox {
        assert_eq!(index[v] as usize, picks[v]);
        assert!((score[v] - want.score[v]).abs() < 1e-6);
    }
    println!("{} batches of {batch} atoms: {nvox} voxels as in one match", natoms.div_ceil(batch));
}

#[test]
fn cpu_reference_prefers_the_first_of_equal_atoms_and_never_a_zero_atom() {
    let ntr = 4;
    let a: Vec<Cf> = vec![[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [0.0, 0.0]];
    // atoms: zero, a, a scaled by 2 (same normalised atom), so the first nonzero wins.
    let mut dict = vec![[0f32; 2]; ntr];
    dict.extend(&a);
    dict.extend(a.iter().map(|c| [2.0 * c[0], 2.0 * c[1]]));
    let found = kmm::qmri::cpu::match_dictionary(&dict, ntr, &a);
    assert_eq!(found[0].index, 1);
    assert!((found[0].score - 1.0).abs() < 1e-6);
}
