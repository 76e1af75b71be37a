// MR-STAT on a Cartesian trajectory with one step dk, voxels grouped in columns: voxels of equal
// projection p = dk . x (the columns of a grid along the readout) share the readout's phase
// exp(-i s p). The decay and off-resonance of a voxel during the readout, exp(t_s z_v) with
// z_v = -1/T2_v + i 2 pi B0_v, is expanded on each piece of the readout (samples s0 .. s0 + n,
// centre time c, half width h) in COL_TERMS powers of tau_s = (t_s - c) / h, |tau_s| <= 1:
//   exp(t_s z_v) = sum_l alpha_l(v) tau_s^l,  alpha_l(v) = exp(c z_v) (h z_v)^l / l!
// (the host picks the pieces and terms, at most 12, that keep the rest under 1e-7 relative for
// the fewest pieces x terms). With A_c[r, v] of mrstat_cartesian.cu the signal on a piece is then
//   S_c[s, r] = sum_l tau_s^l sum_g E[s, g] B_l[r, g],
//   E[s, g]   = exp(-i s p_g),     B_l[r, g] = sum_{v in g} alpha_l(v) A_c[r, v]
// over segments g (a column, or a part of one of at most MAX_SEGMENT voxels): B by
// `kmm_col_b_signal` (`kmm_col_b_jv`), one product of the piece's rows of E by B^T (the inner
// dimension the segments, not the voxels), and `kmm_col_sum` sums the terms. J v takes A2 too
// (after the A terms; t_s applied in the sum). The adjoint: G = W'^H E with
// W' = [tau^0 W, .., tau^COL_TERMS W] per piece, then per voxel q = sum_l alpha_l G_l and
// q2 = sum_l alpha_l (c G_l + h G_{l+1}) (t_s = c + h tau_s), summed over the pieces, stand in
// for the dense path's W^H Z and W^H diag(t) Z in the same reduction.
// Needs the helpers of mrstat_cartesian.cu (compiled with it). COL_TERMS, COL_PIECES (the
// readout's pieces) and MAX_SEGMENT come from the compile options.

// tau of sample s on a piece of centre c and half width h (s).
__device__ __forceinline__ float piece_tau(int s, int nsamples, float dt, double c, double h)
{
    return (float)((((double)s - 0.5 * nsamples) * (double)dt - c) / h);
}

// z_v = -1/T2 + i 2 pi B0 (1/s).
__device__ __forceinline__ double2 voxel_rate(float t2, float b0)
{
    return make_double2(isinf(t2) ? 0.0 : -1.0 / (double)t2, 6.283185307179586476925286766559 * (double)b0);
}

// exp(c z) in float (the phase reduced in double first, as every phase here).
__device__ __forceinline__ float2 centre_factor(double2 z, double c)
{
    const float mag = expf((float)(c * z.x));
    const float2 e = cis_reduced(c * z.y);
    return make_float2(mag * e.x, mag * e.y);
}

// E (ns x nseg, sample fastest) from the segments' projections. One block per segment.
extern "C" __global__ void kmm_col_e(const double* __restrict__ proj, float2* __restrict__ e, int nsamples)
{
    const int g = blockIdx.x;
    for (int s = threadIdx.x; s < nsamples; s += blockDim.x) e[(long long)g * nsamples + s] = cis_reduced(-(double)s * proj[g]);
}

// B for one coil on the piece of centre c and half width h: term l of segment g at
// b[g * ld + l * stride + r] (and, for J v, A2's terms `COL_TERMS * stride` further). Blocks: x over segments, y over readouts; a thread per readout
// runs the segment's voxels in turn, their per-voxel factors staged in shared memory first so
// that the loop loads only the magnetization. A = C rho m e^{-i k0.x} for the signal (mode 0);
// for J v (mode 1), A = e^{-i k0.x} (c1 dm1 + c2 dm2 + c3 m) and A2 = e^{-i k0.x} c4 m with
// c1 = C rho v1, c2 = C rho v2, c3 = C (v3 + i v4), c4 = C rho v2 / T2^2 (kmm_cart_a's terms),
// each times exp(c z_v).
template <int MODE>
__device__ __forceinline__ void column_b(const float2* __restrict__ coil, const float2* __restrict__ rho,
    const float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ t2, const float* __restrict__ b0,
    const float2* __restrict__ m, const float2* __restrict__ dm1, const float2* __restrict__ dm2,
    const float* __restrict__ vec, const float2* __restrict__ k0, const int* __restrict__ voxel, const int* __restrict__ start,
    float2* __restrict__ b, long long ld, long long stride, int nreadouts, double c, double h)
{
    __shared__ int sv[MAX_SEGMENT];
    __shared__ float2 spos[MAX_SEGMENT], sxi[MAX_SEGMENT], sc[4][MAX_SEGMENT];
    const int g = blockIdx.x, r = blockIdx.y * blockDim.x + threadIdx.x, first = start[g], len = start[g + 1] - first;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        const int v = voxel[first + j];
        sv[j] = v;
        spos[j] = make_float2(x[v], y[v]);
        const double2 z = voxel_rate(t2[v], b0[v]);
        sxi[j] = make_float2((float)(h * z.x), (float)(h * z.y));
        const float2 ce = cmulf(coil[v], centre_factor(z, c)), cr = cmulf(ce, rho[v]);
        if (MODE == 0) {
            sc[0][j] = cr;
        } else {
            const float* vv = vec + 4LL * v;
            const float w = isinf(t2[v]) ? 0.f : vv[1] / (t2[v] * t2[v]);
            sc[0][j] = make_float2(vv[0] * cr.x, vv[0] * cr.y);
            sc[1][j] = make_float2(vv[1] * cr.x, vv[1] * cr.y);
            sc[2][j] = cmulf(ce, make_float2(vv[2], vv[3]));
            sc[3][j] = make_float2(w * cr.x, w * cr.y);
        }
    }
    __syncthreads();
    if (r >= nreadouts) return;
    float2 acc[COL_TERMS], acc2[COL_TERMS];
#pragma unroll
    for (int l = 0; l < COL_TERMS; ++l) acc[l] = make_float2(0.f, 0.f);
#pragma unroll
    for (int l = 0; l < COL_TERMS; ++l) acc2[l] = make_float2(0.f, 0.f);
    const float2 k = k0[r];
#pragma unroll 4
    for (int j = 0; j < len; ++j) {
        const long long mi = (long long)sv[j] * nreadouts + r;
        const float2 e = cis_reduced(-((double)k.x * spos[j].x + (double)k.y * spos[j].y));
        float2 a, a2 = make_float2(0.f, 0.f);
        if (MODE == 0) {
            a = cmulf(e, cmulf(sc[0][j], m[mi]));
        } else {
            const float2 mm = m[mi], u1 = cmulf(sc[0][j], dm1[mi]), u2 = cmulf(sc[1][j], dm2[mi]), u3 = cmulf(sc[2][j], mm);
            a = cmulf(e, make_float2(u1.x + u2.x + u3.x, u1.y + u2.y + u3.y));
            a2 = cmulf(e, cmulf(sc[3][j], mm));
        }
        const float2 xi = sxi[j];
#pragma unroll
        for (int l = 0; l < COL_TERMS; ++l) {
            acc[l].x += a.x; acc[l].y += a.y;
            const float f = 1.f / (float)(l + 1);
            a = cmulf(a, xi); a.x *= f; a.y *= f;
            if (MODE) {
                acc2[l].x += a2.x; acc2[l].y += a2.y;
                a2 = cmulf(a2, xi); a2.x *= f; a2.y *= f;
            }
        }
    }
    float2* o = b + (long long)g * ld + r;
#pragma unroll
    for (int l = 0; l < COL_TERMS; ++l) {
        o[l * stride] = acc[l];
        if (MODE) o[(COL_TERMS + l) * stride] = acc2[l];
    }
}

#define COLUMN_B_ARGS const float2* __restrict__ coil, const float2* __restrict__ rho, \
    const float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ t2, const float* __restrict__ b0, \
    const float2* __restrict__ m, const float2* __restrict__ dm1, const float2* __restrict__ dm2, \
    const float* __restrict__ vec, const float2* __restrict__ k0, const int* __restrict__ voxel, const int* __restrict__ start, \
    float2* __restrict__ b, long long ld, long long stride, int nreadouts, double c, double h
extern "C" __global__ void __launch_bounds__(256) kmm_col_b_signal(COLUMN_B_ARGS)
{
    column_b<0>(coil, rho, x, y, t2, b0, m, dm1, dm2, vec, k0, voxel, start, b, ld, stride, nreadouts, c, h);
}
extern "C" __global__ void __launch_bounds__(256) kmm_col_b_jv(COLUMN_B_ARGS)
{
    column_b<1>(coil, rho, x, y, t2, b0, m, dm1, dm2, vec, k0, voxel, start, b, ld, stride, nreadouts, c, h);
}

// The signal or J v of a group of coils on a piece (samples s0 .. s0 + n) from the product P
// (n x halves * COL_TERMS * ncols, the terms of A, then of A2):
// out[s + ns j] = sum_l tau_s^l P[s - s0, l ncols + j] (+ t_s sum_l tau_s^l P[s - s0, (COL_TERMS + l) ncols + j]
// for J v).
extern "C" __global__ void kmm_col_sum(const float2* __restrict__ p, float2* __restrict__ out,
    int nsamples, int s0, int n, long long ncols, int halves, float dt, double c, double h)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * ncols) return;
    const int s = s0 + (int)(i % n);
    const long long j = i / n;
    const float tau = piece_tau(s, nsamples, dt, c, h);
    const long long term = n * ncols;
    float2 sum[2];
    for (int half = 0; half < halves; ++half) {
        float2 acc = make_float2(0.f, 0.f);
#pragma unroll
        for (int l = COL_TERMS - 1; l >= 0; --l) {
            const float2 v = p[i + (half * COL_TERMS + l) * term];
            acc = make_float2(acc.x * tau + v.x, acc.y * tau + v.y);
        }
        sum[half] = acc;
    }
    if (halves == 2) {
        const float t = sample_time(s, nsamples, dt);
        sum[0] = make_float2(sum[0].x + t * sum[1].x, sum[0].y + t * sum[1].y);
    }
    out[s + nsamples * j] = sum[0];
}

// W' = [tau^0 W, tau^1 W, .., tau^COL_TERMS W] of a piece (samples s0 .. s0 + n) for the adjoint's
// product: w is ns x ncols (sample fastest), wp n x (COL_TERMS + 1) ncols.
extern "C" __global__ void kmm_col_tw(const float2* __restrict__ w, float2* __restrict__ wp,
    int nsamples, int s0, int n, long long ncols, float dt, double c, double h)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * ncols) return;
    const int s = s0 + (int)(i % n);
    const float tau = piece_tau(s, nsamples, dt, c, h);
    float2 u = w[s + nsamples * (i / n)];
#pragma unroll
    for (int l = 0; l <= COL_TERMS; ++l) {
        wp[i + l * n * ncols] = u;
        u = make_float2(tau * u.x, tau * u.y);
    }
}

// The adjoint's reduction for one coil: G = W'^H E of piece k (centre and half width at
// piece[k]) with term l of segment g at q[k * pstride + g * ld + l * stride + r].
// g[4 v + j] (+)= Re sum_r a_j(r) q_v[r] as in kmm_cart_adjoint, with q_v = sum_k sum_l
// alpha_kl(v) G_kl and q2_v = sum_k sum_l alpha_kl(v) (c_k G_kl + h_k G_k,l+1). One warp per
// voxel; blocks: x over segments, y over the voxels of a segment.
extern "C" __global__ void kmm_col_adjoint(const float2* __restrict__ q, long long ld, long long stride,
    long long pstride, const double2* __restrict__ piece,
    const float2* __restrict__ coil, const float2* __restrict__ rho,
    const float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ t2, const float* __restrict__ b0,
    const float2* __restrict__ m, const float2* __restrict__ dm1, const float2* __restrict__ dm2,
    const float2* __restrict__ k0, const int* __restrict__ voxel, const int* __restrict__ start,
    float* __restrict__ out, int nreadouts, int accumulate)
{
    const int g = blockIdx.x, lane = threadIdx.x % 32;
    const int i = start[g] + (int)((blockIdx.y * blockDim.x + threadIdx.x) / 32);
    if (i >= start[g + 1]) return;
    const int v = voxel[i];
    const float2 rh = rho[v], cv = coil[v];
    const double2 z = voxel_rate(t2[v], b0[v]);
    const double w2 = isinf(t2[v]) ? 0.0 : (double)(1.f / (t2[v] * t2[v]));
    // A piece's exp(c z) is the voxel's, not the readout's: made once where the pieces are few
    // enough to hold in registers, per readout otherwise.
#if COL_PIECES <= 2
    float2 centre[COL_PIECES];
#pragma unroll
    for (int k = 0; k < COL_PIECES; ++k) centre[k] = centre_factor(z, piece[k].x);
#define CENTRE(k) centre[k]
#else
#define CENTRE(k) centre_factor(z, piece[k].x)
#endif
    double sums[4] = {0, 0, 0, 0};
    for (int r = lane; r < nreadouts; r += 32) {
        float2 qv = make_float2(0.f, 0.f), q2 = qv;
        // Unrolled over a few pieces only: more would take more registers than there are.
#if COL_PIECES <= 2
#pragma unroll
#else
#pragma unroll 1
#endif
        for (int k = 0; k < COL_PIECES; ++k) {
            const double2 ch = piece[k];
            const float2* qk = q + k * pstride + (long long)g * ld + r;
            const float2 xi = make_float2((float)(ch.y * z.x), (float)(ch.y * z.y));
            const float c = (float)ch.x, h = (float)ch.y;
            float2 alpha = CENTRE(k), next = qk[0];
#pragma unroll
            for (int l = 0; l < COL_TERMS; ++l) {
                const float2 cur = next;
                next = qk[(l + 1) * stride];
                const float2 a = cmulf(alpha, cur), a2 = cmulf(alpha, make_float2(c * cur.x + h * next.x, c * cur.y + h * next.y));
                qv.x += a.x; qv.y += a.y;
                q2.x += a2.x; q2.y += a2.y;
                const float f = 1.f / (float)(l + 1);
                alpha = cmulf(alpha, xi); alpha.x *= f; alpha.y *= f;
            }
        }
        const long long mi = (long long)v * nreadouts + r;
        const float2 ce = cmulf(cv, cis_reduced(-((double)k0[r].x * x[v] + (double)k0[r].y * y[v])));
        adjoint_terms(sums, ce, qv, q2, w2, rh, m[mi], dm1[mi], dm2[mi]);
    }
    adjoint_store(sums, out + 4LL * v, lane, accumulate);
#undef CENTRE
}
