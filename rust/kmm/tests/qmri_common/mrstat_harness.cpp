// Runs the MR-STAT kernels (src/qmri/mrstat_kernels.cu) on the CPU through the CUDA shim: one
// std::thread per CUDA thread, blocks one after the other over a 3-D grid (test
// mrstat_kernels_on_cpu). argv[1] input, argv[2] output, all little-endian.
//
// Mode 0 (signal, J.v, J^H w): int64 mode nv nc nr ns cartesian nvec block grid_y grid_z
// block_adj grid_adj, float dt; then float arrays x[nv] y[nv] rho[nv]c t2[nv] b0[nv]
// coils[nc*nv]c m[nr*nv]c dm_t1 dm_t2 vecs[nvec*4*nv] w[nc*nr*ns]c k[(cartesian ? nr : nr*ns)]c
// dk[(cartesian ? nr : 0)]c (c: complex, 2 floats). Writes the signal, nvec J.v (complex,
// signal-shaped each) and J^H w (4*nv floats).
// Mode 1 (FISP derivatives): int64 mode natoms ntr nprof block, float tr te ti; then atoms
// (natoms float4) and table (nprof*ntr float4). Writes m, dm/dT1, dm/dT2 (ntr*natoms complex each).
#include "cuda_shim.h"
#include KERNELS_CU

static void run(dim grid, unsigned threads, const std::function<void()>& body) { run_blocks(grid, threads, body); }

template <class T> static std::vector<T> get(FILE* f, size_t n) {
    std::vector<T> v(n);
    if (n && fread(v.data(), sizeof(T), n, f) != n) { fprintf(stderr, "short input\n"); exit(2); }
    return v;
}

int main(int, char** argv) {
    FILE* f = fopen(argv[1], "rb");
    const long long mode = get<long long>(f, 1)[0];
    FILE* o;
    if (mode == 0) {
        auto h = get<long long>(f, 11);
        const int nv = h[0], nc = h[1], nr = h[2], ns = h[3], cart = h[4], nvec = h[5];
        const unsigned block = h[6], gy = h[7], gz = h[8], block_adj = h[9], gadj = h[10];
        const float dt = get<float>(f, 1)[0];
        auto x = get<float>(f, nv), y = get<float>(f, nv);
        auto rho = get<float2>(f, nv);
        auto t2 = get<float>(f, nv), b0 = get<float>(f, nv);
        auto coils = get<float2>(f, (size_t)nc * nv);
        auto m = get<float2>(f, (size_t)nr * nv), d1 = get<float2>(f, (size_t)nr * nv), d2 = get<float2>(f, (size_t)nr * nv);
        auto vecs = get<float>(f, (size_t)nvec * 4 * nv);
        const size_t nsig = (size_t)nc * nr * ns;
        auto w = get<float2>(f, nsig);
        auto k = get<float2>(f, cart ? nr : (size_t)nr * ns);
        auto dk = get<float2>(f, cart ? nr : 0);
        fclose(f);
        const dim grid = {(unsigned)((ns + block - 1) / block), gy, gz};
        std::vector<float2> sig(nsig), jv(nsig * nvec);
        std::vector<float> adj(4 * (size_t)nv);
        run(grid, block, [&] {
            kmm_mrstat_signal(x.data(), y.data(), rho.data(), t2.data(), b0.data(), coils.data(), m.data(), k.data(),
                              dk.data(), sig.data(), nv, nc, nr, ns, dt, cart);
        });
        for (int j = 0; j < nvec; ++j)
            run(grid, block, [&] {
                kmm_mrstat_jacobian(x.data(), y.data(), rho.data(), t2.data(), b0.data(), coils.data(), m.data(), d1.data(),
                                    d2.data(), vecs.data() + (size_t)j * 4 * nv, k.data(), dk.data(), jv.data() + j * nsig,
                                    nv, nc, nr, ns, dt, cart);
            });
        run({gadj, 1, 1}, block_adj, [&] {
            kmm_mrstat_jacobian_adjoint(x.data(), y.data(), rho.data(), t2.data(), b0.data(), coils.data(), m.data(),
                                        d1.data(), d2.data(), w.data(), k.data(), dk.data(), adj.data(), nv, nc, nr, ns, dt, cart);
        });
        o = fopen(argv[2], "wb");
        fwrite(sig.data(), 8, sig.size(), o);
        fwrite(jv.data(), 8, jv.size(), o);
        fwrite(adj.data(), 4, adj.size(), o);
    } else {
        auto h = get<long long>(f, 4);
        const int natoms = h[0], ntr = h[1], nprof = h[2];
        const unsigned block = h[3];
        auto sc = get<float>(f, 3);
        auto atoms = get<float4>(f, natoms);
        auto table = get<float4>(f, (size_t)nprof * ntr);
        fclose(f);
        const size_t n = (size_t)ntr * natoms;
        std::vector<float2> m(n), d1(n), d2(n);
        run({(unsigned)((natoms + block - 1) / block), 1, 1}, block, [&] {
            kmm_mrstat_fisp_derivatives(atoms.data(), m.data(), d1.data(), d2.data(), table.data(), natoms, ntr, nprof,
                                        sc[0], sc[1], sc[2]);
        });
        o = fopen(argv[2], "wb");
        fwrite(m.data(), 8, n, o);
        fwrite(d1.data(), 8, n, o);
        fwrite(d2.data(), 8, n, o);
    }
    fclose(o);
    return 0;
}
