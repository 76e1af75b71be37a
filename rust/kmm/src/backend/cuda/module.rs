//! Run-time CUDA modules: CUDA C source compiled by NVRTC (loaded at run time) for the device's
//! compute capability, cached in memory per device and on disk (keyed by a hash of source,
//! options, device architecture and NVRTC version), loaded with `cuModuleLoadData`, and
//! launched on a manager's stream with buffers passed by handle.
//!
//! Compiled modules stay loaded for the life of the process (they are small, and the qMRI
//! kernels are reused across managers); a module handle only names one.

use super::module_cache as cache;
use super::{check, enter, Current};
use crate::error::{lock, Error, KmmStatus, Result};
use crate::{err, fail};
use cudarc::driver::sys;
use cudarc::nvrtc::sys as nv;
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};

/// Raw driver handles are plain pointers; the driver allows their use from any thread.
#[derive(Clone, Copy)]
struct Raw<T>(T);
unsafe impl<T> Send for Raw<T> {}
unsafe impl<T> Sync for Raw<T> {}

/// A module loaded on one device's primary context.
pub struct Module {
    device: i32,
    ctx: Raw<sys::CUcontext>,
    module: Raw<sys::CUmodule>,
    functions: Mutex<HashMap<String, Raw<sys::CUfunction>>>,
}

impl Module {
    pub fn device(&self) -> i32 {
        self.device
    }

    /// The kernel named `name` (an `extern "C" __global__` function).
    pub fn function(&self, name: &str) -> Result<Function> {
        let mut functions = lock(&self.functions);
        if let Some(f) = functions.get(name) {
            return Ok(Function { f: f.0, ctx: self.ctx.0 });
        }
        let cname = CString::new(name).map_err(|_| err!(KMM_ERROR_INVALID_ARGUMENT, "kernel name {name:?} contains a NUL byte"))?;
        let _current = enter(self.ctx.0)?;
        let mut f = std::ptr::null_mut();
        let status = unsafe { sys::cuModuleGetFunction(&mut f, self.module.0, cname.as_ptr()) };
        if status == sys::CUresult::CUDA_ERROR_NOT_FOUND {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "name = {name:?}: the module has no such kernel (declare it extern \"C\" __global__)");
        }
        check(status, "cuModuleGetFunction")?;
        functions.insert(name.to_string(), Raw(f));
        Ok(Function { f, ctx: self.ctx.0 })
    }
}

/// A kernel ready to launch.
#[derive(Clone, Copy)]
pub struct Function {
    f: sys::CUfunction,
    ctx: sys::CUcontext,
}

impl Function {
    /// Queues the kernel on `stream`. `params` holds one 8-byte slot per kernel parameter, the
    /// value in its low bytes (the driver reads the parameter's size from each slot).
    ///
    /// # Safety
    /// The parameters match the kernel's signature and the memory they name stays valid until
    /// the kernel has run.
    pub unsafe fn launch(&self, stream: u64, grid: [u32; 3], block: [u32; 3], shmem: u32, params: &mut [u64]) -> Result<()> {
        let _current = enter(self.ctx)?;
        if shmem > 48 << 10 {
            check(
                sys::cuFuncSetAttribute(
                    self.f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shmem as i32,
                ),
                "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
            )?;
        }
        let mut ptrs: Vec<*mut c_void> = params.iter_mut().map(|p| p as *mut u64 as *mut c_void).collect();
        check(
            sys::cuLaunchKernel(
                self.f,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shmem,
                stream as sys::CUstream,
                if ptrs.is_empty() { std::ptr::null_mut() } else { ptrs.as_mut_ptr() },
                std::ptr::null_mut(),
            ),
            "cuLaunchKernel",
        )
    }

    /// Blocks of `block_size` threads that fit on one multiprocessor at once.
    pub fn occupancy(&self, block_size: u32, shmem: usize) -> Result<u32> {
        let _current = enter(self.ctx)?;
        let mut n = 0;
        check(
            unsafe { sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, self.f, block_size as i32, shmem) },
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        )?;
        Ok(n.max(0) as u32)
    }
}

/// A device's primary context (retained once, for the life of the process) and architecture.
#[derive(Clone, Copy)]
pub struct DeviceInfo {
    ctx: Raw<sys::CUcontext>,
    pub major: i32,
    pub minor: i32,
    pub multiprocessors: i32,
}

impl DeviceInfo {
    /// Makes the device's context current until the guard drops (see `backend::cuda::enter`).
    pub(crate) fn enter(&self) -> Result<Current> {
        enter(self.ctx.0)
    }
}

pub fn device_info(device: i32) -> Result<DeviceInfo> {
    static DEVICES: OnceLock<Mutex<HashMap<i32, DeviceInfo>>> = OnceLock::new();
    let mut devices = lock(DEVICES.get_or_init(|| Mutex::new(HashMap::new())));
    if let Some(d) = devices.get(&device) {
        return Ok(*d);
    }
    use sys::CUdevice_attribute::*;
    let info = unsafe {
        let mut dev = 0;
        check(sys::cuDeviceGet(&mut dev, device), "cuDeviceGet")?;
        let mut ctx = std::ptr::null_mut();
        check(sys::cuDevicePrimaryCtxRetain(&mut ctx, dev), "cuDevicePrimaryCtxRetain")?;
        let attr = |a| {
            let mut v = 0;
            check(sys::cuDeviceGetAttribute(&mut v, a, dev), "cuDeviceGetAttribute").map(|_| v)
        };
        DeviceInfo {
            ctx: Raw(ctx),
            major: attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            minor: attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            multiprocessors: attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        }
    };
    devices.insert(device, info);
    Ok(info)
}

fn nvrtc_version() -> Result<(i32, i32)> {
    if !unsafe { nv::is_culib_present() } {
        fail!(
            KMM_ERROR_BACKEND_UNAVAILABLE,
            "run-time compilation needs NVRTC, which was not found: put a directory holding libnvrtc.so (a link to libnvrtc.so.13 or .12 of the CUDA toolkit) on LD_LIBRARY_PATH"
        );
    }
    let (mut major, mut minor) = (0, 0);
    let status = unsafe { nv::nvrtcVersion(&mut major, &mut minor) };
    if status != nv::nvrtcResult::NVRTC_SUCCESS {
        fail!(KMM_ERROR_BACKEND, "nvrtcVersion failed: {status:?}");
    }
    Ok((major, minor))
}

/// Compiles (or finds in the caches) `src` with `options` for `device` and loads it.
pub fn compile(device: i32, src: &str, options: &[String]) -> Result<Arc<Module>> {
    static LOADED: OnceLock<Mutex<HashMap<(i32, u64), Arc<Module>>>> = OnceLock::new();
    if src.contains('\0') {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "src contains a NUL byte");
    }
    if let Some(o) = options.iter().find(|o| o.contains('\0')) {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "option {o:?} contains a NUL byte");
    }
    let info = device_info(device)?;
    let nvrtc = nvrtc_version()?;
    let mut opts: Vec<String> = options.to_vec();
    if !opts.iter().any(|o| o.starts_with("--gpu-architecture") || o.starts_with("-arch")) {
        opts.push(format!("--gpu-architecture=sm_{}{}", info.major, info.minor));
    }
    let key = cache::key(src, &opts, (info.major, info.minor), nvrtc);
    let loaded = LOADED.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(m) = lock(loaded).get(&(device, key)) {
        return Ok(m.clone());
    }
    let _current = info.enter()?;
    let load = |image: &[u8]| {
        let mut module = std::ptr::null_mut();
        check(unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr() as *const c_void) }, "cuModuleLoadData").map(|_| module)
    };
    // A cached image that does not load (truncated, or from another driver) is compiled anew.
    let module = match cache::read(key).map(|image| load(&image)) {
        Some(Ok(module)) => module,
        _ => {
            let (image, _log) = nvrtc_compile(src, &opts)?;
            let module = load(&image)?;
            cache::write(key, &image);
            module
        }
    };
    let m = Arc::new(Module { device, ctx: info.ctx, module: Raw(module), functions: Mutex::new(HashMap::new()) });
    lock(loaded).insert((device, key), m.clone());
    Ok(m)
}

/// Compiles without loading (no device or driver needed, only libnvrtc): the image and NVRTC's
/// log (with `--ptxas-options=-v`, register and spill counts). For checks and tuning.
pub fn compile_image(src: &str, opts: &[String]) -> Result<(Vec<u8>, String)> {
    nvrtc_version()?;
    nvrtc_compile(src, opts)
}

/// NVRTC to a CUBIN (for `sm_XY`) or to PTX (for `compute_XY`), NUL-terminated; and the log.
fn nvrtc_compile(src: &str, opts: &[String]) -> Result<(Vec<u8>, String)> {
    let csrc = CString::new(src).expect("checked for NUL");
    let copts: Vec<CString> = opts.iter().map(|o| CString::new(o.as_str()).expect("checked for NUL")).collect();
    let optr: Vec<*const std::ffi::c_char> = copts.iter().map(|c| c.as_ptr()).collect();
    let nvcheck = |s: nv::nvrtcResult, call: &str| -> Result<()> {
        if s == nv::nvrtcResult::NVRTC_SUCCESS {
            Ok(())
        } else {
            Err(Error::new(KmmStatus::KMM_ERROR_BACKEND, format!("{call} failed: {s:?}")))
        }
    };
    unsafe {
        let mut prog = std::ptr::null_mut();
        nvcheck(
            nv::nvrtcCreateProgram(&mut prog, csrc.as_ptr(), c"kmm_module.cu".as_ptr(), 0, std::ptr::null(), std::ptr::null()),
            "nvrtcCreateProgram",
        )?;
        let result = (|| {
            let status = nv::nvrtcCompileProgram(prog, optr.len() as i32, optr.as_ptr());
            let mut size = 0usize;
            let mut log = String::new();
            if nv::nvrtcGetProgramLogSize(prog, &mut size) == nv::nvrtcResult::NVRTC_SUCCESS && size > 1 {
                let mut buf = vec![0u8; size];
                if nv::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut std::ffi::c_char) == nv::nvrtcResult::NVRTC_SUCCESS {
                    log = String::from_utf8_lossy(&buf[..size - 1]).into_owned();
                }
            }
            if status != nv::nvrtcResult::NVRTC_SUCCESS {
                fail!(KMM_ERROR_COMPILE, "NVRTC compilation failed ({status:?}) with options {opts:?}:\n{log}");
            }
            let cubin = opts.iter().any(|o| o.contains("sm_"));
            let mut size = 0usize;
            let mut image;
            if cubin {
                nvcheck(nv::nvrtcGetCUBINSize(prog, &mut size), "nvrtcGetCUBINSize")?;
                image = vec![0u8; size];
                nvcheck(nv::nvrtcGetCUBIN(prog, image.as_mut_ptr() as *mut std::ffi::c_char), "nvrtcGetCUBIN")?;
            } else {
                nvcheck(nv::nvrtcGetPTXSize(prog, &mut size), "nvrtcGetPTXSize")?;
                image = vec![0u8; size];
                nvcheck(nv::nvrtcGetPTX(prog, image.as_mut_ptr() as *mut std::ffi::c_char), "nvrtcGetPTX")?;
                if image.last() != Some(&0) {
                    image.push(0);
                }
            }
            Ok((image, log))
        })();
        nv::nvrtcDestroyProgram(&mut prog);
        result
    }
}
