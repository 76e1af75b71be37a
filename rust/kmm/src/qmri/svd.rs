//! Rank-k compression of a dictionary (the usual MRF speed-up): the dominant k-dimensional
//! subspace of the TR space, found by block subspace iteration on the Gram matrix D D^H.
//! Matching then runs on U^H D and U^H x, k values per atom instead of ntr.

use super::cpu::C64;
use rayon::prelude::*;

/// Subspace iterations; MRF dictionaries have fast-decaying spectra, so this is plenty.
const ITERATIONS: usize = 40;

/// The compression basis of a dictionary of `ntr`-long columns: the dominant rank-`k` subspace
/// of its TR space (`ntr x k`, column-major, orthonormal columns).
pub fn compression_basis(dict: &[[f32; 2]], ntr: usize, k: usize) -> Vec<C64> {
    dominant_subspace(&gram(dict, ntr), ntr, k)
}

/// The Gram matrix D D^H (`ntr x ntr`, column-major) of a dictionary of `ntr`-long columns.
pub fn gram(dict: &[[f32; 2]], ntr: usize) -> Vec<C64> {
    (0..ntr)
        .into_par_iter()
        .flat_map_iter(|col| {
            let mut out = vec![C64::ZERO; ntr];
            for d in dict.chunks(ntr) {
                let b = C64::new(d[col][0] as f64, -d[col][1] as f64); // conj(d[col])
                for (o, a) in out.iter_mut().zip(d) {
                    *o = *o + C64::new(a[0] as f64, a[1] as f64) * b;
                }
            }
            out
        })
        .collect()
}

/// An orthonormal basis (`ntr x k`, column-major) of the dominant k-dimensional invariant
/// subspace of the Hermitian positive semi-definite `g` (`ntr x ntr`).
pub fn dominant_subspace(g: &[C64], ntr: usize, k: usize) -> Vec<C64> {
    let mut v = start_block(ntr, k);
    for _ in 0..ITERATIONS {
        let w: Vec<C64> = (0..k)
            .into_par_iter()
            .flat_map_iter(|j| {
                let col = &v[j * ntr..(j + 1) * ntr];
                let mut out = vec![C64::ZERO; ntr];
                for (c, &x) in col.iter().enumerate() {
                    let gcol = &g[c * ntr..(c + 1) * ntr];
                    for (o, &a) in out.iter_mut().zip(gcol) {
                        *o = *o + a * x;
                    }
                }
                out
            })
            .collect();
        v = w;
        orthonormalize(&mut v, ntr, k);
    }
    v
}

/// The deterministic start of subspace iteration: a fixed pseudo-random `ntr x k` block with
/// orthonormal columns.
pub fn start_block(ntr: usize, k: usize) -> Vec<C64> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut rnd = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    };
    let mut v: Vec<C64> = (0..ntr * k).map(|_| C64::new(rnd(), rnd())).collect();
    orthonormalize(&mut v, ntr, k);
    v
}

/// Modified Gram-Schmidt, twice for stability. A column that vanishes becomes a unit vector
/// orthogonal to the earlier ones.
fn orthonormalize(v: &mut [C64], ntr: usize, k: usize) {
    for j in 0..k {
        for _ in 0..2 {
            for i in 0..j {
                let (head, tail) = v.split_at_mut(j * ntr);
                let qi = &head[i * ntr..(i + 1) * ntr];
                let vj = &mut tail[..ntr];
                let mut dot = C64::ZERO;
                for (q, x) in qi.iter().zip(vj.iter()) {
                    dot = dot + q.conj() * *x;
                }
                for (q, x) in qi.iter().zip(vj.iter_mut()) {
                    *x = *x - *q * dot;
                }
            }
        }
        let col = &mut v[j * ntr..(j + 1) * ntr];
        let n = col.iter().map(|c| c.norm_sqr()).sum::<f64>().sqrt();
        if n > 1e-300 {
            col.iter_mut().for_each(|c| *c = c.scale(1.0 / n));
        } else {
            col.iter_mut().for_each(|c| *c = C64::ZERO);
            col[j % ntr] = C64::new(1.0, 0.0);
        }
    }
}

/// U^H applied to each `ntr`-long column of `data`: `k`-long columns.
pub fn project(u: &[C64], ntr: usize, k: usize, data: &[[f32; 2]]) -> Vec<[f32; 2]> {
    data.par_chunks(ntr)
        .flat_map_iter(|x| {
            (0..k).map(move |j| {
                let mut dot = C64::ZERO;
                for (q, a) in u[j * ntr..(j + 1) * ntr].iter().zip(x) {
                    dot = dot + q.conj() * C64::new(a[0] as f64, a[1] as f64);
                }
                [dot.re as f32, dot.im as f32]
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_k_dictionary_is_captured_exactly_by_its_rank_k_subspace() {
        // Columns are combinations of 3 fixed vectors: the rank-3 basis keeps all their energy.
        let (ntr, natoms, k) = (50, 200, 3);
        let basis: Vec<Vec<[f32; 2]>> = (0..k)
            .map(|b| (0..ntr).map(|t| [((t * (b + 1)) as f32 * 0.3).cos(), ((t + b) as f32 * 0.17).sin()]).collect())
            .collect();
        let mut dict = Vec::new();
        for j in 0..natoms {
            for t in 0..ntr {
                let mut v = [0f32; 2];
                for (b, col) in basis.iter().enumerate() {
                    let w = ((j * 7 + b * 3) % 11) as f32 / 11.0 - 0.4;
                    v[0] += w * col[t][0];
                    v[1] += w * col[t][1];
                }
                dict.push(v);
            }
        }
        let u = dominant_subspace(&gram(&dict, ntr), ntr, k);
        // Orthonormal columns.
        for a in 0..k {
            for b in 0..k {
                let dot: C64 = (0..ntr).fold(C64::ZERO, |s, t| s + u[a * ntr + t].conj() * u[b * ntr + t]);
                let want = if a == b { 1.0 } else { 0.0 };
                assert!((dot.re - want).abs() < 1e-9 && dot.im.abs() < 1e-9, "U^H U[{a},{b}] = {dot:?}");
            }
        }
        // Projection keeps the norm of every atom.
        let small = project(&u, ntr, k, &dict);
        for j in 0..natoms {
            let n2 = |v: &[[f32; 2]]| v.iter().map(|c| (c[0] as f64).powi(2) + (c[1] as f64).powi(2)).sum::<f64>();
            let (full, kept) = (n2(&dict[j * ntr..(j + 1) * ntr]), n2(&small[j * k..(j + 1) * k]));
            assert!((full - kept).abs() <= 1e-4 * full.max(1e-12), "atom {j}: {kept} of {full}");
        }
    }
}
