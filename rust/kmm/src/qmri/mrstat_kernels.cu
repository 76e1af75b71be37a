// Kmm MR-STAT kernels (float32 data), the GPU counterparts of the f64 reference in
// rust/kmm/src/qmri/mrstat/ (signal.rs, jacobian.rs, fisp.rs); compiled at run time by NVRTC
// (no host headers) and, for the tests, as C++ with a CUDA shim (tests/mrstat_kernels_on_cpu.rs).
//
// Layouts (as the reference, mrstat/mod.rs):
//   voxel data x, y, t2, b0: nvoxels floats each; rho: nvoxels complex
//   m, dm/dT1, dm/dT2:     nreadouts x nvoxels complex, readout fastest   m[v * nreadouts + r]
//   coils C:               nvoxels x ncoils complex, voxel fastest        C[c * nvoxels + v]
//   signal S, J.v, w:      nsamples x nreadouts x ncoils, sample fastest  S[(c * nreadouts + r) * nsamples + s]
//   parameter vectors:     4 x nvoxels floats, parameter fastest (T1, T2, Re rho, Im rho)  p[v * 4 + j]
//   trajectory:            cartesian != 0: k = k0[r] (nreadouts complex) + s dk[r] (nreadouts complex);
//                          cartesian == 0: k = k[r * nsamples + s] (nsamples x nreadouts), dk unused
//   sample time            t_s = (s - nsamples / 2) dt
//
// Precision: the phase 2 pi B0 t - k.x is formed and reduced to [-pi, pi] in double (exact
// products of float inputs), then sin/cos in float; sums over voxels go through float partial
// sums per tile of MS_TILE voxels into double accumulators; the adjoint accumulates in double.

#ifndef NS
#define NS 32
#endif
// Voxels staged in shared memory per tile, and coils per thread (grid z covers the coil groups).
#ifndef MS_TILE
#define MS_TILE 64
#endif
#ifndef MS_CG
#define MS_CG 4
#endif
// The adjoint's block reduction holds one double per thread and sum: blockDim.x <= this.
#define MS_ADJ_MAX_BLOCK 256
#define MS_TWO_PI_F 6.283185307179586f
#define MS_TWO_PI_D 6.283185307179586476925286766559
#define MS_INV_TWO_PI_D 0.15915494309189533576888376337251

__device__ __forceinline__ float2 ms_cmul(float2 a, float2 b) {
    return make_float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}
// conj(a) * b
__device__ __forceinline__ float2 ms_cmulc(float2 a, float2 b) {
    return make_float2(a.x * b.x + a.y * b.y, a.x * b.y - a.y * b.x);
}
__device__ __forceinline__ float2 ms_cadd(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }
__device__ __forceinline__ float2 ms_cscale(float2 a, float s) { return make_float2(a.x * s, a.y * s); }

// exp(-t / T2) exp(i (wb t - (kx x + ky y))), wb = 2 pi B0, it2 = 1 / T2 (0 for T2 = +Inf).
__device__ __forceinline__ float2 ms_readout(double kx, double ky, double x, double y, double wb, double td, float t, float it2) {
    double ph = fma(wb, td, -fma(kx, x, ky * y));
    ph = fma(-rint(ph * MS_INV_TWO_PI_D), MS_TWO_PI_D, ph);
    float s, c;
    sincosf((float)ph, &s, &c);
    const float e = expf(-t * it2);
    return make_float2(e * c, e * s);
}

// The k-space position of sample s of readout r (double, from float inputs).
__device__ __forceinline__ void ms_kpos(const float2* __restrict__ k, const float2* __restrict__ dk, int cartesian,
                                        int r, int s, int nsamples, double& kx, double& ky) {
    if (cartesian) {
        const float2 a = k[r], b = dk[r];
        kx = fma((double)s, (double)b.x, (double)a.x);
        ky = fma((double)s, (double)b.y, (double)a.y);
    } else {
        const float2 a = k[(long long)r * nsamples + s];
        kx = a.x;
        ky = a.y;
    }
}

// out[c, r, s] = sum_v C[c, v] (A_v(r) + t_s B_v(r)) E_v(r, s): the signal (A = rho m, B = 0)
// and J.v (A = rho (v_T1 dm/dT1 + v_T2 dm/dT2) + (v_Re + i v_Im) m, B = rho m v_T2 / T2^2).
// Block: blockDim.x threads over the samples of one readout (any multiple of 32; threads past
// nsamples only help staging); grid: x covers the samples, y strides over readouts, z over
// groups of MS_CG coils.
template <bool JAC>
__device__ __forceinline__ void ms_synthesize(
    const float* __restrict__ x, const float* __restrict__ y, const float2* __restrict__ rho,
    const float* __restrict__ t2, const float* __restrict__ b0, const float2* __restrict__ coils,
    const float2* __restrict__ m, const float2* __restrict__ dm_t1, const float2* __restrict__ dm_t2,
    const float* __restrict__ vec, const float2* __restrict__ k, const float2* __restrict__ dk,
    float2* __restrict__ out, int nvoxels, int ncoils, int nreadouts, int nsamples, float dt, int cartesian)
{
    __shared__ double sx[MS_TILE], sy[MS_TILE], swb[MS_TILE];
    __shared__ float sit2[MS_TILE];
    __shared__ float2 sa[MS_CG][MS_TILE];
    __shared__ float2 sb[JAC ? MS_CG : 1][JAC ? MS_TILE : 1];
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    const bool live = s < nsamples;
    const double td = ((double)s - 0.5 * (double)nsamples) * (double)dt;
    const float t = (float)td;
    for (int cg = blockIdx.z; cg * MS_CG < ncoils; cg += gridDim.z) {
        const int c0 = cg * MS_CG;
        for (int r = blockIdx.y; r < nreadouts; r += gridDim.y) {
            double kx = 0.0, ky = 0.0;
            if (live) ms_kpos(k, dk, cartesian, r, s, nsamples, kx, ky);
            double acc[MS_CG][2];
#pragma unroll
            for (int c = 0; c < MS_CG; ++c) acc[c][0] = acc[c][1] = 0.0;
            for (int v0 = 0; v0 < nvoxels; v0 += MS_TILE) {
                __syncthreads();  // the previous tile is read
                for (int i = threadIdx.x; i < MS_TILE; i += blockDim.x) {
                    const int v = v0 + i;
                    float2 a = make_float2(0.f, 0.f), b = make_float2(0.f, 0.f);
                    if (v < nvoxels) {
                        sx[i] = x[v];
                        sy[i] = y[v];
                        swb[i] = MS_TWO_PI_D * (double)b0[v];
                        const float it2 = 1.f / t2[v];
                        sit2[i] = it2;
                        const long long iv = (long long)v * nreadouts + r;
                        const float2 p = rho[v], mv = m[iv];
                        if (JAC) {
                            const float* q = vec + 4LL * v;
                            const float2 d1 = dm_t1[iv], d2 = dm_t2[iv];
                            const float2 dm = make_float2(q[0] * d1.x + q[1] * d2.x, q[0] * d1.y + q[1] * d2.y);
                            a = ms_cadd(ms_cmul(p, dm), ms_cmul(make_float2(q[2], q[3]), mv));
                            b = ms_cscale(ms_cmul(p, mv), q[1] * it2 * it2);
                        } else {
                            a = ms_cmul(p, mv);
                        }
                    } else {
                        sx[i] = 0.0; sy[i] = 0.0; swb[i] = 0.0; sit2[i] = 0.f;
                    }
#pragma unroll
                    for (int c = 0; c < MS_CG; ++c) {
                        const float2 cc = c0 + c < ncoils && v < nvoxels ? coils[(long long)(c0 + c) * nvoxels + v] : make_float2(0.f, 0.f);
                        sa[c][i] = ms_cmul(cc, a);
                        if (JAC) sb[c][i] = ms_cmul(cc, b);
                    }
                }
                __syncthreads();
                if (live) {
                    const int n = nvoxels - v0 < MS_TILE ? nvoxels - v0 : MS_TILE;
                    float2 part[MS_CG];
#pragma unroll
                    for (int c = 0; c < MS_CG; ++c) part[c] = make_float2(0.f, 0.f);
                    for (int i = 0; i < n; ++i) {
                        const float2 e = ms_readout(kx, ky, sx[i], sy[i], swb[i], td, t, sit2[i]);
#pragma unroll
                        for (int c = 0; c < MS_CG; ++c) {
                            float2 w = sa[c][i];
                            if (JAC) { const float2 wb = sb[c][i]; w.x = fmaf(t, wb.x, w.x); w.y = fmaf(t, wb.y, w.y); }
                            part[c].x = fmaf(w.x, e.x, fmaf(-w.y, e.y, part[c].x));
                            part[c].y = fmaf(w.x, e.y, fmaf(w.y, e.x, part[c].y));
                        }
                    }
#pragma unroll
                    for (int c = 0; c < MS_CG; ++c) { acc[c][0] += part[c].x; acc[c][1] += part[c].y; }
                }
            }
            if (live) {
#pragma unroll
                for (int c = 0; c < MS_CG; ++c)
                    if (c0 + c < ncoils)
                        out[((long long)(c0 + c) * nreadouts + r) * nsamples + s] = make_float2((float)acc[c][0], (float)acc[c][1]);
            }
        }
    }
}

// S[c, r, s] = sum_v C[c, v] rho_v m_v(r) exp(-t_s/T2_v) exp(i 2 pi B0_v t_s) exp(-i k[r, s].x_v).
// Launch: block (B, 1, 1), B a multiple of 32 (128 suits nsamples >= 128; 32 or 64 for short
// readouts); grid (ceil(nsamples / B), min(nreadouts, 65535), ceil(ncoils / MS_CG));
// static shared memory 3.5 KiB (MS_TILE 64, MS_CG 4).
extern "C" __global__ void __launch_bounds__(256) kmm_mrstat_signal(
    const float* __restrict__ x, const float* __restrict__ y, const float2* __restrict__ rho,
    const float* __restrict__ t2, const float* __restrict__ b0, const float2* __restrict__ coils,
    const float2* __restrict__ m, const float2* __restrict__ k, const float2* __restrict__ dk,
    float2* __restrict__ out, int nvoxels, int ncoils, int nreadouts, int nsamples, float dt, int cartesian)
{
    ms_synthesize<false>(x, y, rho, t2, b0, coils, m, 0, 0, 0, k, dk, out, nvoxels, ncoils, nreadouts, nsamples, dt, cartesian);
}

// J.v for the parameters (T1, T2, Re rho, Im rho) of every voxel; `vec` is 4 x nvoxels,
// parameter fastest; dm_t1, dm_t2 as m. Output signal-shaped. Launch as kmm_mrstat_signal;
// static shared memory 5.5 KiB.
extern "C" __global__ void __launch_bounds__(256) kmm_mrstat_jacobian(
    const float* __restrict__ x, const float* __restrict__ y, const float2* __restrict__ rho,
    const float* __restrict__ t2, const float* __restrict__ b0, const float2* __restrict__ coils,
    const float2* __restrict__ m, const float2* __restrict__ dm_t1, const float2* __restrict__ dm_t2,
    const float* __restrict__ vec, const float2* __restrict__ k, const float2* __restrict__ dk,
    float2* __restrict__ out, int nvoxels, int ncoils, int nreadouts, int nsamples, float dt, int cartesian)
{
    ms_synthesize<true>(x, y, rho, t2, b0, coils, m, dm_t1, dm_t2, vec, k, dk, out, nvoxels, ncoils, nreadouts, nsamples, dt, cartesian);
}

// Re(J^H w) into out (4 x nvoxels floats, parameter fastest: T1, T2, Re rho, Im rho). One
// block per voxel (grid-stride over voxels): the threads stride over the (r, s) samples, sum the
// coils, and accumulate in double; then a block reduction in shared memory.
// Launch: block (B, 1, 1), B a multiple of 32 and <= MS_ADJ_MAX_BLOCK (256; 128 suggested);
// grid (min(nvoxels, 2^31 - 1), 1, 1); static shared memory 12 KiB.
extern "C" __global__ void __launch_bounds__(MS_ADJ_MAX_BLOCK) kmm_mrstat_jacobian_adjoint(
    const float* __restrict__ x, const float* __restrict__ y, const float2* __restrict__ rho,
    const float* __restrict__ t2, const float* __restrict__ b0, const float2* __restrict__ coils,
    const float2* __restrict__ m, const float2* __restrict__ dm_t1, const float2* __restrict__ dm_t2,
    const float2* __restrict__ w, const float2* __restrict__ k, const float2* __restrict__ dk,
    float* __restrict__ out, int nvoxels, int ncoils, int nreadouts, int nsamples, float dt, int cartesian)
{
    __shared__ double red[6][MS_ADJ_MAX_BLOCK];
    const int tid = threadIdx.x;
    const long long nrs = (long long)nreadouts * nsamples;
    for (int v = blockIdx.x; v < nvoxels; v += gridDim.x) {
        const double vx = x[v], vy = y[v], wb = MS_TWO_PI_D * (double)b0[v];
        const float it2 = 1.f / t2[v];
        // Sums of conj(dm/dT1) y, conj(dm/dT2) y + t/T2^2 conj(m) y, conj(m) y over (c, r, s),
        // y = conj(E) sum_c conj(C[c, v]) w[c, r, s].
        double q1r = 0.0, q1i = 0.0, q2r = 0.0, q2i = 0.0, qmr = 0.0, qmi = 0.0;
        for (long long it = tid; it < nrs; it += blockDim.x) {
            const int r = (int)(it / nsamples), s = (int)(it % nsamples);
            double kx, ky;
            ms_kpos(k, dk, cartesian, r, s, nsamples, kx, ky);
            const double td = ((double)s - 0.5 * (double)nsamples) * (double)dt;
            const float t = (float)td;
            const float2 e = ms_readout(kx, ky, vx, vy, wb, td, t, it2);
            float2 yc = make_float2(0.f, 0.f);
            for (int c = 0; c < ncoils; ++c) {
                const float2 cc = coils[(long long)c * nvoxels + v], wv = w[c * nrs + it];
                yc.x = fmaf(cc.x, wv.x, fmaf(cc.y, wv.y, yc.x));
                yc.y = fmaf(cc.x, wv.y, fmaf(-cc.y, wv.x, yc.y));
            }
            const float2 yv = ms_cmulc(e, yc);
            const long long iv = (long long)v * nreadouts + r;
            const float2 qm = ms_cmulc(m[iv], yv), q1 = ms_cmulc(dm_t1[iv], yv), q2 = ms_cmulc(dm_t2[iv], yv);
            const float tt = t * it2 * it2;
            q1r += q1.x; q1i += q1.y;
            q2r += fmaf(tt, qm.x, q2.x); q2i += fmaf(tt, qm.y, q2.y);
            qmr += qm.x; qmi += qm.y;
        }
        red[0][tid] = q1r; red[1][tid] = q1i; red[2][tid] = q2r;
        red[3][tid] = q2i; red[4][tid] = qmr; red[5][tid] = qmi;
        __syncthreads();
        // Fold to 32 entries, then a tree (every thread reaches every barrier).
        if (tid < 32)
            for (int j = tid + 32; j < (int)blockDim.x; j += 32)
                for (int q = 0; q < 6; ++q) red[q][tid] += red[q][j];
        __syncthreads();
        for (int off = 16; off > 0; off >>= 1) {
            if (tid < off)
                for (int q = 0; q < 6; ++q) red[q][tid] += red[q][tid + off];
            __syncthreads();
        }
        if (tid == 0) {
            const double pr = rho[v].x, pi = rho[v].y;
            // Re(conj(rho) Q) = pr Qr + pi Qi; Re rho: Re(conj(m) y); Im rho: Re(conj(i m) y) = Im(conj(m) y).
            out[4LL * v + 0] = (float)(pr * red[0][0] + pi * red[1][0]);
            out[4LL * v + 1] = (float)(pr * red[2][0] + pi * red[3][0]);
            out[4LL * v + 2] = (float)red[4][0];
            out[4LL * v + 3] = (float)red[5][0];
        }
        __syncthreads();  // red is read before the next voxel writes it
    }
}

// ---- FISP echo magnetization and its exact derivatives d/dT1, d/dT2 ----------------------

// A dual number with two tangents: value, d/dT1, d/dT2.
struct ms_dual { float v, a, b; };
// A complex dual number: complex value, complex d/dT1, complex d/dT2.
struct ms_cdual { float2 v, a, b; };

__device__ __forceinline__ ms_cdual ms_czero() {
    ms_cdual r; r.v = r.a = r.b = make_float2(0.f, 0.f); return r;
}
// exp(-dt / T) as a dual number; `which` 0: T is T1 (tangent a), 1: T is T2 (tangent b).
// T = +Inf gives 1 and a zero derivative.
__device__ __forceinline__ ms_dual ms_relax(float dt, float T, int which) {
    const float e = expf(-dt / T);
    const float d = e * (dt / T) / T;
    ms_dual r; r.v = e; r.a = which == 0 ? d : 0.f; r.b = which == 1 ? d : 0.f; return r;
}
// x * y, both complex dual.
__device__ __forceinline__ ms_cdual ms_dmul(ms_cdual x, ms_cdual y) {
    ms_cdual r;
    r.v = ms_cmul(x.v, y.v);
    r.a = ms_cadd(ms_cmul(x.a, y.v), ms_cmul(x.v, y.a));
    r.b = ms_cadd(ms_cmul(x.b, y.v), ms_cmul(x.v, y.b));
    return r;
}
__device__ __forceinline__ ms_cdual ms_dconj(ms_cdual x) {
    x.v.y = -x.v.y; x.a.y = -x.a.y; x.b.y = -x.b.y; return x;
}
// x * s, s a real dual.
__device__ __forceinline__ ms_cdual ms_dscale(ms_cdual x, ms_dual s) {
    ms_cdual r;
    r.v = ms_cscale(x.v, s.v);
    r.a = ms_cadd(ms_cscale(x.a, s.v), ms_cscale(x.v, s.a));
    r.b = ms_cadd(ms_cscale(x.b, s.v), ms_cscale(x.v, s.b));
    return r;
}
// p x + q y + u z with constant complex p, q, u (the RF rotation is constant in T1 and T2).
__device__ __forceinline__ float2 ms_lin(float2 p, float2 x, float2 q, float2 y, float2 u, float2 z) {
    return ms_cadd(ms_cadd(ms_cmul(p, x), ms_cmul(q, y)), ms_cmul(u, z));
}
__device__ __forceinline__ ms_cdual ms_dlin(float2 p, ms_cdual x, float2 q, ms_cdual y, float2 u, ms_cdual z) {
    ms_cdual r;
    r.v = ms_lin(p, x.v, q, y.v, u, z.v);
    r.a = ms_lin(p, x.a, q, y.a, u, z.a);
    r.b = ms_lin(p, x.b, q, y.b, u, z.b);
    return r;
}
// Relaxation of the states over an interval: F+ by rot, conj(F-) by conj(rot), Z by e1, and
// regrowth 1 - e1 of Z(0).
__device__ __forceinline__ void ms_relax_states(ms_cdual* F, ms_cdual* G, ms_cdual* Z, ms_cdual rot, ms_dual e1) {
    const ms_cdual rotc = ms_dconj(rot);
#pragma unroll
    for (int j = 0; j < NS; ++j) {
        F[j] = ms_dmul(F[j], rot);
        G[j] = ms_dmul(G[j], rotc);
        Z[j] = ms_dscale(Z[j], e1);
    }
    Z[0].v.x += 1.f - e1.v;
    Z[0].a.x -= e1.a;
    Z[0].b.x -= e1.b;
}

// atoms: natoms x (T1, T2, B1, B0); table: nprof x ntr of (flip angle x profile scale, cos
// phase, sin phase, 0), as kmm_fisp takes them; tr, te, ti as kmm_fisp. Outputs m, dm_t1, dm_t2:
// ntr x natoms complex each (TR fastest), summed over the profile positions. NS EPG states
// (compile-time). One thread per atom, states in local memory (NS x 18 floats).
// Launch: block (B, 1, 1), any B (128 suggested); grid (ceil(natoms / B), 1, 1); no shared memory.
extern "C" __global__ void __launch_bounds__(256) kmm_mrstat_fisp_derivatives(
    const float4* __restrict__ atoms, float2* __restrict__ m, float2* __restrict__ dm_t1, float2* __restrict__ dm_t2,
    const float4* __restrict__ table, int natoms, int ntr, int nprof, float tr, float te, float ti)
{
    const long long atom = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (atom >= natoms) return;
    const float4 p = atoms[atom];
    const ms_dual e1te = ms_relax(te, p.x, 0), e1r = ms_relax(tr - te, p.x, 0), e1ti = ms_relax(ti, p.x, 0);
    const ms_dual e2te = ms_relax(te, p.y, 1), e2r = ms_relax(tr - te, p.y, 1);
    float sn, cs;
    ms_cdual rot_te = ms_czero(), rot_r = ms_czero();
    sincosf(MS_TWO_PI_F * p.w * te, &sn, &cs);
    rot_te.v = make_float2(e2te.v * cs, e2te.v * sn);
    rot_te.b = make_float2(e2te.b * cs, e2te.b * sn);
    sincosf(MS_TWO_PI_F * p.w * (tr - te), &sn, &cs);
    rot_r.v = make_float2(e2r.v * cs, e2r.v * sn);
    rot_r.b = make_float2(e2r.b * cs, e2r.b * sn);
    float2* om = m + atom * (long long)ntr;
    float2* o1 = dm_t1 + atom * (long long)ntr;
    float2* o2 = dm_t2 + atom * (long long)ntr;

    ms_cdual F[NS], G[NS], Z[NS];  // F+(k), conj(F-(k)), Z(k)
    for (int pr = 0; pr < nprof; ++pr) {
#pragma unroll
        for (int j = 0; j < NS; ++j) F[j] = G[j] = Z[j] = ms_czero();
        // Adiabatic inversion of Z(0) = 1, relaxation over TI (F, G are zero).
        Z[0].v.x = -e1ti.v + (1.f - e1ti.v);
        Z[0].a.x = -2.f * e1ti.a;
        const float4* tb = table + (long long)pr * ntr;
        for (int n = 0; n < ntr; ++n) {
            const float4 rf = tb[n];
            float sx, cx;
            sincosf(0.5f * rf.x * p.z, &sx, &cx);
            const float c2 = cx * cx, s2 = sx * sx, sa = 2.f * sx * cx, ca = c2 - s2, h = 0.5f * sa;
            const float2 e = make_float2(rf.y, rf.z), e2 = ms_cmul(e, e);
            // F+' = c2 F+ + s2 e^{2i phi} conj(F-) - i sin(a) e^{i phi} Z
            // conj(F-)' = s2 e^{-2i phi} F+ + c2 conj(F-) + i sin(a) e^{-i phi} Z
            // Z' = -i/2 sin(a) e^{-i phi} F+ + i/2 sin(a) e^{i phi} conj(F-) + cos(a) Z
            const float2 k_ff = make_float2(c2, 0.f), k_fg = ms_cscale(e2, s2), k_fz = make_float2(sa * e.y, -sa * e.x);
            const float2 k_gf = make_float2(s2 * e2.x, -s2 * e2.y), k_gz = make_float2(sa * e.y, sa * e.x);
            const float2 k_zf = make_float2(-h * e.y, -h * e.x), k_zg = make_float2(-h * e.y, h * e.x), k_zz = make_float2(ca, 0.f);
#pragma unroll
            for (int j = 0; j < NS; ++j) {
                const ms_cdual f = F[j], g = G[j], z = Z[j];
                F[j] = ms_dlin(k_ff, f, k_fg, g, k_fz, z);
                G[j] = ms_dlin(k_gf, f, k_ff, g, k_gz, z);
                Z[j] = ms_dlin(k_zf, f, k_zg, g, k_zz, z);
            }
            ms_relax_states(F, G, Z, rot_te, e1te);
            if (pr == 0) {
                om[n] = F[0].v; o1[n] = F[0].a; o2[n] = F[0].b;
            } else {
                om[n] = ms_cadd(om[n], F[0].v); o1[n] = ms_cadd(o1[n], F[0].a); o2[n] = ms_cadd(o2[n], F[0].b);
            }
            ms_relax_states(F, G, Z, rot_r, e1r);
            // Dephasing: conj(F-) down one state, F+ up one, F+(0) = conj(conj(F-)(0)).
#pragma unroll
            for (int j = 0; j < NS - 1; ++j) G[j] = G[j + 1];
            G[NS - 1] = ms_czero();
#pragma unroll
            for (int j = NS - 1; j > 0; --j) F[j] = F[j - 1];
            F[0] = ms_dconj(G[0]);
        }
    }
}
