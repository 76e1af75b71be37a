//! Run-time CUDA modules on a GPU (KMM_TEST_GPU=1; skipped otherwise): a user kernel compiled
//! and launched with buffer and scalar arguments, the caches, and a compile error's log.

mod common;
mod qmri_common;
use common::*;
use qmri_common::*;
use std::ffi::CString;

const SAXPY: &str = r#"
extern "C" __global__ void saxpy(float* y, const float* x, float a, int n, long long shift) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i] + (float)shift;
}
"#;

fn compile(m: &Mgr, src: &str, opts: &[&str]) -> Result<KmmModule, KmmStatus> {
    let src = CString::new(src).unwrap();
    let opts: Vec<CString> = opts.iter().map(|o| CString::new(*o).unwrap()).collect();
    let ptrs: Vec<*const std::ffi::c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut module = 0;
    match kmm_module_compile(m.0, src.as_ptr(), ptrs.as_ptr(), ptrs.len() as u32, &mut module) {
        KMM_OK => Ok(module),
        s => Err(s),
    }
}

#[test]
fn user_kernel_compiles_launches_and_is_cached() {
    if !gpu() {
        eprintln!("skipped: set KMM_TEST_GPU=1 to run on a GPU");
        return;
    }
    let cache = std::env::temp_dir().join(format!("kmm-module-cache-{}", std::process::id()));
    std::env::set_var("KMM_CACHE_DIR", &cache);
    let m = Mgr::new();
    let n = 1000usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let y: Vec<f32> = vec![1.0; n + 16];
    let (bx, by) = (upload(&m, &x), upload(&m, &y));
    let t0 = std::time::Instant::now();
    let module = compile(&m, SAXPY, &["--use_fast_math"]).unwrap_or_else(|s| panic!("{s:?}: {}", last_error()));
    let first = t0.elapsed();
    let t1 = std::time::Instant::now();
    let again = compile(&m, SAXPY, &["--use_fast_math"]).unwrap();
    let cached = t1.elapsed();
    assert!(std::fs::read_dir(&cache).unwrap().count() >= 1, "no file in the disk cache {cache:?}");
    println!("compile: first {first:?}, cached {cached:?}");
    let name = CString::new("saxpy").unwrap();
    let args = [
        KmmKernelArg { kind: KmmArgKind::KMM_ARG_BUFFER as u32, reserved: 0, value: by, offset: 16 * 4 },
        KmmKernelArg { kind: KmmArgKind::KMM_ARG_BUFFER as u32, reserved: 0, value: bx, offset: 0 },
        KmmKernelArg { kind: KmmArgKind::KMM_ARG_F32 as u32, reserved: 0, value: 2.5f32.to_bits() as u64, offset: 0 },
        KmmKernelArg { kind: KmmArgKind::KMM_ARG_I32 as u32, reserved: 0, value: n as u64, offset: 0 },
        KmmKernelArg { kind: KmmArgKind::KMM_ARG_I64 as u32, reserved: 0, value: (-3i64) as u64, offset: 0 },
    ];
    let grid = [n.div_ceil(128) as u32, 1, 1];
    let block = [128u32, 1, 1];
    ok(kmm_module_launch(m.0, again, name.as_ptr(), grid.as_ptr(), block.as_ptr(), 0, args.as_ptr(), args.len() as u32));
    m.sync();
    let got: Vec<f32> = download(&m, by, n + 16);
    for i in 0..16 {
        assert_eq!(got[i], 1.0);
    }
    for i in 0..n {
        assert_eq!(got[16 + i], 2.5 * i as f32 + 1.0 - 3.0, "y[{i}]");
    }
    let mut info = KmmBufferInfo::default();
    ok(kmm_buffer_info(m.0, by, &mut info));
    assert_eq!(info.pins, 0, "buffers are unpinned after the launch is queued");
    let missing = CString::new("nope").unwrap();
    expect_err(
        kmm_module_launch(m.0, module, missing.as_ptr(), grid.as_ptr(), block.as_ptr(), 0, args.as_ptr(), 5),
        KMM_ERROR_INVALID_ARGUMENT,
        &["nope", "no such kernel"],
    );
    ok(kmm_module_destroy(module));
    ok(kmm_module_destroy(again));
    expect_err(kmm_module_destroy(module), KMM_ERROR_INVALID_HANDLE, &[]);
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn compile_errors_return_the_nvrtc_log() {
    if !gpu() {
        return;
    }
    let m = Mgr::new();
    let status = compile(&m, "extern \"C\" __global__ void broken(float* y) { y[0] = undeclared_name; }", &[]);
    assert_eq!(status, Err(KMM_ERROR_COMPILE));
    let msg = last_error();
    assert!(msg.contains("undeclared_name") && msg.contains("error"), "log missing from {msg:?}");
    println!("compile error message:\n{msg}");
}
