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

// A for one coil: entry (r, v) at a[v * ld + r]. mode 0: the signal, A = C rho m e^{-i k0.x}.
// mode 1: J v, A = C e^{-i k0.x} (rho (v1 dm1 + v2 dm2) + (v3 + i v4) m) and, `second` entries
// further, A2 = C e^{-i k0.x} rho m v2 / T2^2.
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
    const float* vv = vec + 4LL * v;
    const float v1 = mode ? vv[0] : 0.f, v2 = mode ? vv[1] : 0.f;
    const float2 v34 = mode ? make_float2(vv[2], vv[3]) : make_float2(0.f, 0.f);
    const float w = (mode && !isinf(t2[v])) ? v2 / (t2[v] * t2[v]) : 0.f;
    for (int r = threadIdx.x; r < nreadouts; r += blockDim.x) {
        const long long i = (long long)v * nreadouts + r, o = (long long)v * ld + r;
        const float2 ce = cmulf(cv, cis_reduced(-((double)k0[r].x * xv + (double)k0[r].y * yv)));
        const float2 mi = m[i];
        if (mode == 0) {
            a[o] = cmulf(ce, cmulf(rh, mi));
            continue;
        }
        const float2 d1 = dm1[i], d2 = dm2[i];
        const float2 t = cmulf(rh, make_float2(v1 * d1.x + v2 * d2.x, v1 * d1.y + v2 * d2.y));
        const float2 u = cmulf(v34, mi);
        a[o] = cmulf(ce, make_float2(t.x + u.x, t.y + u.y));
        const float2 rm = cmulf(rh, mi);
        a[o + second] = cmulf(ce, make_float2(w * rm.x, w * rm.y));
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
    const float inv_t22 = isinf(t2[v]) ? 0.f : 1.f / (t2[v] * t2[v]);
    double s1 = 0, s2 = 0, s3 = 0, s4 = 0;
    for (int r = lane; r < nreadouts; r += 32) {
        const long long i = v * (long long)nreadouts + r, o = v * ld + r;
        const float2 ce = cmulf(cv, cis_reduced(-((double)k0[r].x * x[v] + (double)k0[r].y * y[v])));
        const float2 qm = q[o];
        // Re(a q) for a = ce * b: Re(ce b q)
        const float2 cq = cmulf(ce, qm);
        const float2 b1 = cmulf(rh, dm1[i]), b2 = cmulf(rh, dm2[i]), mm = m[i];
        s1 += (double)(b1.x * cq.x - b1.y * cq.y);
        s2 += (double)(b2.x * cq.x - b2.y * cq.y);
        s3 += (double)(mm.x * cq.x - mm.y * cq.y);
        s4 += (double)(-mm.y * cq.x - mm.x * cq.y);   // Re(i m cq)
        const float2 cq2 = cmulf(ce, q[o + second]);
        const float2 rm = cmulf(rh, mm);
        s2 += (double)inv_t22 * (double)(rm.x * cq2.x - rm.y * cq2.y);
    }
    for (int off = 16; off > 0; off >>= 1) {
        s1 += __shfl_down_sync(0xffffffffu, s1, off);
        s2 += __shfl_down_sync(0xffffffffu, s2, off);
        s3 += __shfl_down_sync(0xffffffffu, s3, off);
        s4 += __shfl_down_sync(0xffffffffu, s4, off);
    }
    if (lane == 0) {
        float* o = g + 4 * v;
        if (accumulate) { o[0] += (float)s1; o[1] += (float)s2; o[2] += (float)s3; o[3] += (float)s4; }
        else { o[0] = (float)s1; o[1] = (float)s2; o[2] = (float)s3; o[3] = (float)s4; }
    }
}
