//! Helpers for tests that drive libkmm through its exported functions, as Julia and Python do.
#![allow(dead_code)]

pub use kmm::ffi::buffer::*;
pub use kmm::ffi::copy::*;
pub use kmm::ffi::manager::*;
pub use kmm::ffi::types::*;
pub use kmm::ffi::*;
pub use kmm::KmmStatus::{self, *};
use kmm::ffi::registry::with_manager;
use std::ffi::CStr;
use std::sync::{Arc, Condvar, Mutex};

pub const DEVICE: u32 = KmmMemoryKind::KMM_MEMORY_DEVICE as u32;
pub const PINNED: u32 = KmmMemoryKind::KMM_MEMORY_PINNED as u32;

/// True when the GPU suite is asked for (KMM_TEST_GPU=1): tests then run on the CUDA backend.
pub fn gpu() -> bool {
    std::env::var("KMM_TEST_GPU").is_ok_and(|v| v == "1")
}

/// KMM_TEST_DEVICE=N runs a suite's managers on device N (the GPU suites on each device; the
/// host managers of those suites need KMM_HOST_DEVICES > N too). Default 0.
pub fn test_device() -> i32 {
    match std::env::var("KMM_TEST_DEVICE") {
        Ok(d) => d.parse().unwrap_or_else(|_| panic!("KMM_TEST_DEVICE={d:?} is not a device number")),
        Err(_) => 0,
    }
}

pub fn default_config() -> KmmConfig {
    let mut c = std::mem::MaybeUninit::<KmmConfig>::uninit();
    assert_eq!(kmm_config_default(c.as_mut_ptr()), KMM_OK);
    let mut c = unsafe { c.assume_init() };
    c.backend = if gpu() { KmmBackend::KMM_BACKEND_CUDA } else { KmmBackend::KMM_BACKEND_HOST } as u32;
    c.device = test_device();
    // KMM_TEST_ALLOC_MODE=pool|cuda_async|direct runs a suite in another allocation mode.
    match std::env::var("KMM_TEST_ALLOC_MODE").ok().as_deref() {
        None | Some("") | Some("pool") => {}
        Some("cuda_async") => c.alloc_mode = KmmAllocMode::KMM_ALLOC_CUDA_ASYNC as u32,
        Some("direct") => c.alloc_mode = KmmAllocMode::KMM_ALLOC_DIRECT as u32,
        Some(other) => panic!("KMM_TEST_ALLOC_MODE={other:?} is not pool, cuda_async or direct"),
    }
    c
}

pub fn last_error() -> String {
    unsafe { CStr::from_ptr(kmm_last_error()) }.to_string_lossy().into_owned()
}

/// Asserts a status and that the last error mentions each of `words`.
#[track_caller]
pub fn expect_err(status: KmmStatus, want: KmmStatus, words: &[&str]) {
    assert_eq!(status, want, "last error: {}", last_error());
    let msg = last_error();
    for w in words {
        assert!(msg.contains(w), "error message {msg:?} lacks {w:?}");
    }
}

#[track_caller]
pub fn ok(status: KmmStatus) {
    assert_eq!(status, KMM_OK, "{}", last_error());
}

pub struct Mgr(pub KmmManager);

impl Mgr {
    pub fn new() -> Mgr {
        Mgr::with(|_| {})
    }
    pub fn with(f: impl FnOnce(&mut KmmConfig)) -> Mgr {
        let mut c = default_config();
        f(&mut c);
        let mut m = 0;
        ok(kmm_manager_create(&c, &mut m));
        Mgr(m)
    }
    pub fn alloc(&self, bytes: u64, kind: u32) -> KmmBuffer {
        let mut b = 0;
        ok(kmm_buffer_alloc(self.0, bytes, kind, &mut b));
        b
    }
    pub fn upload(&self, b: KmmBuffer, offset: u64, data: &[u8]) {
        ok(kmm_copy_to_device(self.0, b, offset, data.as_ptr().cast(), data.len() as u64));
    }
    pub fn download(&self, b: KmmBuffer, offset: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        ok(kmm_copy_to_host(self.0, out.as_mut_ptr().cast(), b, offset, len as u64));
        out
    }
    pub fn stats(&self, kind: u32) -> KmmMemoryStats {
        let mut s = KmmMemoryStats::default();
        ok(kmm_manager_stats(self.0, kind, &mut s));
        s
    }
    pub fn free(&self, b: KmmBuffer) {
        ok(kmm_buffer_free(self.0, b, 0));
    }
    pub fn info(&self, b: KmmBuffer) -> KmmBufferInfo {
        let mut i = KmmBufferInfo::default();
        ok(kmm_buffer_info(self.0, b, &mut i));
        i
    }
    pub fn sync(&self) {
        ok(kmm_manager_synchronize(self.0));
    }
}

impl Drop for Mgr {
    fn drop(&mut self) {
        kmm_manager_destroy(self.0, 0);
    }
}

/// Deterministic bytes that differ per seed and position.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Blocks the manager's stream until `open` is called, so that any operation that skipped the
/// queue shows up as wrong data. While it is closed nothing may call a CUDA function that
/// synchronizes (first-time pinned or device allocations): the test would wait for the stream
/// and the stream for the test. `close` warms the pools first; `shut` leaves that to the caller.
pub struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    pub fn close(m: &Mgr) -> Gate {
        Gate::warm(m);
        Gate::shut(m)
    }

    /// Makes the first device and pinned allocations and copies, then waits for the stream.
    pub fn warm(m: &Mgr) {
        let warm = m.alloc(4 << 20, DEVICE);
        m.upload(warm, 0, &vec![0u8; 4 << 20]);
        m.download(warm, 0, 4 << 20);
        m.free(warm);
        let warm = m.alloc(64 << 10, PINNED);
        m.free(warm);
        m.sync();
    }

    pub fn shut(m: &Mgr) -> Gate {
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let g = gate.clone();
        with_manager(m.0, |mgr| {
            mgr.stream().launch_host_fn(Box::new(move || {
                let (lock, cv) = &*g;
                let mut open = lock.lock().unwrap();
                while !*open {
                    open = cv.wait(open).unwrap();
                }
            }))
        })
        .unwrap();
        Gate(gate)
    }

    pub fn open(&self) {
        *self.0 .0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.0 .1.notify_all();
    }
}

/// A test that fails with the gate closed must not hang in the manager's teardown.
impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}

/// Runs `body` on a thread of its own and fails the test when it has not returned within
/// `secs`. A stuck body is left behind: its threads and managers cannot be freed.
pub fn within<R: Send + 'static>(secs: u64, what: &str, body: impl FnOnce() -> R + Send + 'static) -> R {
    let (done, finished) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        let result = body();
        let _ = done.send(());
        result
    });
    match finished.recv_timeout(std::time::Duration::from_secs(secs)) {
        // Returned, or panicked (the sender is dropped): join passes the panic on.
        Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => worker.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("{what}: not done after {secs} s (deadlocked)"),
    }
}
