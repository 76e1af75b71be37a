//! Exported functions on run-time CUDA modules: compile CUDA C with NVRTC for the manager's
//! device (cached in memory and on disk), launch kernels on the manager's stream with buffers
//! passed by handle. On the host backend every call is `KMM_ERROR_NOT_SUPPORTED`.

use super::registry::with_manager;
use super::types::KmmManager;
use super::{boundary, check_out, write_out};
use crate::error::{KmmStatus, Result};
use crate::fail;
use crate::backend::cuda::module::{self, Function, Module};
use crate::backend::BackendKind;
use crate::error::lock;
use crate::manager::handles::{HandleTable, TAG_MODULE};
use crate::manager::Manager;
use std::sync::{Arc, Mutex, OnceLock};
use std::ffi::{c_char, CStr};

/// A compiled, loaded CUDA module. Process-wide: usable with any manager on the device it was
/// compiled for. 0 is never valid.
pub type KmmModule = u64;

/// What a `KmmKernelArg` carries.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KmmArgKind {
    /// `value` is a `KmmBuffer`; the kernel gets its device address plus `offset` bytes.
    KMM_ARG_BUFFER = 0,
    /// The low 32 bits of `value`, as int32_t.
    KMM_ARG_I32 = 1,
    /// `value` as int64_t.
    KMM_ARG_I64 = 2,
    /// The low 32 bits of `value` are the bits of a float.
    KMM_ARG_F32 = 3,
    /// `value` holds the bits of a double.
    KMM_ARG_F64 = 4,
    /// `value` as uint64_t.
    KMM_ARG_U64 = 5,
    /// The low 32 bits of `value`, as uint32_t.
    KMM_ARG_U32 = 6,
}

/// One kernel argument of `kmm_module_launch`: a tagged value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KmmKernelArg {
    /// A `KmmArgKind`.
    pub kind: u32,
    /// Must be zero.
    pub reserved: u32,
    /// The buffer handle or the scalar's bits (see `KmmArgKind`).
    pub value: u64,
    /// Byte offset into the buffer (`KMM_ARG_BUFFER` only; else must be zero).
    pub offset: u64,
}

/// Most kernel arguments of one launch.
pub const KMM_MAX_KERNEL_ARGS: u32 = 256;

fn c_str<'a>(ptr: *const c_char, name: &str) -> Result<&'a str> {
    if ptr.is_null() {
        fail!(KMM_ERROR_NULL_POINTER, "{name} is NULL");
    }
    // SAFETY: non-null and NUL-terminated by contract.
    match unsafe { CStr::from_ptr(ptr) }.to_str() {
        Ok(s) => Ok(s),
        Err(_) => fail!(KMM_ERROR_INVALID_ARGUMENT, "{name} is not valid UTF-8"),
    }
}

/// Compiles CUDA C source `src` with NVRTC for the manager's device and loads it; writes the
/// module to `*out`. `options` holds `noptions` NVRTC options (NULL when 0), e.g. "-DN=32";
/// `--gpu-architecture=sm_XY` of the device is added unless an architecture is given.
/// Kernels must be `extern "C" __global__`. Compiled images are cached in memory and on disk
/// under `$KMM_CACHE_DIR` (else `$XDG_CACHE_HOME/kmm`, else `~/.cache/kmm`), keyed by a hash of
/// source, options, architecture and NVRTC version. A compile error is `KMM_ERROR_COMPILE` with
/// NVRTC's log in `kmm_last_error()`. Needs the CUDA backend and libnvrtc. Thread-safe.
#[no_mangle]
pub extern "C" fn kmm_module_compile(
    manager: KmmManager,
    src: *const c_char,
    options: *const *const c_char,
    noptions: u32,
    out: *mut KmmModule,
) -> KmmStatus {
    boundary(|| {
        check_out(out, "out")?;
        let src = c_str(src, "src")?;
        if noptions > 0 && options.is_null() {
            fail!(KMM_ERROR_NULL_POINTER, "options is NULL but noptions = {noptions}");
        }
        let mut opts = Vec::with_capacity(noptions as usize);
        for i in 0..noptions as usize {
            // SAFETY: `options` holds `noptions` pointers by contract.
            opts.push(c_str(unsafe { *options.add(i) }, &format!("options[{i}]"))?.to_string());
        }
        let m = with_manager(manager, |m| {
            require_cuda(m, "kmm_module_compile")?;
            module::compile(m.device(), src, &opts)
        })?;
        write_out(out, "out", insert_handle(m)?)
    })
}

/// Launches kernel `name` of `module` on the manager's stream with `grid[3]` blocks of
/// `block[3]` threads, `shmem` bytes of dynamic shared memory and `nargs` arguments (at most
/// 256; `args` may be NULL when 0). Buffer arguments are pinned while the launch is queued;
/// stream order keeps them alive for the kernel, as for copies. The arguments must match the
/// kernel's parameters in number, order and size: the driver cannot check them. Returns once
/// queued. Needs the CUDA backend and a module of the manager's device.
#[no_mangle]
pub extern "C" fn kmm_module_launch(
    manager: KmmManager,
    module: KmmModule,
    name: *const c_char,
    grid: *const u32,
    block: *const u32,
    shmem: u32,
    args: *const KmmKernelArg,
    nargs: u32,
) -> KmmStatus {
    boundary(|| {
        let name = c_str(name, "name")?;
        if grid.is_null() || block.is_null() {
            fail!(KMM_ERROR_NULL_POINTER, "{} is NULL", if grid.is_null() { "grid" } else { "block" });
        }
        // SAFETY: grid and block hold three values by contract.
        let (grid, block) = unsafe { (*(grid as *const [u32; 3]), *(block as *const [u32; 3])) };
        if grid.contains(&0) || block.contains(&0) {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "grid = {grid:?} and block = {block:?} must have no zero dimension");
        }
        let threads = block.iter().map(|&b| b as u64).product::<u64>();
        if threads > 1024 {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "block = {block:?} has {threads} threads; at most 1024");
        }
        if nargs > KMM_MAX_KERNEL_ARGS {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "nargs = {nargs} must be at most {KMM_MAX_KERNEL_ARGS}");
        }
        if nargs > 0 && args.is_null() {
            fail!(KMM_ERROR_NULL_POINTER, "args is NULL but nargs = {nargs}");
        }
        let raw = if nargs == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(args, nargs as usize) } };
        let mut list = Vec::with_capacity(raw.len());
        for (i, a) in raw.iter().enumerate() {
            if a.reserved != 0 || (a.kind != KmmArgKind::KMM_ARG_BUFFER as u32 && a.offset != 0) {
                fail!(KMM_ERROR_INVALID_ARGUMENT, "args[{i}]: reserved and (for scalars) offset must be 0");
            }
            list.push(match a.kind {
                0 => Arg::Buffer { handle: a.value, offset: a.offset },
                1 | 3 | 6 => Arg::Scalar(a.value & 0xFFFF_FFFF),
                2 | 4 | 5 => Arg::Scalar(a.value),
                k => fail!(KMM_ERROR_INVALID_ARGUMENT, "args[{i}].kind = {k} is not a KmmArgKind (0 = buffer, 1 = i32, 2 = i64, 3 = f32, 4 = f64, 5 = u64, 6 = u32)"),
            });
        }
        with_manager(manager, |m| {
            require_cuda(m, "kmm_module_launch")?;
            let module = get_handle(module)?;
            if module.device() != m.device() {
                fail!(
                    KMM_ERROR_INVALID_ARGUMENT,
                    "module was compiled for device {} but the manager runs on device {}",
                    module.device(),
                    m.device()
                );
            }
            let f = module.function(name)?;
            launch(m, &f, grid, block, shmem, &list)
        })
    })
}

/// Releases a module handle. The compiled code stays cached for the process (a later compile of
/// the same source is instant). A second destroy is `KMM_ERROR_INVALID_HANDLE`.
#[no_mangle]
pub extern "C" fn kmm_module_destroy(module: KmmModule) -> KmmStatus {
    boundary(|| remove_handle(module))
}

// ---- launches and the table of module handles (the C ABI's side of modules) ----------------

/// The manager must run on CUDA; `what` names the call for the message.
fn require_cuda(m: &Manager, what: &str) -> Result<()> {
    if m.backend_kind() != BackendKind::Cuda {
        fail!(KMM_ERROR_NOT_SUPPORTED, "{what} needs the CUDA backend; this manager runs on the host backend");
    }
    Ok(())
}

/// One argument of a user kernel launch.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Arg {
    /// A buffer's device address plus a byte offset; the buffer is pinned while the launch is
    /// queued.
    Buffer { handle: u64, offset: u64 },
    /// A scalar passed by value: its bits in the low bytes.
    Scalar(u64),
}

/// Launches `function` on the manager's stream. Buffers are mapped for the launch and unmapped
/// once it is queued (stream order keeps their memory alive for the kernel).
fn launch(m: &Manager, function: &Function, grid: [u32; 3], block: [u32; 3], shmem: u32, args: &[Arg]) -> Result<()> {
    let mut mapped: Vec<u64> = Vec::new();
    let result = (|| {
        let mut params = Vec::with_capacity(args.len());
        for (i, a) in args.iter().enumerate() {
            match *a {
                Arg::Scalar(bits) => params.push(bits),
                Arg::Buffer { handle, offset } => {
                    let (_, bytes, _, _) = m.buffer_info(handle)?;
                    if offset > bytes {
                        fail!(KMM_ERROR_OUT_OF_RANGE, "args[{i}].offset = {offset} exceeds the buffer's size of {bytes} bytes");
                    }
                    let addr = m.map_for_own_work(handle)?;
                    mapped.push(handle);
                    params.push(addr + offset);
                }
            }
        }
        // SAFETY: the caller's kernel signature is its own contract (documented in the ABI).
        unsafe { function.launch(m.raw_stream(), grid, block, shmem, &mut params) }
    })();
    for h in mapped {
        let _ = m.end_own_work(h);
    }
    result
}

/// The process-wide table of module handles.
fn table() -> &'static Mutex<HandleTable<Arc<Module>>> {
    static TABLE: OnceLock<Mutex<HandleTable<Arc<Module>>>> = OnceLock::new();
    TABLE.get_or_init(|| Mutex::new(HandleTable::new(TAG_MODULE, 0, 0, 0x5EED)))
}

fn insert_handle(module: Arc<Module>) -> Result<u64> {
    lock(table()).insert(module)
}

fn get_handle(handle: u64) -> Result<Arc<Module>> {
    lock(table()).get(handle).cloned()
}

fn remove_handle(handle: u64) -> Result<()> {
    lock(table()).remove(handle).map(drop)
}
