//! The stream-ordering model and the context rule on a GPU (KMM_TEST_GPU=1; on the host backend
//! these tests return at once, as their checks need CUDA's own contexts and kernels).

mod common;
use common::*;
use cudarc::driver::sys;
use kmm::ffi::plugin::{kmm_plugin_alloc, kmm_plugin_free};

fn cuda_ok(status: sys::CUresult, what: &str) {
    assert_eq!(status, sys::CUresult::CUDA_SUCCESS, "{what}");
}

fn current_context() -> sys::CUcontext {
    let mut ctx = std::ptr::null_mut();
    cuda_ok(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent");
    ctx
}

/// With a context of the caller's own current (as CUDA.jl, CuPy or PyTorch leave one), every
/// entry point returns with that context still current.
#[test]
fn every_entry_point_leaves_the_callers_context_current() {
    if !gpu() {
        return;
    }
    unsafe {
        cuda_ok(sys::cuInit(0), "cuInit");
        let mut dev = 0;
        cuda_ok(sys::cuDeviceGet(&mut dev, test_device()), "cuDeviceGet");
        // A context that is not Kmm's (the device's primary one): the caller's.
        let mut theirs = std::ptr::null_mut();
        cuda_ok(sys::cuCtxCreate_v2(&mut theirs, 0, dev), "cuCtxCreate");
        let check = |what: &str| assert_eq!(current_context(), theirs, "{what} changed the caller's current context");
        let m = Mgr::new();
        check("kmm_manager_create");
        let b = m.alloc(1 << 20, DEVICE);
        check("kmm_buffer_alloc");
        let p = m.alloc(4096, PINNED);
        check("kmm_buffer_alloc (pinned)");
        m.upload(b, 0, &pattern(1 << 20, 3));
        check("kmm_copy_to_device");
        ok(kmm_fill(m.0, b, 0, 4096, [7u8].as_ptr().cast(), 1));
        check("kmm_fill");
        assert_eq!(m.download(b, 0, 4096), vec![7u8; 4096]);
        check("kmm_copy_to_host");
        let mut addr = 0;
        ok(kmm_buffer_map(m.0, b, &mut addr));
        check("kmm_buffer_map");
        ok(kmm_buffer_unmap(m.0, b));
        let mut ev = 0;
        ok(kmm_manager_record_event(m.0, &mut ev));
        ok(kmm_event_wait(m.0, ev));
        check("kmm_event_wait");
        ok(kmm_event_destroy(m.0, ev));
        let (mut pb, mut pp) = (0, 0);
        ok(kmm_plugin_alloc(m.0, 4096, DEVICE, 0, &mut pb, &mut pp));
        check("kmm_plugin_alloc");
        ok(kmm_plugin_free(m.0, pb, 0));
        check("kmm_plugin_free");
        ok(kmm_buffer_record_stream(m.0, b, 0));
        m.free(b);
        check("kmm_buffer_free");
        m.free(p);
        m.sync();
        check("kmm_manager_synchronize");
        ok(kmm_manager_trim(m.0, 0));
        check("kmm_manager_trim");
        let _ = m.stats(DEVICE);
        drop(m);
        check("kmm_manager_destroy");
        cuda_ok(sys::cuCtxDestroy_v2(theirs), "cuCtxDestroy");
    }
}

const SLOW_COPY: &str = r#"
extern "C" __global__ void slow_copy(unsigned char* dst, const unsigned char* src, long long n, long long spin) {
    long long start = clock64();
    while (clock64() - start < spin) {}
    for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}
"#;

/// A kernel on a foreign stream reads a buffer whose free was recorded on that stream: the
/// memory is not handed out again (nor trimmed) until the kernel has read it, so the bytes it
/// copies are the buffer's, not those of the next buffer placed there.
#[test]
fn a_recorded_foreign_stream_keeps_freed_memory_until_its_kernel_ran() {
    if !gpu() {
        return;
    }
    const N: usize = 1 << 20;
    let m = Mgr::new();
    let module = kmm::backend::cuda::module::compile(test_device(), SLOW_COPY, &[]).expect("compile");
    let kernel = module.function("slow_copy").expect("kernel");
    let mut foreign = std::ptr::null_mut();
    unsafe {
        let mut ctx = std::ptr::null_mut();
        let mut dev = 0;
        cuda_ok(sys::cuDeviceGet(&mut dev, test_device()), "cuDeviceGet");
        cuda_ok(sys::cuDevicePrimaryCtxRetain(&mut ctx, dev), "retain");
        cuda_ok(sys::cuCtxPushCurrent_v2(ctx), "push");
        cuda_ok(sys::cuStreamCreate(&mut foreign, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32), "cuStreamCreate");
    }
    let stream = foreign as u64;
    let out = m.alloc(N as u64, DEVICE);
    let (mut out_addr, mut src_addr) = (0, 0);
    ok(kmm_buffer_map(m.0, out, &mut out_addr));
    for round in 0..4u64 {
        let src = m.alloc(N as u64, DEVICE);
        let data = pattern(N, round);
        m.upload(src, 0, &data);
        ok(kmm_buffer_map(m.0, src, &mut src_addr));
        // The foreign stream waits for the upload, then reads the buffer slowly.
        ok(kmm_manager_signal_stream(m.0, stream));
        let mut params = [out_addr, src_addr, N as u64, 200_000_000u64];
        unsafe { kernel.launch(stream, [64, 1, 1], [256, 1, 1], 0, &mut params).expect("launch") };
        ok(kmm_buffer_record_stream(m.0, src, stream));
        ok(kmm_buffer_unmap(m.0, src));
        m.free(src);
        // The next buffers take the freed memory if they may: they overwrite it at once.
        let next: Vec<_> = (0..4).map(|_| m.alloc(N as u64, DEVICE)).collect();
        for &b in &next {
            ok(kmm_fill(m.0, b, 0, N as u64, [0xEEu8].as_ptr().cast(), 1));
        }
        ok(kmm_manager_trim(m.0, 0));
        ok(kmm_manager_wait_stream(m.0, stream));
        assert_eq!(m.download(out, 0, N), data, "round {round}: the kernel read bytes of a later buffer");
        for b in next {
            m.free(b);
        }
    }
    ok(kmm_buffer_unmap(m.0, out));
    m.free(out);
    m.sync();
    unsafe {
        cuda_ok(sys::cuStreamSynchronize(foreign), "sync foreign");
        cuda_ok(sys::cuStreamDestroy_v2(foreign), "destroy foreign");
    }
}

/// A registration belongs to the device, not to one stream: another manager's copy may read the
/// range by DMA when the registering manager is destroyed (which ends the registration). The
/// copy must finish before the range is unpinned under it, and its bytes must arrive.
#[test]
fn a_registration_ends_after_other_managers_copies_from_it() {
    if !gpu() {
        return;
    }
    const BYTES: usize = 256 << 20;
    let (owner, user) = (Mgr::new(), Mgr::new());
    let src: Vec<u8> = (0..BYTES).map(|i| (i * 7 + (i >> 20)) as u8).collect();
    ok(kmm_host_register(owner.0, src.as_ptr() as *mut _, BYTES as u64));
    let dst = user.alloc(BYTES as u64, DEVICE);
    for round in 0..4 {
        // Queued as a direct DMA (the range is registered); the owner's destroy follows at once.
        let mut event = 0;
        ok(kmm_copy_to_device_async(user.0, dst, 0, src.as_ptr().cast(), BYTES as u64, &mut event));
        if round == 0 {
            ok(kmm_manager_destroy(owner.0, 0));
        }
        ok(kmm_event_wait(user.0, event));
        ok(kmm_event_destroy(user.0, event));
        let back = user.download(dst, 0, BYTES);
        assert!(back == src, "round {round}: the copy from a registration ended meanwhile lost bytes");
    }
    std::mem::forget(owner); // destroyed in round 0
    user.free(dst);
}
