// The model of the MR-STAT operations on CUDA: voxel records (x, y, T2, B0, Re rho, Im rho) and
// coil sensitivities are checked on the device and the records unpacked into one array per
// field, the kernels' layout, so that no call copies the model to the host and back.
//
// found[0]: the first voxel whose record fails a check (x, y, B0 or rho not finite, T2 not > 0;
// +Inf is a valid T2); found[1]: the first coil entry that is not finite. Both start at
// ULLONG_MAX (none). For the column path (mrstat_columns.cu), which groups voxels by position
// on the host and keeps the grouping while the positions stay the same: found[2] and found[3],
// two independent 64-bit sums over the voxels of a mix of (index, x bits, y bits) (start 0);
// found[4], the largest |z| = |-1/T2 + i 2 pi B0| of the good records, and found[5], the
// largest 1/T2, as float bits (start 0).

// SplitMix64's finalizer.
__device__ __forceinline__ unsigned long long mix64(unsigned long long z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Adds the warp's sum of `h` to `*to` (one atomic per warp).
__device__ __forceinline__ void warp_add(unsigned long long* to, unsigned long long h)
{
    for (int off = 16; off > 0; off >>= 1) h += __shfl_down_sync(0xffffffffu, h, off);
    if (threadIdx.x % 32 == 0 && h) atomicAdd(to, h);
}

extern "C" __global__ void kmm_mrstat_unpack(const float* __restrict__ rec, const float2* __restrict__ coils,
    long long nvoxels, long long ncoil_entries, float* __restrict__ x, float* __restrict__ y,
    float* __restrict__ t2, float* __restrict__ b0, float2* __restrict__ rho, unsigned long long* __restrict__ found)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long h1 = 0, h2 = 0;
    float rate = 0.f, decay = 0.f;
    if (i < nvoxels) {
        const float* r = rec + 6 * i;
        x[i] = r[0];
        y[i] = r[1];
        t2[i] = r[2];
        b0[i] = r[3];
        rho[i] = make_float2(r[4], r[5]);
        const bool ok = isfinite(r[0]) && isfinite(r[1]) && r[2] > 0.f && isfinite(r[3]) && isfinite(r[4]) && isfinite(r[5]);
        if (!ok) atomicMin(&found[0], (unsigned long long)i);
        const unsigned long long key = ((unsigned long long)__float_as_uint(r[0]) << 32) | __float_as_uint(r[1]);
        h1 = mix64(key ^ mix64((unsigned long long)i));
        h2 = mix64(key + mix64((unsigned long long)i ^ 0x9E3779B97F4A7C15ull));
        if (ok) {
            decay = isinf(r[2]) ? 0.f : 1.f / r[2];
            rate = hypotf(decay, 6.2831853f * r[3]);
        }
    }
    // One atomic per warp for each (the whole warp is here: no thread has returned).
    warp_add(&found[2], h1);
    warp_add(&found[3], h2);
    for (int off = 16; off > 0; off >>= 1) {
        rate = fmaxf(rate, __shfl_down_sync(0xffffffffu, rate, off));
        decay = fmaxf(decay, __shfl_down_sync(0xffffffffu, decay, off));
    }
    if (threadIdx.x % 32 == 0 && rate > 0.f) atomicMax(&found[4], (unsigned long long)__float_as_uint(rate));
    if (threadIdx.x % 32 == 0 && decay > 0.f) atomicMax(&found[5], (unsigned long long)__float_as_uint(decay));
    if (i < ncoil_entries) {
        const float2 c = coils[i];
        if (!(isfinite(c.x) && isfinite(c.y))) atomicMin(&found[1], (unsigned long long)i);
    }
}
