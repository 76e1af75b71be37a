// MR-STAT on a Cartesian trajectory whose readouts all step by the same dk, as matrix products
// (cuBLAS CGEMM) around these kernels. With t_s = (s - ns/2) dt and k[r,s] = k0[r] + s dk, the
// signal factorises per voxel v:
//   S_c[s, r] = sum_v Z[s, v] A_c[r, v],
//   Z[s, v]   = exp(-t_s / T2_v) exp(i (2 pi B0_v t_s - s dk . x_v)),
//   A_c[r, v] = C[c, v] rho_v m_v(r) exp(-i k0[r] . x_v)
// (Z: ns x nv, sample fastest; A: readouts of a group of coils x nv, readout fastest). J v adds
// t_s (Z A2_c^T)[s, r] for the readout decay's T2 derivative: A2 is stacked after A in one
// product and `kmm_cart_sum` applies t_s. The adjoint takes conj(P_c) = W'^H Z with
// W' = [W_c, diag(t) W_c] in one product and reduces per voxel here.

// t_s = (s - ns/2) dt, the time of sample s from the echo.
__device__ __forceinline__ float sample_time(int s, int nsamples, float dt) { return (float)(((double)s - 0.5 * nsamples) * (double)dt); }

__device__ __forceinline__ float2 cmulf(float2 a, float2 b) { return make_float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x); }

// cis(phase) with the phase reduced in double first (phases reach hundreds of radians).
__device__ __forceinline__ float2 cis_reduced(double phase)
{
    const double two_pi = 6.283185307179586476925286766559, inv_two_pi = 0.15915494309189533576888376337251;
    phase -= two_pi * rint(phase * inv_two_pi);
    float s, c;
    sincosf((float)phase, &s, &c);
    return make_float2(c, s);
}

// Z (ns x nv, sample fastest). One block per voxel, its threads over the samples.
extern "C" __global__ void kmm_cart_z(const float* __restrict__ x, const float* __restrict__ y,
    const float* __restrict__ t2, const float* __restrict__ b0, float2* __restrict__ z,
    int nvoxels, int nsamples, float dt, float dkx, float dky)
{
    const int v = blockIdx.x;
    const double xk = (double)dkx * x[v] + (double)dky * y[v], w = 6.283185307179586476925286766559 * (double)b0[v];
    const float t2v = t2[v];
    const double inv_t2 = 1.0 / (double)t2v;
    float2* zv = z + (long long)v * nsamples;
    for (int s = threadIdx.x; s < nsamples; s += blockDim.x) {
        const double t = ((double)s - 0.5 * nsamples) * (double)dt;
        const float decay = isinf(t2v) ? 1.f : expf((float)(-t * inv_t2));
        const float2 e = cis_reduced(w * t - (double)s * xk);
        zv[s] = make_float2(decay * e.x, decay * e.y);
    }
}

// J v's A and A2 at one (readout, voxel), from ce = C e^{-i k0.x}, the voxel's v = vv[0..4]:
// A = ce (rho (v1 dm1 + v2 dm2) + (v3 + i v4) m), A2 = ce rho m v2 / T2^2.
__device__ __forceinline__ void jv_entries(float2 ce, float2 rh, const float* vv, float t2v,
    float2 mi, float2 d1, float2 d2, float2* a, float2* a2)
{
    const float2 t = cmulf(rh, make_float2(vv[0] * d1.x + vv[1] * d2.x, vv[0] * d1.y + vv[1] * d2.y));
    const float2 u = cmulf(make_float2(vv[2], vv[3]), mi);
    *a = cmulf(ce, make_float2(t.x + u.x, t.y + u.y));
    const float w = isinf(t2v) ? 0.f : vv[1] / (t2v * t2v);
    const float2 rm = cmulf(rh, mi);
    *a2 = cmulf(ce, make_float2(w * rm.x, w * rm.y));
}

// A for one coil: entry (r, v) at a[v * ld + r]. mode 0: the signal, A = C rho m e^{-i k0.x}.
// mode 1: J v's A and, `second` entries further, A2 (jv_entries).
extern "C" __global__ void kmm_cart_a(const float2* __restrict__ coil, const float2* __restrict__ rho,
    const float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ t2,
    const float2* __restrict__ m, const float2* __restrict__ dm1, const float2* __restrict__ dm2,
    const float* __restrict__ vec, const float2* __restrict__ k0,
    float2* __restrict__ a, long long ld, long long second, int nvoxels, int nreadouts, int mode)
{
    // One block per voxel, its threads over the readouts.
    const int v = blockIdx.x;
    const float2 cv = coil[v], rh = rho[v];
    const double xv = x[v], yv = y[v];
    for (int r = threadIdx.x; r < nreadouts; r += blockDim.x) {
        const long long i = (long long)v * nreadouts + r, o = (long long)v * ld + r;
        const float2 ce = cmulf(cv, cis_reduced(-((double)k0[r].x * xv + (double)k0[r].y * yv)));
        if (mode == 0) {
            a[o] = cmulf(ce, cmulf(rh, m[i]));
            continue;
        }
        jv_entries(ce, rh, vec + 4LL * v, t2[v], m[i], dm1[i], dm2[i], &a[o], &a[o + second]);
    }
}

// J v of a group of coils from its product (ns x 2 ncols: the A columns, then the A2 columns):
// out[s + ns * j] (j: readout and coil) = both[s + ns * j] + t_s both[s + ns * (j + ncols)].
extern "C" __global__ void kmm_cart_sum(const float2* __restrict__ both, float2* __restrict__ out,
    int nsamples, long long ncols, float dt)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nsamples * ncols) return;
    const float t = sample_time((int)(i % nsamples), nsamples, dt);
    const float2 a = both[i], b = both[i + nsamples * ncols];
    out[i] = make_float2(a.x + t * b.x, a.y + t * b.y);
}

// W' = [W, diag(t) W] for the adjoint's product: w is ns x ncols (sample fastest), wp ns x 2 ncols.
extern "C" __global__ void kmm_cart_tw(const float2* __restrict__ w, float2* __restrict__ wp,
    int nsamples, long long ncols, float dt)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nsamples * ncols) return;
    const float t = sample_time((int)(i % nsamples), nsamples, dt);
    const float2 u = w[i];
    wp[i] = u;
    wp[i + nsamples * ncols] = make_float2(t * u.x, t * u.y);
}

// One readout's part of the adjoint's sums of a voxel: sums[j] += Re(a_j q) for
// a_j = ce (rho dm1, rho dm2, m, i m), and sums[1] += w2 Re(ce rho m q2) (T2's readout decay).
__device__ __forceinline__ void adjoint_terms(double* sums, float2 ce, float2 q, float2 q2, double w2,
    float2 rh, float2 mm, float2 d1, float2 d2)
{
    const float2 cq = cmulf(ce, q);
    const float2 b1 = cmulf(rh, d1), b2 = cmulf(rh, d2);
    sums[0] += (double)(b1.x * cq.x - b1.y * cq.y);
    sums[1] += (double)(b2.x * cq.x - b2.y * cq.y);
    sums[2] += (double)(mm.x * cq.x - mm.y * cq.y);
    sums[3] += (double)(-mm.y * cq.x - mm.x * cq.y);   // Re(i m cq)
    const float2 cq2 = cmulf(ce, q2), rm = cmulf(rh, mm);
    sums[1] += w2 * (double)(rm.x * cq2.x - rm.y * cq2.y);
}

// The warp's sums into the voxel's four gradient entries (lane 0 writes; `accumulate` adds to
// an earlier coil's).
__device__ __forceinline__ void adjoint_store(double* sums, float* o, int lane, int accumulate)
{
#pragma unroll
    for (int j = 0; j < 4; ++j)
        for (int off = 16; off > 0; off >>= 1) sums[j] += __shfl_down_sync(0xffffffffu, sums[j], off);
    if (lane != 0) return;
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = accumulate ? o[j] + (float)sums[j] : (float)sums[j];
}

// The adjoint's reduction for one coil: q = conj(P) = W^H Z at q[v * ld + r] and q2 = W^H diag(t) Z
// `second` entries further. g[4 v + j] (+)= Re sum_r a_j(r) q[r, v] with a_j = C e^{-i k0.x} (rho dm1, rho dm2,
// m, i m) (and rho m / T2^2 with q2 for T2). One warp per voxel.
extern "C" __global__ void kmm_cart_adjoint(const float2* __restrict__ q, long long ld, long long second,
    const float2* __restrict__ coil, const float2* __restrict__ rho,
    const float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ t2,
    const float2* __restrict__ m, const float2* __restrict__ dm1, const float2* __restrict__ dm2,
    const float2* __restrict__ k0, float* __restrict__ g, int nvoxels, int nreadouts, int accumulate)
{
    const long long v = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (v >= nvoxels) return;
    const float2 rh = rho[v], cv = coil[v];
    const double inv_t22 = isinf(t2[v]) ? 0.0 : (double)(1.f / (t2[v] * t2[v]));
    double sums[4] = {0, 0, 0, 0};
    for (int r = lane; r < nreadouts; r += 32) {
        const long long i = v * (long long)nreadouts + r, o = v * ld + r;
        const float2 ce = cmulf(cv, cis_reduced(-((double)k0[r].x * x[v] + (double)k0[r].y * y[v])));
        adjoint_terms(sums, ce, q[o], q[o + second], inv_t22, rh, m[i], dm1[i], dm2[i]);
    }
    adjoint_store(sums, g + 4 * v, lane, accumulate);
}
