// MR-STAT on a Cartesian trajectory with one step dk, voxels grouped in columns: voxels of equal
// projection p = dk . x (the columns of a grid along the readout) share the readout's phase
// exp(-i s p). The decay and off-resonance of a voxel during the readout, exp(t_s z_v) with
// z_v = -1/T2_v + i 2 pi B0_v, is expanded in nterms powers of tau_s = t_s / h (h = ns dt / 2,
// |tau_s| <= 1):
//   exp(t_s z_v) = sum_l alpha_l(v) tau_s^l,  alpha_l(v) = (h z_v)^l / l!
// (the host picks nterms so that the rest stays under 1e-7 relative). With A_c[r, v] of
// mrstat_cartesian.cu the signal is then
//   S_c[s, r] = sum_l tau_s^l sum_g E[s, g] B_l[r, g],
//   E[s, g]   = exp(-i s p_g),     B_l[r, g] = sum_{v in g} alpha_l(v) A_c[r, v]
// over segments g (a column, or a part of one of at most a set number of voxels): B by
// `kmm_col_b`, one product E B^T (ns x nterms readouts, the product's inner dimension the
// segments, not the voxels), and `kmm_col_sum` sums the terms. J v takes A2 too (after the A
// terms; t_s applied in the sum). The adjoint: G = W'^H E with W' = [tau^0 W, .., tau^nterms W]
// by one product, then per voxel q = sum_l alpha_l G_l and q2 = h sum_l alpha_l G_{l+1} stand in
// for the dense path's W^H Z and W^H diag(t) Z in the same reduction.
// Needs the helpers of mrstat_cartesian.cu (compiled with it).

#define MAX_TERMS 12

// tau_s = t_s / h, in [-1, 1).
__device__ __forceinline__ float sample_tau(int s, int nsamples) { return (float)(((double)s - 0.5 * nsamples) / (0.5 * nsamples)); }

// h z_v: the exponent of a voxel's decay and off-resonance over half a readout.
__device__ __forceinline__ float2 half_rate(float t2, float b0, double h)
{
    return make_float2(isinf(t2) ? 0.f : (float)(-h / (double)t2), (float)(6.283185307179586476925286766559 * h * (double)b0));
}

// E (ns x nseg, sample fastest) from the segments' projections. One block per segment.
extern "C" __global__ void kmm_col_e(const double* __restrict__ proj, float2* __restrict__ e, int nsamples)
{
    const int g = blockIdx.x;
    for (int s = threadIdx.x; s < nsamples; s += blockDim.x) e[(long long)g * nsamples + s] = cis_reduced(-(double)s * proj[g]);
}

// B for one coil: term l of segment g at b[g * ld + l * stride + r] (and, for J v, A2's terms
// `nterms * stride` further). Blocks: x over segments, y over readouts (a thread per readout,
// the segment's voxels in turn). mode 0: A = C rho m e^{-i k0.x}; mode 1: J v's A and A2 (as
// kmm_cart_a).
extern "C" __global__ void kmm_col_b(const float2* __restrict__ coil, const float2* __restrict__ rho,
    const float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ t2, const float* __restrict__ b0,
    const float2* __restrict__ m, const float2* __restrict__ dm1, const float2* __restrict__ dm2,
    const float* __restrict__ vec, const float2* __restrict__ k0, const int* __restrict__ voxel, const int* __restrict__ start,
    float2* __restrict__ b, long long ld, long long stride, int nreadouts, int nterms, int mode, double h)
{
    const int g = blockIdx.x, r = blockIdx.y * blockDim.x + threadIdx.x;
    if (r >= nreadouts) return;
    float2 acc[MAX_TERMS], acc2[MAX_TERMS];
#pragma unroll
    for (int l = 0; l < MAX_TERMS; ++l) acc[l] = acc2[l] = make_float2(0.f, 0.f);
    const float2 k = k0[r];
    for (int i = start[g]; i < start[g + 1]; ++i) {
        const int v = voxel[i];
        const long long mi = (long long)v * nreadouts + r;
        const float2 ce = cmulf(coil[v], cis_reduced(-((double)k.x * x[v] + (double)k.y * y[v])));
        float2 a, a2 = make_float2(0.f, 0.f);
        if (mode == 0) a = cmulf(ce, cmulf(rho[v], m[mi]));
        else jv_entries(ce, rho[v], vec + 4LL * v, t2[v], m[mi], dm1[mi], dm2[mi], &a, &a2);
        const float2 xi = half_rate(t2[v], b0[v], h);
#pragma unroll
        for (int l = 0; l < MAX_TERMS; ++l) {
            if (l < nterms) {
                acc[l].x += a.x; acc[l].y += a.y;
                acc2[l].x += a2.x; acc2[l].y += a2.y;
                const float f = 1.f / (float)(l + 1);
                a = cmulf(a, xi); a.x *= f; a.y *= f;
                a2 = cmulf(a2, xi); a2.x *= f; a2.y *= f;
            }
        }
    }
    float2* o = b + (long long)g * ld + r;
#pragma unroll
    for (int l = 0; l < MAX_TERMS; ++l) {
        if (l < nterms) {
            o[l * stride] = acc[l];
            if (mode) o[(nterms + l) * stride] = acc2[l];
        }
    }
}

// The signal or J v of a group of coils from the product P (ns x halves * nterms * ncols, the
// terms of A, then of A2): out[s + ns j] = sum_l tau_s^l P[s, l ncols + j]
// (+ t_s sum_l tau_s^l P[s, (nterms + l) ncols + j] for J v).
extern "C" __global__ void kmm_col_sum(const float2* __restrict__ p, float2* __restrict__ out,
    int nsamples, long long ncols, int nterms, int halves, float dt)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nsamples * ncols) return;
    const int s = (int)(i % nsamples);
    const float tau = sample_tau(s, nsamples);
    const long long term = nsamples * ncols;
    float2 sum[2];
    for (int half = 0; half < halves; ++half) {
        float2 acc = make_float2(0.f, 0.f);
        for (int l = nterms - 1; l >= 0; --l) {
            const float2 c = p[i + (half * nterms + l) * term];
            acc = make_float2(acc.x * tau + c.x, acc.y * tau + c.y);
        }
        sum[half] = acc;
    }
    if (halves == 2) {
        const float t = sample_time(s, nsamples, dt);
        sum[0] = make_float2(sum[0].x + t * sum[1].x, sum[0].y + t * sum[1].y);
    }
    out[i] = sum[0];
}

// W' = [tau^0 W, tau^1 W, .., tau^nterms W] for the adjoint's product: w is ns x ncols (sample
// fastest), wp ns x (nterms + 1) ncols.
extern "C" __global__ void kmm_col_tw(const float2* __restrict__ w, float2* __restrict__ wp,
    int nsamples, long long ncols, int nterms)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nsamples * ncols) return;
    const float tau = sample_tau((int)(i % nsamples), nsamples);
    float2 u = w[i];
    for (int l = 0; l <= nterms; ++l) {
        wp[i + l * nsamples * ncols] = u;
        u = make_float2(tau * u.x, tau * u.y);
    }
}

// The adjoint's reduction for one coil: G = W'^H E with term l of segment g at
// q[g * ld + l * stride + r]. g[4 v + j] (+)= Re sum_r a_j(r) q_v[r] as in kmm_cart_adjoint,
// with q_v = sum_l alpha_l(v) G_l and q2_v = h sum_l alpha_l(v) G_{l+1}. One warp per voxel;
// blocks: x over segments, y over the voxels of a segment.
extern "C" __global__ void kmm_col_adjoint(const float2* __restrict__ q, long long ld, long long stride,
    const float2* __restrict__ coil, const float2* __restrict__ rho,
    const float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ t2, const float* __restrict__ b0,
    const float2* __restrict__ m, const float2* __restrict__ dm1, const float2* __restrict__ dm2,
    const float2* __restrict__ k0, const int* __restrict__ voxel, const int* __restrict__ start,
    float* __restrict__ out, int nreadouts, int nterms, double h, int accumulate)
{
    const int g = blockIdx.x, lane = threadIdx.x % 32;
    const int i = start[g] + (int)((blockIdx.y * blockDim.x + threadIdx.x) / 32);
    if (i >= start[g + 1]) return;
    const int v = voxel[i];
    const float2 rh = rho[v], cv = coil[v], xi = half_rate(t2[v], b0[v], h);
    const double w2 = isinf(t2[v]) ? 0.0 : h * (double)(1.f / (t2[v] * t2[v]));
    const float2* qg = q + (long long)g * ld;
    double sums[4] = {0, 0, 0, 0};
    for (int r = lane; r < nreadouts; r += 32) {
        // q_v and q2_v / h at readout r.
        float2 qv = make_float2(0.f, 0.f), q2 = qv, alpha = make_float2(1.f, 0.f);
        float2 next = qg[r];
        for (int l = 0; l < nterms; ++l) {
            const float2 cur = next;
            next = qg[(l + 1) * stride + r];
            const float2 a = cmulf(alpha, cur), a2 = cmulf(alpha, next);
            qv.x += a.x; qv.y += a.y;
            q2.x += a2.x; q2.y += a2.y;
            const float f = 1.f / (float)(l + 1);
            alpha = cmulf(alpha, xi); alpha.x *= f; alpha.y *= f;
        }
        const long long mi = (long long)v * nreadouts + r;
        const float2 ce = cmulf(cv, cis_reduced(-((double)k0[r].x * x[v] + (double)k0[r].y * y[v])));
        adjoint_terms(sums, ce, qv, q2, w2, rh, m[mi], dm1[mi], dm2[mi]);
    }
    adjoint_store(sums, out + 4LL * v, lane, accumulate);
}
