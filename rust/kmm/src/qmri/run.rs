//! Entry points on a manager's buffers: checks, then the CPU reference queued in stream order
//! (host backend) or the CUDA kernels on the manager's stream.

use super::operands::{check_disjoint, Operand};
use super::{cpu, gpu, svd, validate_atoms, Atom, Fisp, Pssfp};
use crate::backend::{self, BackendKind, Stream};
use crate::error::{lock, Result};
use crate::fail;
use crate::manager::copy::Completion;
use crate::manager::Manager;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Most atoms or voxels of one call (the Julia layer batches larger problems).
pub const MAX_COUNT: u64 = i32::MAX as u64;

/// Output buffers of a match; 0 leaves an output out (`index` is required).
#[derive(Debug, Clone, Copy, Default)]
pub struct MatchBuffers {
    /// Added to the reported indices; `params` is indexed with it (batched dictionaries).
    pub atom_offset: u64,
    /// Keep the earlier result of a voxel unless this dictionary batch scores higher (needs `score`).
    pub accumulate: bool,
    /// `nvoxels` i32: 0-based index of the best atom.
    pub index: u64,
    /// `nvoxels` f32: |d^H x| / (||d|| ||x||).
    pub score: u64,
    /// `nvoxels` complex f32: d^H x / ||d||.
    pub pd: u64,
    /// Atom records (T1, T2, B1, B0) of the whole dictionary, at least `atom_offset + natoms`;
    /// needed for `out_params`.
    pub params: u64,
    /// `nvoxels` atom records: the parameters of the best atom.
    pub out_params: u64,
}

/// Pins buffers for the duration of queueing; unpins on drop.
pub(super) struct Pins<'a> {
    m: &'a Manager,
    handles: Vec<u64>,
}

impl<'a> Pins<'a> {
    pub(super) fn new(m: &'a Manager) -> Self {
        Pins { m, handles: Vec::new() }
    }
    /// Checks that `handle` holds at least `bytes` and maps it.
    pub(super) fn map(&mut self, handle: u64, bytes: u64, name: &str) -> Result<u64> {
        let (_, size, _, _) = self.m.buffer_info(handle)?;
        if size < bytes {
            fail!(KMM_ERROR_OUT_OF_RANGE, "{name} holds {size} bytes but needs {bytes}");
        }
        let addr = self.m.map_for_own_work(handle)?;
        self.handles.push(handle);
        Ok(addr)
    }
}

impl Drop for Pins<'_> {
    fn drop(&mut self) {
        for &h in &self.handles {
            let _ = self.m.end_own_work(h);
        }
    }
}

fn check_count(name: &str, n: u64) -> Result<()> {
    if n == 0 || n > MAX_COUNT {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "{name} = {n} must be in 1..={MAX_COUNT}");
    }
    Ok(())
}

fn bytes(count: u64, each: u64, name: &str) -> Result<u64> {
    match count.checked_mul(each) {
        Some(b) if b <= crate::manager::MAX_BUFFER_BYTES => Ok(b),
        _ => fail!(KMM_ERROR_SIZE_OVERFLOW, "{name}: {count} x {each} bytes exceeds the largest buffer"),
    }
}

/// Reads the atom records (stream-ordered, then waits) and checks them.
fn check_atoms(m: &Manager, params: u64, first_atom: u64, natoms: u64) -> Result<()> {
    let mut atoms = vec![Atom::default(); natoms as usize];
    // SAFETY: `atoms` has room for natoms records; the copy completes before return.
    unsafe { m.copy_to_host(atoms.as_mut_ptr() as *mut u8, params, first_atom * 16, natoms * 16, Completion::Wait)? };
    validate_atoms(&atoms).map_err(|mut e| {
        if first_atom > 0 {
            e.message += &format!(" (atom numbers count from first_atom = {first_atom})");
        }
        e
    })
}

/// A host stream per device that runs the CPU reference in the order of the managers' streams:
/// it waits for the manager's queued work, computes, and the manager's stream waits for it.
fn host_worker(device: i32) -> Result<Arc<dyn Stream>> {
    static WORKERS: OnceLock<Mutex<HashMap<i32, Arc<dyn Stream>>>> = OnceLock::new();
    let mut workers = lock(WORKERS.get_or_init(|| Mutex::new(HashMap::new())));
    if let Some(w) = workers.get(&device) {
        return Ok(w.clone());
    }
    let w = backend::host::HostBackend::get(device)?.create_stream()?;
    workers.insert(device, w.clone());
    Ok(w)
}

fn queue_on_host(m: &Manager, work: Box<dyn FnOnce() + Send>) -> Result<()> {
    let worker = host_worker(m.device())?;
    worker.wait_raw_stream(m.raw_stream())?;
    worker.launch_host_fn(work)?;
    m.wait_for_stream(worker.raw())
}

/// Host addresses become slices inside queued work; the pins and stream order keep them valid.
#[derive(Clone, Copy)]
struct Addr(u64);
impl Addr {
    unsafe fn slice<'a, T>(self, n: usize) -> &'a [T] {
        std::slice::from_raw_parts(self.0 as *const T, n)
    }
    unsafe fn slice_mut<'a, T>(self, n: usize) -> &'a mut [T] {
        std::slice::from_raw_parts_mut(self.0 as *mut T, n)
    }
}

/// Checks and maps a simulation's buffers: the addresses of atom `first_atom` in `params` and of
/// `out` (`ntr x natoms` complex f32), mapped until the returned `Pins` drop.
fn map_simulation(
    m: &Manager,
    ntr: u64,
    params: u64,
    first_atom: u64,
    natoms: u64,
    out: u64,
    check: bool,
) -> Result<(Pins<'_>, u64, u64)> {
    check_count("natoms", natoms)?;
    let out_bytes = bytes(bytes(ntr, natoms, "ntr x natoms")?, 8, "out")?;
    let end = first_atom.checked_add(natoms).ok_or_else(|| crate::err!(KMM_ERROR_SIZE_OVERFLOW, "first_atom + natoms overflows"))?;
    let mut pins = Pins::new(m);
    let p = pins.map(params, bytes(end, 16, "params")?, "params")? + first_atom * 16;
    let o = pins.map(out, out_bytes, "out")?;
    check_disjoint(m, &[Operand::input("params", params, natoms * 16).at(first_atom * 16), Operand::output("out", out, out_bytes)])?;
    if check {
        check_atoms(m, params, first_atom, natoms)?;
    }
    Ok((pins, p, o))
}

/// Simulates `natoms` FISP signals into `out` (`ntr x natoms` complex f32).
pub fn simulate_fisp(m: &Manager, seq: &Fisp, params: u64, first_atom: u64, natoms: u64, out: u64, check: bool) -> Result<()> {
    seq.validate()?;
    let (_pins, p, o) = map_simulation(m, seq.ntr() as u64, params, first_atom, natoms, out, check)?;
    match m.backend_kind() {
        BackendKind::Cuda => gpu::simulate_fisp(m, seq, p, natoms as usize, o),
        BackendKind::Host => {
            let seq = seq.clone();
            let (p, o, n) = (Addr(p), Addr(o), natoms as usize);
            queue_on_host(
                m,
                Box::new(move || unsafe {
                    cpu::simulate_fisp(&seq, p.slice::<Atom>(n), o.slice_mut::<[f32; 2]>(n * seq.ntr()))
                }),
            )
        }
    }
}

/// Simulates `natoms` pSSFP signals into `out` (`ntr x natoms` complex f32).
pub fn simulate_pssfp(m: &Manager, seq: &Pssfp, params: u64, first_atom: u64, natoms: u64, out: u64, check: bool) -> Result<()> {
    seq.validate()?;
    let (_pins, p, o) = map_simulation(m, seq.ntr() as u64, params, first_atom, natoms, out, check)?;
    match m.backend_kind() {
        BackendKind::Cuda => gpu::simulate_pssfp(m, seq, p, natoms as usize, o),
        BackendKind::Host => {
            let seq = seq.clone();
            let (p, o, n) = (Addr(p), Addr(o), natoms as usize);
            queue_on_host(
                m,
                Box::new(move || unsafe {
                    cpu::simulate_pssfp(&seq, p.slice::<Atom>(n), o.slice_mut::<[f32; 2]>(n * seq.ntr()))
                }),
            )
        }
    }
}

/// Mapped addresses of a match's outputs (0 where left out).
#[derive(Debug, Clone, Copy, Default)]
pub struct MatchAddrs {
    pub index: u64,
    pub score: u64,
    pub pd: u64,
    pub params: u64,
    pub out_params: u64,
    pub atom_offset: u64,
    pub accumulate: bool,
}

/// How a match compresses the TR space before the inner products.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Compression {
    /// None: inner products over all `ntr` TRs.
    Full,
    /// On the dominant rank-`k` subspace of this dictionary (computed by the call). Batches of
    /// one dictionary should share a basis instead ([`Compression::Basis`]).
    OwnBasis(usize),
    /// On a given orthonormal basis: a buffer of `ntr x rank` complex f32 (TR index fastest),
    /// as [`compression_basis`] writes it.
    Basis { handle: u64, rank: usize },
}

/// A compression basis once mapped: the address of `ntr x rank` complex f32.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MappedCompression {
    Full,
    OwnBasis(usize),
    Basis { addr: u64, rank: usize },
}

fn check_rank(rank: u64, ntr: u64) -> Result<()> {
    if rank == 0 || rank > ntr {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "rank = {rank} must be in 1..=ntr ({ntr}) for a compression basis");
    }
    Ok(())
}

fn check_ntr(ntr: u64) -> Result<()> {
    if ntr == 0 || ntr > super::MAX_TRS as u64 {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "ntr = {ntr} must be in 1..={}", super::MAX_TRS);
    }
    Ok(())
}

/// Writes the dominant rank-`rank` subspace of the TR space of a dictionary (`ntr x natoms`
/// complex f32) into `basis`: `ntr x rank` complex f32, orthonormal columns, TR index fastest.
/// Compute it once from a whole dictionary (or a representative sample of its atoms) and match
/// every batch in it, so that the batches' scores are comparable.
pub fn compression_basis(m: &Manager, dict: u64, ntr: u64, natoms: u64, rank: u64, basis: u64) -> Result<()> {
    check_ntr(ntr)?;
    check_count("natoms", natoms)?;
    check_rank(rank, ntr)?;
    let mut pins = Pins::new(m);
    let d = pins.map(dict, bytes(bytes(ntr, natoms, "ntr x natoms")?, 8, "dictionary")?, "dictionary")?;
    let u = pins.map(basis, bytes(bytes(ntr, rank, "ntr x rank")?, 8, "basis")?, "basis")?;
    check_disjoint(m, &[Operand::input("dictionary", dict, ntr * natoms * 8), Operand::output("basis", basis, ntr * rank * 8)])?;
    let (ntr, natoms, rank) = (ntr as usize, natoms as usize, rank as usize);
    match m.backend_kind() {
        BackendKind::Cuda => gpu::compression_basis_into(m, d, ntr, natoms, rank, u),
        BackendKind::Host => {
            let (d, u) = (Addr(d), Addr(u));
            queue_on_host(
                m,
                Box::new(move || unsafe {
                    let found = svd::compression_basis(d.slice::<[f32; 2]>(ntr * natoms), ntr, rank);
                    for (o, c) in u.slice_mut::<[f32; 2]>(ntr * rank).iter_mut().zip(&found) {
                        *o = [c.re as f32, c.im as f32];
                    }
                }),
            )
        }
    }
}

/// Largest deviation of U^H U from the identity that a given basis may have: a basis written
/// by [`compression_basis`] is orthonormal to about 1e-6 in f32.
const BASIS_TOLERANCE: f64 = 1e-3;

/// Reads a basis (stream-ordered, then waits) and checks that its columns are orthonormal:
/// scores are cosines only then.
fn check_basis(m: &Manager, basis: u64, ntr: usize, rank: usize) -> Result<()> {
    let mut u = vec![[0f32; 2]; ntr * rank];
    // SAFETY: `u` has room for ntr x rank values; the copy completes before return.
    unsafe { m.copy_to_host(u.as_mut_ptr() as *mut u8, basis, 0, (ntr * rank * 8) as u64, Completion::Wait)? };
    for a in 0..rank {
        for b in a..rank {
            let (mut re, mut im) = (0f64, 0f64);
            for t in 0..ntr {
                let (x, y) = (u[a * ntr + t], u[b * ntr + t]);
                re += x[0] as f64 * y[0] as f64 + x[1] as f64 * y[1] as f64;
                im += x[0] as f64 * y[1] as f64 - x[1] as f64 * y[0] as f64;
            }
            let want = if a == b { 1.0 } else { 0.0 };
            let dev = ((re - want).powi(2) + im * im).sqrt();
            if !(dev <= BASIS_TOLERANCE) {
                fail!(
                    KMM_ERROR_INVALID_ARGUMENT,
                    "basis: columns {a} and {b} have inner product {re} + {im}i; the columns must be orthonormal (within {BASIS_TOLERANCE}), as kmm_qmri_compression_basis writes them"
                );
            }
        }
    }
    Ok(())
}

/// Matches `nvoxels` signals (`ntr x nvoxels` complex f32) against a dictionary (`ntr x
/// natoms`), compressed as `compression` says. With U the basis (the identity when
/// uncompressed), an atom d and a signal x, the atom is matched as its projection U U^H d: the
/// score |(U^H d)^H (U^H x)| / (||U^H d|| ||x||) is the cosine between x and that projection
/// (with the norm of the uncompressed signal, so that batches and bases compare), and the PD is
/// (U^H d)^H (U^H x) / ||U^H d||. `check_basis_first` reads a given basis first and refuses one
/// whose columns are not orthonormal.
#[allow(clippy::too_many_arguments)]
pub fn match_dictionary(
    m: &Manager,
    dict: u64,
    ntr: u64,
    natoms: u64,
    signals: u64,
    nvoxels: u64,
    compression: Compression,
    check_basis_first: bool,
    outs: MatchBuffers,
) -> Result<()> {
    check_ntr(ntr)?;
    if natoms == 0 {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "natoms = 0: the dictionary is empty");
    }
    check_count("natoms", natoms)?;
    check_count("nvoxels", nvoxels)?;
    match compression {
        Compression::Full => {}
        Compression::OwnBasis(rank) if rank as u64 > ntr => {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "rank = {rank} must be in 0..=ntr ({ntr}); 0 means no compression")
        }
        Compression::OwnBasis(_) => {}
        Compression::Basis { rank, .. } => check_rank(rank as u64, ntr)?,
    }
    if outs.index == 0 {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "outputs->index = 0: the index output is required");
    }
    if outs.accumulate && outs.score == 0 {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "KMM_MATCH_ACCUMULATE needs outputs->score: results are kept by score");
    }
    match outs.atom_offset.checked_add(natoms) {
        Some(end) if end <= MAX_COUNT => {}
        _ => fail!(KMM_ERROR_INVALID_ARGUMENT, "atom_offset = {} + natoms = {natoms} exceeds {MAX_COUNT} (indices are int32)", outs.atom_offset),
    }
    if outs.out_params != 0 && outs.params == 0 {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "outputs->params is given but params = 0: the dictionary's atom parameters are needed");
    }
    let mut pins = Pins::new(m);
    let d = pins.map(dict, bytes(bytes(ntr, natoms, "ntr x natoms")?, 8, "dictionary")?, "dictionary")?;
    let s = pins.map(signals, bytes(bytes(ntr, nvoxels, "ntr x nvoxels")?, 8, "signals")?, "signals")?;
    let mapped = match compression {
        Compression::Full => MappedCompression::Full,
        // A basis of the whole TR space changes no score.
        Compression::OwnBasis(rank) if rank == 0 || rank as u64 == ntr => MappedCompression::Full,
        Compression::OwnBasis(rank) => MappedCompression::OwnBasis(rank),
        Compression::Basis { handle, rank } => {
            let addr = pins.map(handle, bytes(bytes(ntr, rank as u64, "ntr x rank")?, 8, "basis")?, "basis")?;
            if check_basis_first {
                check_basis(m, handle, ntr as usize, rank)?;
            }
            MappedCompression::Basis { addr, rank }
        }
    };
    let mut a = MatchAddrs { index: pins.map(outs.index, bytes(nvoxels, 4, "outputs->index")?, "outputs->index")?, ..Default::default() };
    if outs.score != 0 {
        a.score = pins.map(outs.score, bytes(nvoxels, 4, "outputs->score")?, "outputs->score")?;
    }
    if outs.pd != 0 {
        a.pd = pins.map(outs.pd, bytes(nvoxels, 8, "outputs->pd")?, "outputs->pd")?;
    }
    if outs.params != 0 {
        a.params = pins.map(outs.params, bytes(outs.atom_offset + natoms, 16, "params")?, "params")?;
    }
    if outs.out_params != 0 {
        a.out_params = pins.map(outs.out_params, bytes(nvoxels, 16, "outputs->params")?, "outputs->params")?;
    }
    let basis = match compression {
        Compression::Basis { handle, rank } => Operand::input("basis", handle, ntr * rank as u64 * 8),
        _ => Operand::input("basis", 0, 0),
    };
    check_disjoint(
        m,
        &[
            Operand::input("dictionary", dict, ntr * natoms * 8),
            Operand::input("signals", signals, ntr * nvoxels * 8),
            basis,
            Operand::input("params", outs.params, natoms * 16).at(outs.atom_offset * 16),
            Operand::output("outputs->index", outs.index, nvoxels * 4),
            Operand::output("outputs->score", outs.score, nvoxels * 4),
            Operand::output("outputs->pd", outs.pd, nvoxels * 8),
            Operand::output("outputs->params", outs.out_params, nvoxels * 16),
        ],
    )?;
    a.atom_offset = outs.atom_offset;
    a.accumulate = outs.accumulate;
    let (ntr, natoms, nvoxels) = (ntr as usize, natoms as usize, nvoxels as usize);
    match m.backend_kind() {
        BackendKind::Cuda => gpu::match_dictionary(m, d, ntr, natoms, s, nvoxels, mapped, a),
        BackendKind::Host => {
            let (d, s) = (Addr(d), Addr(s));
            queue_on_host(
                m,
                Box::new(move || unsafe {
                    let dict = d.slice::<[f32; 2]>(ntr * natoms);
                    let sig = s.slice::<[f32; 2]>(ntr * nvoxels);
                    let xn = cpu::column_norms(sig, ntr);
                    let (u, rank) = match mapped {
                        MappedCompression::Full => (None, ntr),
                        MappedCompression::OwnBasis(rank) => (Some(svd::compression_basis(dict, ntr, rank)), rank),
                        MappedCompression::Basis { addr, rank } => {
                            let u = Addr(addr).slice::<[f32; 2]>(ntr * rank).iter().map(|c| cpu::C64::new(c[0] as f64, c[1] as f64));
                            (Some(u.collect()), rank)
                        }
                    };
                    let found = match u {
                        None => cpu::match_columns(dict, ntr, sig, &cpu::column_norms(dict, ntr), &xn),
                        Some(u) => {
                            let dc = svd::project(&u, ntr, rank, dict);
                            cpu::match_columns(&dc, rank, &svd::project(&u, ntr, rank, sig), &cpu::column_norms(&dc, rank), &xn)
                        }
                    };
                    write_matches(&found, a);
                }),
            )
        }
    }
}

/// # Safety
/// The addresses are host memory of the sizes checked in `match_dictionary`.
unsafe fn write_matches(found: &[cpu::Match], a: MatchAddrs) {
    let n = found.len();
    let index = Addr(a.index).slice_mut::<i32>(n);
    let mut score = (a.score != 0).then(|| Addr(a.score).slice_mut::<f32>(n));
    let mut pd = (a.pd != 0).then(|| Addr(a.pd).slice_mut::<[f32; 2]>(n));
    let mut out_params = (a.out_params != 0).then(|| Addr(a.out_params).slice_mut::<Atom>(n));
    for (v, f) in found.iter().enumerate() {
        // Accumulating, a batch replaces only a strictly better result, and a voxel that
        // matches nothing in it keeps the earlier one (or, with none yet, score < 0, gets the
        // no-match record).
        if a.accumulate {
            let earlier = score.as_ref().map_or(f32::NEG_INFINITY, |s| s[v]);
            if if f.index >= 0 { earlier >= f.score } else { earlier >= 0.0 } {
                continue;
            }
        }
        let matched = f.index >= 0;
        let j = f.index as i64 + a.atom_offset as i64;
        index[v] = if matched { j as i32 } else { -1 };
        if let Some(s) = score.as_mut() {
            s[v] = f.score;
        }
        if let Some(p) = pd.as_mut() {
            p[v] = f.pd;
        }
        if let Some(p) = out_params.as_mut() {
            p[v] = if matched { *(a.params as *const Atom).add(j as usize) } else { Atom::default() };
        }
    }
}
