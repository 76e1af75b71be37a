// A minimal CUDA shim: runs the qMRI kernels' per-thread code on the CPU (test qmri_kernels_on_cpu).
// A group of LANES threads runs on std::threads; warp shuffles go through a shared array and a
// barrier, so the data exchange between lanes is exercised too.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
struct float2 { float x, y; };
struct float3 { float x, y, z; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline float3 make_float3(float a, float b, float c) { return {a, b, c}; }
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct dim { unsigned x, y, z; };
#include <thread>
#include <functional>
#include <mutex>
#include <condition_variable>
static thread_local dim threadIdx;
static dim blockIdx, blockDim;
static std::mutex mu; static std::condition_variable cv; static unsigned arrived = 0, generation = 0, nthreads = 1;
static float slots[1024];
static int islots[1024];
static void barrier() {
    std::unique_lock<std::mutex> l(mu);
    unsigned g = generation;
    if (++arrived == nthreads) { arrived = 0; ++generation; cv.notify_all(); }
    else cv.wait(l, [&] { return generation != g; });
}
#define __sincosf(x, s, c) sincosf(x, s, c)
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#define __shared__ static
static inline float cospif(float x) { return cosf(3.14159265358979f * x); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
using std::isfinite;
static inline float __shfl_down_sync(unsigned, float v, int d, int w = 32) {
    unsigned l = threadIdx.x; slots[l] = v; barrier();
    float r = (l % w + d < (unsigned)w) ? slots[l + d] : v; barrier(); return r; }
static inline float __shfl_up_sync(unsigned, float v, int d, int w = 32) {
    unsigned l = threadIdx.x; slots[l] = v; barrier();
    float r = (l % w >= (unsigned)d) ? slots[l - d] : v; barrier(); return r; }
static inline int __shfl_down_sync(unsigned, int v, int d, int w = 32) {
    unsigned l = threadIdx.x; islots[l] = v; barrier();
    int r = (l % w + d < (unsigned)w) ? islots[l + d] : v; barrier(); return r; }
static inline void __syncthreads() { barrier(); }
static dim gridDim;
// Runs `body` as a kernel launch: the blocks of `grid` one after the other, each with `threads`
// std::threads standing in for its CUDA threads.
static void run_blocks(dim grid, unsigned threads, const std::function<void()>& body) {
    gridDim = grid;
    blockDim = {threads, 1, 1}; nthreads = threads;
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                blockIdx = {x, y, z};
                std::vector<std::thread> ts;
                for (unsigned t = 0; t < threads; ++t) ts.emplace_back([&, t] { threadIdx = {t, 0, 0}; body(); });
                for (auto& t : ts) t.join();
            }
}
