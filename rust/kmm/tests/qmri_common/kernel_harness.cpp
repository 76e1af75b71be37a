#include "cuda_shim.h"
#include KERNELS_CU
// Runs kmm_fisp (LANES threads per atom) and kmm_pssfp on the CPU. Reads: natoms ntr nprof nrf nz, then atoms (4 floats each), table (nprof*ntr float4), seq floats;
// writes fisp and pssfp outputs as raw float2.
int main(int argc, char** argv) {
    FILE* f = fopen(argv[1], "rb");
    int hdr[5]; fread(hdr, 4, 5, f);
    int natoms = hdr[0], ntr = hdr[1], nprof = hdr[2], nrf = hdr[3], nz = hdr[4];
    std::vector<float4> atoms(natoms), table(nprof * ntr), rf(ntr);
    fread(atoms.data(), 16, natoms, f);
    fread(table.data(), 16, nprof * ntr, f);
    fread(rf.data(), 16, ntr, f);
    std::vector<float> shape(nrf), z(nz), sc(8);
    fread(shape.data(), 4, nrf, f); fread(z.data(), 4, nz, f); fread(sc.data(), 4, 8, f);
    fclose(f);
    std::vector<float2> out(natoms * ntr), out2(natoms * ntr);
    blockDim = {LANES, 1, 1}; nthreads = LANES;
    for (int a = 0; a < natoms; ++a) {
        blockIdx = {(unsigned)a, 0, 0};
        std::vector<std::thread> ts;
        for (unsigned l = 0; l < LANES; ++l)
            ts.emplace_back([&, l] { threadIdx = {l, 0, 0}; kmm_fisp(atoms.data(), out.data(), table.data(), natoms, ntr, nprof, sc[0], sc[1], sc[2]); });
        for (auto& t : ts) t.join();
    }
    blockDim = {1, 1, 1}; threadIdx = {0, 0, 0};
    for (int a = 0; a < natoms; ++a) {
        blockIdx = {(unsigned)a, 0, 0};
        kmm_pssfp(atoms.data(), out2.data(), rf.data(), shape.data(), z.data(), natoms, ntr, nrf, nz, sc[3], sc[4], sc[5], sc[6], sc[7]);
    }
    FILE* o = fopen(argv[2], "wb"); fwrite(out.data(), 8, out.size(), o); fwrite(out2.data(), 8, out2.size(), o); fclose(o);
    return 0;
}
