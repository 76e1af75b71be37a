// Kmm qMRI kernels, compiled at run time by NVRTC (see rust/kmm/src/qmri/gpu.rs).
// FISP is specialised per state count: NS states, LANES threads per atom, K = ceil(NS/LANES)
// states per thread, all in registers. Thread `lane` of an atom holds states lane*K .. lane*K+K-1.

#ifndef NS
#define NS 32
#endif
#ifndef LANES
#define LANES 4
#endif
#define K ((NS + LANES - 1) / LANES)
#define TWO_PI 6.283185307179586f

__device__ __forceinline__ float2 cmul(float2 a, float2 b) {
    return make_float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}
__device__ __forceinline__ float2 cconj(float2 a) { return make_float2(a.x, -a.y); }
__device__ __forceinline__ float relaxf(float dt, float t) { return expf(-dt / t); }

// atoms: natoms x (T1, T2, B1, B0); out: ntr x natoms complex; table: nprof x ntr of
// (flip angle x profile scale, cos phase, sin phase, 0).
//
// The states are kept in the frame of the next pulse's phase psi (F = F' e^{i psi},
// conj(F-) = G' e^{-i psi}) with V = -2i Z. In that frame a pulse of flip a is a real rotation:
// with P = F + G and Q = F - G, P stays and (Q, V) turn by a (Q' = cos a Q + sin a V,
// V' = -sin a Q + cos a V). Relaxation, off-resonance and the change of frame to the next pulse
// act on every F state alike (and conjugate on G), so they are one complex factor u per TR and
// commute with the dephasing shift; Z's relaxation is real. This takes 24 flops a state per TR
// where the 3x3 complex matrix of Weigel's form takes 34. The signal at TE is F(0) brought back
// from the frame: e^{i psi} E2(TE) e^{i 2 pi B0 TE} F'(0).
// Up to 8 states per thread, two blocks of 256 threads fit per multiprocessor (<= 128 registers).
#if K <= 8
#define FISP_BOUNDS __launch_bounds__(256, 2)
#else
#define FISP_BOUNDS __launch_bounds__(256)
#endif
extern "C" __global__ void FISP_BOUNDS kmm_fisp(
    const float4* __restrict__ atoms, float2* __restrict__ out, const float4* __restrict__ table,
    int natoms, int ntr, int nprof, float tr, float te, float ti)
{
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long atom = tid / LANES;
    const int lane = threadIdx.x % LANES;
    const bool live = atom < natoms;
    const float4 p = live ? atoms[atom] : make_float4(1.f, 1.f, 1.f, 0.f);
    const float e2te = relaxf(te, p.y);
    const float e1tr = relaxf(tr, p.x), e2tr = relaxf(tr, p.y);
    const float e1ti = relaxf(ti, p.x);
    float s, c;
    sincosf(TWO_PI * p.w * te, &s, &c);
    // The readout's factor, and the half of (relaxation and precession over a TR) that turns
    // P + Q back into F.
    const float2 a = make_float2(e2te * c, e2te * s);
    sincosf(TWO_PI * p.w * tr, &s, &c);
    const float2 half_tr = make_float2(0.5f * e2tr * c, 0.5f * e2tr * s);
    const float regrow = -2.f * (1.f - e1tr);  // V(0)'s imaginary part gains this each TR
    float2* o = out + atom * (long long)ntr;

    float2 F[K], G[K], V[K];
    for (int pr = 0; pr < nprof; ++pr) {
#pragma unroll
        for (int j = 0; j < K; ++j) {
            F[j] = make_float2(0.f, 0.f);
            G[j] = make_float2(0.f, 0.f);
            V[j] = make_float2(0.f, 0.f);
        }
        // Adiabatic inversion, relaxation over TI: Z(0) = 1 - 2 E1(TI), V = -2i Z.
        if (lane == 0) V[0].y = -2.f * (1.f - 2.f * e1ti);
        const float4* t = table + (long long)pr * ntr;
        float4 next = t[0];
        for (int n = 0; n < ntr; ++n) {
            const float4 rf = next;
            next = t[n + 1 < ntr ? n + 1 : n];
            // The intrinsic holds its error (< 5e-7) within +-pi: flips (times B1 and the
            // profile) are brought there first.
            float sa, ca, flip = rf.x * p.z;
            flip = fmaf(-TWO_PI, rintf(flip * (1.f / TWO_PI)), flip);
            __sincosf(flip, &sa, &ca);
            const float2 e = make_float2(rf.y, rf.z);
            // From this pulse's frame to the next one's, with a TR's relaxation and precession.
            const float2 u = cmul(half_tr, cmul(e, make_float2(next.y, -next.z)));
            const float vq = -e1tr * sa, vv = e1tr * ca;
            float2 s0 = make_float2(0.f, 0.f);
#pragma unroll
            for (int j = 0; j < K; ++j) {
                const float2 f = F[j], g = G[j], v = V[j];
                const float2 pp = make_float2(f.x + g.x, f.y + g.y);
                const float2 q = make_float2(f.x - g.x, f.y - g.y);
                const float2 q2 = make_float2(fmaf(ca, q.x, sa * v.x), fmaf(ca, q.y, sa * v.y));
                V[j] = make_float2(fmaf(vq, q.x, vv * v.x), fmaf(vq, q.y, vv * v.y));
                const float2 sum = make_float2(pp.x + q2.x, pp.y + q2.y);
                const float2 dif = make_float2(pp.x - q2.x, pp.y - q2.y);
                if (j == 0) s0 = sum;
                F[j] = cmul(u, sum);
                G[j] = cmul(cconj(u), dif);
            }
            if (lane == 0) {
                V[0].y += regrow;
                if (live) {
                    // F(0) after the pulse is sum / 2, in the pulse's frame.
                    float2 v = cmul(cmul(a, e), make_float2(0.5f * s0.x, 0.5f * s0.y));
                    if (pr > 0) { float2 w = o[n]; v.x += w.x; v.y += w.y; }
                    o[n] = v;
                }
            }
            // Dephasing: conj(F-) down one state, F+ up one, F+(0) = conj(conj(F-)(0)); a
            // frame turns F and conj(F-) by conjugate phases, so the rule holds in any frame.
#if LANES > 1
            const float upx = __shfl_down_sync(0xffffffffu, G[0].x, 1, LANES);
            const float upy = __shfl_down_sync(0xffffffffu, G[0].y, 1, LANES);
            const float dnx = __shfl_up_sync(0xffffffffu, F[K - 1].x, 1, LANES);
            const float dny = __shfl_up_sync(0xffffffffu, F[K - 1].y, 1, LANES);
#else
            const float upx = 0.f, upy = 0.f, dnx = 0.f, dny = 0.f;
#endif
#pragma unroll
            for (int j = 0; j < K - 1; ++j) G[j] = G[j + 1];
            G[K - 1] = (lane == LANES - 1) ? make_float2(0.f, 0.f) : make_float2(upx, upy);
#pragma unroll
            for (int j = K - 1; j > 0; --j) F[j] = F[j - 1];
            F[0] = (lane == 0) ? cconj(G[0]) : make_float2(dnx, dny);
            if (LANES * K > NS) {
#pragma unroll
                for (int j = 0; j < K; ++j)
                    if (lane * K + j >= NS) F[j] = make_float2(0.f, 0.f);
            }
        }
    }
}

// ---- pSSFP (isochromats) ----------------------------------------------------------------

__device__ __forceinline__ void rodrigues(float3& m, float ax, float ay, float az) {
    const float theta = sqrtf(ax * ax + ay * ay + az * az);
    if (theta == 0.f) return;
    const float inv = 1.f / theta;
    const float kx = ax * inv, ky = ay * inv, kz = az * inv;
    float s, c;
    sincosf(theta, &s, &c);
    const float cx = ky * m.z - kz * m.y, cy = kz * m.x - kx * m.z, cz = kx * m.y - ky * m.x;
    const float d = (kx * m.x + ky * m.y + kz * m.z) * (1.f - c);
    m = make_float3(c * m.x + s * cx + d * kx, c * m.y + s * cy + d * ky, c * m.z + s * cz + d * kz);
}

__device__ __forceinline__ void decay_regrow(float3& m, float e1, float e2) {
    m.x *= e2; m.y *= e2; m.z = fmaf(m.z, e1, 1.f - e1);
}

__device__ __forceinline__ void rot_xy(float3& m, float theta) {
    float s, c;
    sincosf(theta, &s, &c);
    const float x = m.x, y = m.y;
    m.x = c * x - s * y;
    m.y = s * x + c * y;
}

// rf: ntr of (flip angle, cos phase, sin phase, 0); shape: nrf; z: nz positions.
extern "C" __global__ void __launch_bounds__(128) kmm_pssfp(
    const float4* __restrict__ atoms, float2* __restrict__ out, const float4* __restrict__ rf,
    const float* __restrict__ shape, const float* __restrict__ zs,
    int natoms, int ntr, int nrf, int nz, float dt_ex, float dt_inv, float dt_pr, float gz_ex, float gz_pr)
{
    const long long atom = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (atom >= natoms) return;
    const float4 p = atoms[atom];
    const float e1ex = relaxf(dt_ex, p.x), e2ex = relaxf(dt_ex, p.y);
    const float e1pr = relaxf(dt_pr, p.x), e2pr = relaxf(dt_pr, p.y);
    const float e1inv = relaxf(dt_inv, p.x);
    float2* o = out + atom * (long long)ntr;
    for (int iz = 0; iz < nz; ++iz) {
        const float z = zs[iz];
        const float off_ex = -(gz_ex * z) - dt_ex * TWO_PI * p.w;
        float3 m = make_float3(0.f, 0.f, cospif(p.z));
        m.z = fmaf(m.z, e1inv, 1.f - e1inv);
        // alpha/2 prepulse with the first TR's phase and opposite sign
        {
            const float4 r = rf[0];
            const float amp = -0.5f * r.x;
            for (int j = 0; j < nrf; ++j) {
                const float w = amp * shape[j];
                rodrigues(m, w * r.y * p.z, -w * r.z * p.z, off_ex);
                decay_regrow(m, e1ex, e2ex);
            }
            rot_xy(m, -(2.f * gz_pr * z) - dt_pr * TWO_PI * p.w);
            decay_regrow(m, e1pr, e2pr);
        }
        const float theta_pr = -(gz_pr * z) - dt_pr * TWO_PI * p.w;
        for (int n = 0; n < ntr; ++n) {
            const float4 r = rf[n];
            for (int j = 0; j < nrf; ++j) {
                const float w = r.x * shape[j];
                rodrigues(m, w * r.y * p.z, -w * r.z * p.z, off_ex);
                decay_regrow(m, e1ex, e2ex);
            }
            rot_xy(m, theta_pr);
            decay_regrow(m, e1pr, e2pr);
            float2 v = make_float2(m.x, m.y);
            if (iz > 0) { const float2 w = o[n]; v.x += w.x; v.y += w.y; }
            o[n] = v;
            rot_xy(m, theta_pr);
            decay_regrow(m, e1pr, e2pr);
        }
    }
}

// ---- matching -----------------------------------------------------------------------------

// One warp per atom: 1/||d|| (0 for a zero atom).
extern "C" __global__ void kmm_inv_norms(const float2* __restrict__ dict, int ntr, int natoms, float* __restrict__ inv)
{
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (warp >= natoms) return;
    const float2* d = dict + warp * (long long)ntr;
    float s = 0.f;
    for (int i = lane; i < ntr; i += 32) s += d[i].x * d[i].x + d[i].y * d[i].y;
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0) inv[warp] = s > 0.f ? rsqrtf(s) : 0.f;
}

// One block per voxel of the chunk: the best atom by |c| / ||d||, c = (D^H x) from the GEMM
// (on compressed columns when the match is compressed; `inv` is then 1/||U^H d||). `sig` are the
// uncompressed signals: scores are cosines between the whole signal and the (projected) atom.
// Only a strictly positive score matches: a zero or NaN signal, or a batch of zero or NaN
// atoms, matches nothing (index -1, or the earlier result kept when accumulating).
extern "C" __global__ void __launch_bounds__(256) kmm_argmax(
    const float2* __restrict__ c, long long ldc, int natoms, const float* __restrict__ inv,
    const float2* __restrict__ sig, int ntr,
    int* __restrict__ index, float* __restrict__ score, float2* __restrict__ pd,
    const float4* __restrict__ params, float4* __restrict__ out_params, long long atom_offset, int accumulate)
{
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    __shared__ float norm_s[32];
    const int v = blockIdx.x;
    const float2* col = c + (long long)v * ldc;
    float bv = 0.f;
    int bi = -1;
    for (int i = threadIdx.x; i < natoms; i += blockDim.x) {
        const float2 x = col[i];
        const float w = inv[i];
        const float s = (x.x * x.x + x.y * x.y) * (w * w);
        if (s > bv) { bv = s; bi = i; }
    }
    float xs = 0.f;
    const float2* xv = sig + (long long)v * ntr;
    for (int i = threadIdx.x; i < ntr; i += blockDim.x) xs += xv[i].x * xv[i].x + xv[i].y * xv[i].y;
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_down_sync(0xffffffffu, bv, off);
        const int oi = __shfl_down_sync(0xffffffffu, bi, off);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        xs += __shfl_down_sync(0xffffffffu, xs, off);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) { best_v[warp] = bv; best_i[warp] = bi; norm_s[warp] = xs; }
    __syncthreads();
    if (threadIdx.x == 0) {
        const int nw = (blockDim.x + 31) / 32;
        bv = best_v[0]; bi = best_i[0]; xs = norm_s[0];
        for (int w = 1; w < nw; ++w) {
            if (best_v[w] > bv || (best_v[w] == bv && best_i[w] < bi)) { bv = best_v[w]; bi = best_i[w]; }
            xs += norm_s[w];
        }
        const float sc = sqrtf(bv) * rsqrtf(xs);
        const bool matched = bi >= 0 && isfinite(sc);
        // An earlier dictionary batch did better, or this one matches nothing (an earlier
        // match is kept; a voxel that has none yet, score < 0, gets the no-match record).
        if (accumulate && (matched ? score[v] >= sc : score[v] >= 0.f)) return;
        if (!matched) {
            index[v] = -1;
            if (score) score[v] = 0.f;
            if (pd) pd[v] = make_float2(0.f, 0.f);
            if (out_params) out_params[v] = make_float4(0.f, 0.f, 0.f, 0.f);
            return;
        }
        const long long j = bi + atom_offset;
        index[v] = (int)j;
        const float2 x = col[bi];
        const float w = inv[bi];
        if (score) score[v] = sc;
        if (pd) pd[v] = make_float2(x.x * w, x.y * w);
        if (out_params) out_params[v] = params[j];
    }
}

// ---- fused compressed matching ------------------------------------------------------------

// Compressed matching without the GEMM's scratch: each block keeps MATCH_V voxels' coordinates
// (k <= MATCH_K values each) in shared memory and streams the atoms through in tiles of
// MATCH_A, each thread computing 8 voxels x 4 atoms of inner products in registers and keeping
// its best atom per voxel; the 16 threads that share a voxel then reduce (ties: the lower
// index). `dict` and `xs` are k x natoms and k x nvox complex (coordinates in the basis), `inv`
// 1/||U^H d|| per atom, `inv_x` 1/||x|| of the uncompressed signals. Outputs as kmm_argmax.
#define MATCH_V 128
#define MATCH_A 64
#define MATCH_K 32
extern "C" __global__ void __launch_bounds__(256) kmm_match_fused(
    const float2* __restrict__ dict, int k, int natoms, const float* __restrict__ inv,
    const float2* __restrict__ xs, const float* __restrict__ inv_x, int nvox,
    int* __restrict__ index, float* __restrict__ score, float2* __restrict__ pd,
    const float4* __restrict__ params, float4* __restrict__ out_params, long long atom_offset, int accumulate)
{
    __shared__ float2 X[MATCH_K][MATCH_V];
    // The atom tile, atom-major: stored without bank conflicts, read as broadcasts. Declared as
    // float4 for the 16-byte alignment of its two-value copies.
    __shared__ float4 A4[MATCH_A * MATCH_K / 2];
    float2 (*A)[MATCH_K] = (float2 (*)[MATCH_K])A4;
    const int t = threadIdx.x;
    const int vg = t % 16, ag = t / 16;   // voxels vg + 16 j (j < 8), atoms ag + 16 i (i < 4)
    const long long v0 = (long long)blockIdx.x * MATCH_V;
    for (int e = t; e < k * MATCH_V; e += 256) {
        const int v = e / k, kk = e % k;
        X[kk][v] = v0 + v < nvox ? xs[(v0 + v) * k + kk] : make_float2(0.f, 0.f);
    }
    float best[8];
    int bi[8];
    for (int j = 0; j < 8; ++j) { best[j] = 0.f; bi[j] = -1; }
    for (long long a0 = 0; a0 < natoms; a0 += MATCH_A) {
        __syncthreads();  // the previous tile is read (and X is written, the first time)
        if (k == MATCH_K) {
            // The tile is as the dictionary lays it out: copy it two values at a time, with no
            // division per value (a few percent of the kernel at rank 32).
            const float4* src = (const float4*)(dict + a0 * MATCH_K);
            float4* dst = A4;
            for (int e = t; e < MATCH_A * MATCH_K / 2; e += 256)
                dst[e] = a0 + e / (MATCH_K / 2) < natoms ? src[e] : make_float4(0.f, 0.f, 0.f, 0.f);
        } else {
            for (int e = t; e < k * MATCH_A; e += 256) {
                const int a = e / k, kk = e % k;
                A[a][kk] = a0 + a < natoms ? dict[(a0 + a) * k + kk] : make_float2(0.f, 0.f);
            }
        }
        __syncthreads();
        float2 acc[8][4];
        for (int j = 0; j < 8; ++j)
            for (int i = 0; i < 4; ++i) acc[j][i] = make_float2(0.f, 0.f);
#pragma unroll 4
        for (int kk = 0; kk < k; ++kk) {
            float2 xv[8], av[4];
            for (int j = 0; j < 8; ++j) xv[j] = X[kk][vg + 16 * j];
            for (int i = 0; i < 4; ++i) av[i] = A[ag + 16 * i][kk];
            for (int j = 0; j < 8; ++j)
                for (int i = 0; i < 4; ++i) {
                    // conj(a) * x
                    acc[j][i].x += av[i].x * xv[j].x + av[i].y * xv[j].y;
                    acc[j][i].y += av[i].x * xv[j].y - av[i].y * xv[j].x;
                }
        }
        // Atoms in increasing order within the thread: a strict > keeps the first of ties.
        for (int i = 0; i < 4; ++i) {
            const long long a = a0 + ag + 16 * i;
            const float w = a < natoms ? inv[a] : 0.f;
            for (int j = 0; j < 8; ++j) {
                const float s = (acc[j][i].x * acc[j][i].x + acc[j][i].y * acc[j][i].y) * (w * w);
                if (s > best[j]) { best[j] = s; bi[j] = (int)a; }
            }
        }
    }
    // Reduce over the 16 atom groups of each voxel, in the atom tile's shared memory.
    __syncthreads();
    float* rv = (float*)&A[0][0];                 // [16][MATCH_V]: A's 16 KiB again
    int* ri = (int*)(rv + 16 * MATCH_V);          // [16][MATCH_V]
    for (int j = 0; j < 8; ++j) {
        rv[ag * MATCH_V + vg + 16 * j] = best[j];
        ri[ag * MATCH_V + vg + 16 * j] = bi[j];
    }
    __syncthreads();
    if (t >= MATCH_V) return;
    const long long v = v0 + t;
    if (v >= nvox) return;
    float bv = rv[t];
    int b = ri[t];
    for (int g = 1; g < 16; ++g) {
        const float ov = rv[g * MATCH_V + t];
        const int oi = ri[g * MATCH_V + t];
        if (ov > bv || (ov == bv && oi >= 0 && (b < 0 || oi < b))) { bv = ov; b = oi; }
    }
    const float sc = sqrtf(bv) * inv_x[v];
    const bool matched = b >= 0 && isfinite(sc);
    if (accumulate && (matched ? score[v] >= sc : score[v] >= 0.f)) return;   // as kmm_argmax
    if (!matched) {
        index[v] = -1;
        if (score) score[v] = 0.f;
        if (pd) pd[v] = make_float2(0.f, 0.f);
        if (out_params) out_params[v] = make_float4(0.f, 0.f, 0.f, 0.f);
        return;
    }
    const long long j = b + atom_offset;
    index[v] = (int)j;
    if (score) score[v] = sc;
    if (pd) {
        float2 c = make_float2(0.f, 0.f);
        const float2* d = dict + (long long)b * k;
        for (int kk = 0; kk < k; ++kk) {
            c.x += d[kk].x * X[kk][t].x + d[kk].y * X[kk][t].y;
            c.y += d[kk].x * X[kk][t].y - d[kk].y * X[kk][t].x;
        }
        pd[v] = make_float2(c.x * inv[b], c.y * inv[b]);
    }
    if (out_params) out_params[v] = params[j];
}
