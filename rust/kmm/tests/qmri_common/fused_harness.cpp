// Runs kmm_match_fused on the CPU (256 threads per block, as launched).
// Reads: k natoms nvox atom_offset accumulate (int64 each), dict (k x natoms float2),
// xs (k x nvox), inv (natoms float), inv_x (nvox float), params (atom_offset + natoms float4),
// then index, score, pd, out_params as they are before the call. Writes the outputs.
#include "cuda_shim.h"
#include KERNELS_CU
static void run(unsigned threads, unsigned blocks, const std::function<void()>& body) {
    run_blocks({blocks, 1, 1}, threads, body);
}
int main(int, char** argv) {
    FILE* f = fopen(argv[1], "rb");
    long long h[5]; fread(h, 8, 5, f);
    int k = h[0], natoms = h[1], nvox = h[2]; long long off = h[3]; int acc = h[4];
    std::vector<float2> dict((size_t)k * natoms), xs((size_t)k * nvox), pd(nvox);
    std::vector<float> inv(natoms), inv_x(nvox), score(nvox);
    std::vector<float4> params(off + natoms), outp(nvox);
    std::vector<int> index(nvox);
    fread(dict.data(), 8, dict.size(), f); fread(xs.data(), 8, xs.size(), f);
    fread(inv.data(), 4, natoms, f); fread(inv_x.data(), 4, nvox, f); fread(params.data(), 16, params.size(), f);
    fread(index.data(), 4, nvox, f); fread(score.data(), 4, nvox, f); fread(pd.data(), 8, nvox, f); fread(outp.data(), 16, nvox, f);
    fclose(f);
    run(256, (nvox + MATCH_V - 1) / MATCH_V, [&] {
        kmm_match_fused(dict.data(), k, natoms, inv.data(), xs.data(), inv_x.data(), nvox, index.data(), score.data(),
                        pd.data(), params.data(), outp.data(), off, acc);
    });
    FILE* o = fopen(argv[2], "wb");
    fwrite(index.data(), 4, nvox, o); fwrite(score.data(), 4, nvox, o); fwrite(pd.data(), 8, nvox, o);
    fwrite(outp.data(), 16, nvox, o); fclose(o);
    return 0;
}
