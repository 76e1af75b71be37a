// Runs kmm_inv_norms and kmm_argmax on the CPU with 32 and 256 threads per block.
// Reads: ntr natoms nvox atom_offset accumulate, dict (ntr x natoms float2), sig (ntr x nvox),
// c = D^H X (natoms x nvox), params (natoms_total x float4, natoms_total = atom_offset + natoms),
// then index, score, pd, out_params as they are before the call. Writes inv norms and the outputs.
#include "cuda_shim.h"
#include KERNELS_CU
static void run(unsigned threads, unsigned blocks, const std::function<void()>& body) {
    run_blocks({blocks, 1, 1}, threads, body);
}
int main(int, char** argv) {
    FILE* f = fopen(argv[1], "rb");
    long long h[5]; fread(h, 8, 5, f);
    int ntr = h[0], natoms = h[1], nvox = h[2]; long long off = h[3]; int acc = h[4];
    std::vector<float2> dict((size_t)ntr * natoms), sig((size_t)ntr * nvox), c((size_t)natoms * nvox), pd(nvox);
    std::vector<float4> params(off + natoms), outp(nvox);
    std::vector<int> index(nvox); std::vector<float> score(nvox), inv(natoms);
    fread(dict.data(), 8, dict.size(), f); fread(sig.data(), 8, sig.size(), f); fread(c.data(), 8, c.size(), f);
    fread(params.data(), 16, params.size(), f);
    fread(index.data(), 4, nvox, f); fread(score.data(), 4, nvox, f); fread(pd.data(), 8, nvox, f); fread(outp.data(), 16, nvox, f);
    fclose(f);
    run(32, natoms, [&] { kmm_inv_norms(dict.data(), ntr, natoms, inv.data()); });
    run(256, nvox, [&] {
        kmm_argmax(c.data(), natoms, natoms, inv.data(), sig.data(), ntr, index.data(), score.data(), pd.data(), params.data(), outp.data(), off, acc);
    });
    FILE* o = fopen(argv[2], "wb");
    fwrite(inv.data(), 4, natoms, o); fwrite(index.data(), 4, nvox, o); fwrite(score.data(), 4, nvox, o);
    fwrite(pd.data(), 8, nvox, o); fwrite(outp.data(), 16, nvox, o); fclose(o);
    return 0;
}
