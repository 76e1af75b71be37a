//! Fault injection for tests: a backend that wraps any other and makes every k-th upstream
//! allocation, copy or stream operation fail with `KMM_ERROR_BACKEND` (allocations with
//! `KMM_ERROR_OUT_OF_MEMORY`), as a flaky or exhausted device would. It also keeps the books of
//! every allocation made through it, so tests can check that nothing leaks.
//!
//! Tests install a [`FaultPlan`] with [`install`]; every manager created while it is installed
//! runs on a [`FaultyBackend`] over the backend it asked for. From outside Rust, the variable
//! `KMM_FAULTS="alloc=K,copy=K,stream=K"` installs a plan the first time a backend is opened.
//! With no plan installed, [`wrap_if_planned`] returns the backend untouched and costs one
//! uncontended lock per manager creation.

use super::{AsyncPool, Backend, BackendKind, DevicePtr, Event, Stream};
use crate::error::{lock, Result};
use crate::fail;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// What fails and how often. Every counter is shared by all managers created under the plan.
#[derive(Default)]
pub struct FaultPlan {
    /// Fail every k-th `alloc_device`/`alloc_pinned`/`create_async_pool` (0: never).
    alloc_every: AtomicU64,
    /// Fail every k-th copy or memset (0: never).
    copy_every: AtomicU64,
    /// Fail every k-th record, wait, synchronize, host function, event or stream creation.
    stream_every: AtomicU64,
    alloc_ops: AtomicU64,
    copy_ops: AtomicU64,
    stream_ops: AtomicU64,
    injected: AtomicU64,
    /// Live allocations made through faulty backends: address -> bytes.
    live: Mutex<HashMap<u64, u64>>,
}

/// Totals of one plan, for reports.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FaultCounts {
    pub alloc_ops: u64,
    pub copy_ops: u64,
    pub stream_ops: u64,
    pub injected: u64,
}

impl FaultPlan {
    pub fn new() -> Arc<FaultPlan> {
        Arc::new(FaultPlan::default())
    }

    /// Sets the periods (0 disables a category) and restarts the counting.
    pub fn set(&self, alloc_every: u64, copy_every: u64, stream_every: u64) {
        self.alloc_every.store(alloc_every, Ordering::SeqCst);
        self.copy_every.store(copy_every, Ordering::SeqCst);
        self.stream_every.store(stream_every, Ordering::SeqCst);
    }

    /// The fault clears: nothing fails from now on (the books are kept).
    pub fn clear(&self) {
        self.set(0, 0, 0);
    }

    pub fn counts(&self) -> FaultCounts {
        FaultCounts {
            alloc_ops: self.alloc_ops.load(Ordering::SeqCst),
            copy_ops: self.copy_ops.load(Ordering::SeqCst),
            stream_ops: self.stream_ops.load(Ordering::SeqCst),
            injected: self.injected.load(Ordering::SeqCst),
        }
    }

    /// (allocations, bytes) made through faulty backends and not yet freed.
    pub fn live(&self) -> (usize, u64) {
        let live = lock(&self.live);
        (live.len(), live.values().sum())
    }

    fn parse(spec: &str) -> Result<Arc<FaultPlan>> {
        let plan = FaultPlan::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part.split_once('=').unwrap_or((part, ""));
            let Ok(k) = value.parse::<u64>() else {
                fail!(KMM_ERROR_INVALID_ARGUMENT, "KMM_FAULTS: {part:?} is not key=integer");
            };
            match key {
                "alloc" => plan.alloc_every.store(k, Ordering::SeqCst),
                "copy" => plan.copy_every.store(k, Ordering::SeqCst),
                "stream" => plan.stream_every.store(k, Ordering::SeqCst),
                _ => fail!(KMM_ERROR_INVALID_ARGUMENT, "KMM_FAULTS: unknown key {key:?} (alloc, copy, stream)"),
            }
        }
        Ok(plan)
    }

    /// Counts one operation of a category; true when this one must fail.
    fn trips(&self, ops: &AtomicU64, every: &AtomicU64) -> bool {
        let n = ops.fetch_add(1, Ordering::SeqCst) + 1;
        let k = every.load(Ordering::SeqCst);
        let fails = k != 0 && n % k == 0;
        if fails {
            self.injected.fetch_add(1, Ordering::SeqCst);
        }
        fails
    }

    fn alloc_fault(&self, what: &str, bytes: u64) -> Result<()> {
        if self.trips(&self.alloc_ops, &self.alloc_every) {
            fail!(KMM_ERROR_OUT_OF_MEMORY, "injected fault: {what} of {bytes} bytes failed");
        }
        Ok(())
    }

    fn copy_fault(&self, what: &str) -> Result<()> {
        if self.trips(&self.copy_ops, &self.copy_every) {
            fail!(KMM_ERROR_BACKEND, "injected fault: {what} failed");
        }
        Ok(())
    }

    fn stream_fault(&self, what: &str) -> Result<()> {
        if self.trips(&self.stream_ops, &self.stream_every) {
            fail!(KMM_ERROR_BACKEND, "injected fault: {what} failed");
        }
        Ok(())
    }
}

fn installed() -> &'static Mutex<Option<Arc<FaultPlan>>> {
    static PLAN: OnceLock<Mutex<Option<Arc<FaultPlan>>>> = OnceLock::new();
    PLAN.get_or_init(|| {
        let from_env = std::env::var("KMM_FAULTS").ok().filter(|s| !s.is_empty()).map(|s| FaultPlan::parse(&s));
        Mutex::new(match from_env {
            Some(Ok(plan)) => Some(plan),
            Some(Err(e)) => {
                eprintln!("kmm: ignoring {}", e.message);
                None
            }
            None => None,
        })
    })
}

/// Installs `plan` for managers created from now on (`None` removes it; managers already
/// created keep theirs). Process-wide: tests that install plans must not run concurrently with
/// tests that expect a clean backend.
pub fn install(plan: Option<Arc<FaultPlan>>) {
    *lock(installed()) = plan;
}

/// The backend `open` returns: wrapped when a plan is installed.
pub fn wrap_if_planned(backend: Arc<dyn Backend>) -> Arc<dyn Backend> {
    match lock(installed()).clone() {
        Some(plan) => Arc::new(FaultyBackend { inner: backend, plan }),
        None => backend,
    }
}

pub struct FaultyBackend {
    inner: Arc<dyn Backend>,
    plan: Arc<FaultPlan>,
}

impl FaultyBackend {
    pub fn new(inner: Arc<dyn Backend>, plan: Arc<FaultPlan>) -> Self {
        FaultyBackend { inner, plan }
    }
}

impl Backend for FaultyBackend {
    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }
    fn device(&self) -> i32 {
        self.inner.device()
    }
    fn device_name(&self) -> String {
        format!("{} (fault injection)", self.inner.device_name())
    }
    fn memory_info(&self) -> Result<(u64, u64)> {
        self.inner.memory_info()
    }
    fn alloc_device(&self, bytes: u64) -> Result<DevicePtr> {
        self.plan.alloc_fault("alloc_device", bytes)?;
        let ptr = self.inner.alloc_device(bytes)?;
        lock(&self.plan.live).insert(ptr, bytes);
        Ok(ptr)
    }
    unsafe fn free_device(&self, ptr: DevicePtr) -> Result<()> {
        // Frees never fail here: a failed free would leak, and CUDA's cannot fail for valid input.
        self.inner.free_device(ptr)?;
        lock(&self.plan.live).remove(&ptr);
        Ok(())
    }
    fn alloc_pinned(&self, bytes: u64) -> Result<*mut u8> {
        self.plan.alloc_fault("alloc_pinned", bytes)?;
        let ptr = self.inner.alloc_pinned(bytes)?;
        lock(&self.plan.live).insert(ptr as u64, bytes);
        Ok(ptr)
    }
    unsafe fn free_pinned(&self, ptr: *mut u8) -> Result<()> {
        self.inner.free_pinned(ptr)?;
        lock(&self.plan.live).remove(&(ptr as u64));
        Ok(())
    }
    unsafe fn register_host(&self, ptr: *mut u8, bytes: u64) -> Result<()> {
        self.inner.register_host(ptr, bytes)
    }
    unsafe fn unregister_host(&self, ptr: *mut u8) -> Result<()> {
        self.inner.unregister_host(ptr)
    }
    fn is_pinned_host(&self, ptr: *const u8, bytes: u64) -> bool {
        self.inner.is_pinned_host(ptr, bytes)
    }
    fn create_stream(&self) -> Result<Arc<dyn Stream>> {
        self.plan.stream_fault("create_stream")?;
        Ok(Arc::new(FaultyStream { inner: self.inner.create_stream()?, plan: self.plan.clone() }))
    }
    fn create_event(&self) -> Result<Box<dyn Event>> {
        // Events are not wrapped: backends downcast them to their own type.
        self.plan.stream_fault("create_event")?;
        self.inner.create_event()
    }
    fn order_streams(&self, earlier: u64, later: u64) -> Result<()> {
        if earlier != later {
            self.plan.stream_fault("order_streams")?;
        }
        self.inner.order_streams(earlier, later)
    }
    fn check_stream(&self, raw: u64) -> Result<()> {
        self.inner.check_stream(raw)
    }
    fn ipc_handle(&self, addr: DevicePtr) -> Result<([u8; 64], u64)> {
        self.inner.ipc_handle(addr)
    }
    fn create_async_pool(&self, release_threshold: u64, max_size: u64) -> Result<Box<dyn AsyncPool>> {
        Ok(Box::new(FaultyPool { inner: self.inner.create_async_pool(release_threshold, max_size)?, plan: self.plan.clone() }))
    }
    fn peer_access(&self, peer: &dyn Backend) -> Result<bool> {
        self.inner.peer_access(peer)
    }
    fn raw_context(&self) -> u64 {
        self.inner.raw_context()
    }
}

pub struct FaultyStream {
    inner: Arc<dyn Stream>,
    plan: Arc<FaultPlan>,
}

impl Stream for FaultyStream {
    fn raw(&self) -> u64 {
        self.inner.raw()
    }
    unsafe fn copy_h2d(&self, dst: DevicePtr, src: *const u8, bytes: u64) -> Result<()> {
        self.plan.copy_fault("copy_h2d")?;
        self.inner.copy_h2d(dst, src, bytes)
    }
    unsafe fn copy_d2h(&self, dst: *mut u8, src: DevicePtr, bytes: u64) -> Result<()> {
        self.plan.copy_fault("copy_d2h")?;
        self.inner.copy_d2h(dst, src, bytes)
    }
    unsafe fn copy_d2d(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> Result<()> {
        self.plan.copy_fault("copy_d2d")?;
        self.inner.copy_d2d(dst, src, bytes)
    }
    unsafe fn copy_peer(&self, dst: DevicePtr, src: DevicePtr, src_context: u64, bytes: u64) -> Result<()> {
        self.plan.copy_fault("copy_peer")?;
        self.inner.copy_peer(dst, src, src_context, bytes)
    }
    unsafe fn memset(&self, dst: DevicePtr, value: u32, width: u32, count: u64) -> Result<()> {
        self.plan.copy_fault("memset")?;
        self.inner.memset(dst, value, width, count)
    }
    fn record(&self, event: &dyn Event) -> Result<()> {
        self.plan.stream_fault("record")?;
        self.inner.record(event)
    }
    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        self.plan.stream_fault("wait_event")?;
        self.inner.wait_event(event)
    }
    fn wait_raw_stream(&self, foreign: u64) -> Result<()> {
        self.plan.stream_fault("wait_raw_stream")?;
        self.inner.wait_raw_stream(foreign)
    }
    fn signal_raw_stream(&self, foreign: u64) -> Result<()> {
        self.plan.stream_fault("signal_raw_stream")?;
        self.inner.signal_raw_stream(foreign)
    }
    fn synchronize(&self) -> Result<()> {
        self.plan.stream_fault("synchronize")?;
        self.inner.synchronize()
    }
    fn launch_host_fn(&self, f: Box<dyn FnOnce() + Send>) -> Result<()> {
        self.plan.stream_fault("launch_host_fn")?;
        self.inner.launch_host_fn(f)
    }
}

/// The stream-ordered pool: its allocations fail with the plan's allocation period.
pub struct FaultyPool {
    inner: Box<dyn AsyncPool>,
    plan: Arc<FaultPlan>,
}

impl AsyncPool for FaultyPool {
    fn alloc(&self, bytes: u64, stream: &dyn Stream) -> Result<DevicePtr> {
        self.plan.alloc_fault("async pool alloc", bytes)?;
        self.inner.alloc(bytes, stream)
    }
    unsafe fn free(&self, ptr: DevicePtr, stream: &dyn Stream) -> Result<()> {
        self.inner.free(ptr, stream)
    }
    fn reserved(&self) -> Result<(u64, u64)> {
        self.inner.reserved()
    }
    fn trim(&self, keep_bytes: u64) -> Result<()> {
        self.inner.trim(keep_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kth_operation_fails_and_clear_stops_it() {
        let plan = FaultPlan::new();
        plan.set(3, 0, 0);
        let fails: Vec<bool> = (0..6).map(|_| plan.alloc_fault("x", 1).is_err()).collect();
        assert_eq!(fails, [false, false, true, false, false, true]);
        plan.clear();
        assert!((0..10).all(|_| plan.alloc_fault("x", 1).is_ok()));
        assert_eq!(plan.counts().injected, 2);
    }

    #[test]
    fn env_spec_parses() {
        let plan = FaultPlan::parse("alloc=5, copy=7,stream=0").unwrap();
        assert_eq!(plan.alloc_every.load(Ordering::SeqCst), 5);
        assert_eq!(plan.copy_every.load(Ordering::SeqCst), 7);
        assert!(FaultPlan::parse("bogus=1").is_err());
        assert!(FaultPlan::parse("alloc=x").is_err());
    }
}
