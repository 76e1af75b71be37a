// The model of the MR-STAT operations on CUDA: voxel records (x, y, T2, B0, Re rho, Im rho) and
// coil sensitivities are checked on the device and the records unpacked into one array per
// field, the kernels' layout, so that no call copies the model to the host and back.
//
// bad[0]: the first voxel whose record fails a check (x, y, B0 or rho not finite, T2 not > 0;
// +Inf is a valid T2); bad[1]: the first coil entry that is not finite. Both start at
// ULLONG_MAX (none).

extern "C" __global__ void kmm_mrstat_unpack(const float* __restrict__ rec, const float2* __restrict__ coils,
    long long nvoxels, long long ncoil_entries, float* __restrict__ x, float* __restrict__ y,
    float* __restrict__ t2, float* __restrict__ b0, float2* __restrict__ rho, unsigned long long* __restrict__ bad)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < nvoxels) {
        const float* r = rec + 6 * i;
        x[i] = r[0];
        y[i] = r[1];
        t2[i] = r[2];
        b0[i] = r[3];
        rho[i] = make_float2(r[4], r[5]);
        const bool ok = isfinite(r[0]) && isfinite(r[1]) && r[2] > 0.f && isfinite(r[3]) && isfinite(r[4]) && isfinite(r[5]);
        if (!ok) atomicMin(&bad[0], (unsigned long long)i);
    }
    if (i < ncoil_entries) {
        const float2 c = coils[i];
        if (!(isfinite(c.x) && isfinite(c.y))) atomicMin(&bad[1], (unsigned long long)i);
    }
}
