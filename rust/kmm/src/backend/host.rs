//! The host backend: device memory is host memory, but stream semantics are kept. Work queued on
//! a stream runs later, in order, on the stream's worker thread, so an ordering bug (reusing a
//! block before the copy that reads it has run) shows up as wrong data, as it would on a GPU.

use super::{AsyncPool, Backend, BackendKind, DevicePtr, Event, PinnedRanges, Stream};
use crate::error::{lock, Result};
use crate::fail;
use std::alloc::Layout;
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;

/// At most this many host "devices" (`KMM_HOST_DEVICES`).
const MAX_HOST_DEVICES: u32 = 64;

/// How many host "devices" exist: `KMM_HOST_DEVICES` (1 to 64, default 1), read once, so that
/// every multi-device path (copies between devices, managers on each, scale-out over workers)
/// runs on a CPU. Devices pair up as GPUs on NVLink do: 0 and 1, 2 and 3, ... copy peer to
/// peer; copies between pairs are staged through pinned host memory.
/// Whether two host devices copy "peer to peer": different devices of one pair.
pub fn paired(a: i32, b: i32) -> bool {
    a != b && a / 2 == b / 2
}

pub fn device_count() -> Result<u32> {
    static COUNT: OnceLock<std::result::Result<u32, String>> = OnceLock::new();
    let count = COUNT.get_or_init(|| match std::env::var("KMM_HOST_DEVICES") {
        Err(_) => Ok(1),
        Ok(v) if v.trim().is_empty() => Ok(1),
        Ok(v) => match v.trim().parse::<u32>() {
            Ok(n) if (1..=MAX_HOST_DEVICES).contains(&n) => Ok(n),
            _ => Err(format!("KMM_HOST_DEVICES={v:?} is not a device count in 1..{MAX_HOST_DEVICES}")),
        },
    });
    match count {
        Ok(n) => Ok(*n),
        Err(message) => fail!(KMM_ERROR_INVALID_ARGUMENT, "{message}"),
    }
}

pub struct HostBackend {
    device: i32,
    /// Every live allocation and its layout: device and pinned alike.
    layouts: Mutex<HashMap<u64, Layout>>,
    pinned_ranges: PinnedRanges,
}

impl HostBackend {
    pub fn get(device: i32) -> Result<Arc<dyn Backend>> {
        static DEVICES: OnceLock<Vec<Arc<HostBackend>>> = OnceLock::new();
        let count = device_count()?;
        let devices = DEVICES.get_or_init(|| {
            (0..count as i32)
                .map(|device| {
                    Arc::new(HostBackend {
                        device,
                        layouts: Mutex::new(HashMap::new()),
                        pinned_ranges: PinnedRanges::default(),
                    })
                })
                .collect()
        });
        match usize::try_from(device).ok().and_then(|d| devices.get(d)) {
            Some(b) => Ok(b.clone()),
            None => fail!(
                KMM_ERROR_BACKEND_UNAVAILABLE,
                "device {device} does not exist on the host backend: {count} device(s), numbered 0 to {} (set KMM_HOST_DEVICES for more)", count.saturating_sub(1)
            ),
        }
    }

    fn alloc_raw(&self, bytes: u64) -> Result<u64> {
        let layout = host_layout(bytes, if bytes >= 1 << 20 { 4096 } else { 256 })?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            fail!(KMM_ERROR_OUT_OF_MEMORY, "host backend: allocation of {bytes} bytes failed");
        }
        lock(&self.layouts).insert(ptr as u64, layout);
        Ok(ptr as u64)
    }

    /// Frees memory from `alloc_raw`; memory adopted from elsewhere came from malloc.
    unsafe fn free_raw(&self, ptr: u64) {
        match lock(&self.layouts).remove(&ptr) {
            Some(layout) => std::alloc::dealloc(ptr as *mut u8, layout),
            None => libc::free(ptr as *mut libc::c_void),
        }
    }
}

/// The layout of a host allocation standing in for device memory. As a device refuses more than
/// its memory, so does the stand-in: a request past the machine's RAM and swap is out of memory
/// before malloc is asked (which may overcommit, and under AddressSanitizer warns at every
/// refusal: hundreds of lines in CI's log).
fn host_layout(bytes: u64, align: usize) -> Result<Layout> {
    let capacity = machine_capacity();
    if bytes > capacity {
        fail!(KMM_ERROR_OUT_OF_MEMORY, "host backend cannot allocate {bytes} bytes: the machine has {capacity} bytes of RAM and swap");
    }
    match usize::try_from(bytes).ok().and_then(|b| Layout::from_size_align(b.max(1), align).ok()) {
        Some(l) => Ok(l),
        None => fail!(KMM_ERROR_OUT_OF_MEMORY, "host backend cannot allocate {bytes} bytes"),
    }
}

/// This machine's RAM plus swap in bytes (u64::MAX when sysinfo fails: no bound then).
fn machine_capacity() -> u64 {
    static CAPACITY: OnceLock<u64> = OnceLock::new();
    *CAPACITY.get_or_init(|| {
        sysinfo().map_or(u64::MAX, |i| (i.totalram as u64).saturating_add(i.totalswap as u64).saturating_mul(i.mem_unit as u64))
    })
}

fn sysinfo() -> Option<libc::sysinfo> {
    // SAFETY: sysinfo fills the struct it is given.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    (unsafe { libc::sysinfo(&mut info) } == 0).then_some(info)
}

impl Backend for HostBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Host
    }
    fn device(&self) -> i32 {
        self.device
    }
    fn device_name(&self) -> String {
        format!("host stand-in device {}", self.device)
    }
    fn memory_info(&self) -> Result<(u64, u64)> {
        let Some(info) = sysinfo() else {
            fail!(KMM_ERROR_BACKEND, "sysinfo failed");
        };
        let unit = info.mem_unit as u64;
        Ok((info.freeram as u64 * unit, info.totalram as u64 * unit))
    }
    fn alloc_device(&self, bytes: u64) -> Result<DevicePtr> {
        self.alloc_raw(bytes)
    }
    unsafe fn free_device(&self, ptr: DevicePtr) -> Result<()> {
        self.free_raw(ptr);
        Ok(())
    }
    fn alloc_pinned(&self, bytes: u64) -> Result<*mut u8> {
        let ptr = self.alloc_raw(bytes)?;
        self.pinned_ranges.insert(ptr, bytes);
        Ok(ptr as *mut u8)
    }
    unsafe fn free_pinned(&self, ptr: *mut u8) -> Result<()> {
        self.pinned_ranges.remove(ptr as u64);
        self.free_raw(ptr as u64);
        Ok(())
    }
    unsafe fn register_host(&self, ptr: *mut u8, bytes: u64) -> Result<()> {
        if !self.pinned_ranges.insert(ptr as u64, bytes) {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "host memory at {ptr:?} ({bytes} bytes) overlaps a registered range");
        }
        Ok(())
    }
    unsafe fn unregister_host(&self, ptr: *mut u8) -> Result<()> {
        if self.pinned_ranges.remove(ptr as u64).is_none() {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "host memory at {ptr:?} was not registered");
        }
        Ok(())
    }
    fn is_pinned_host(&self, ptr: *const u8, bytes: u64) -> bool {
        self.pinned_ranges.contains(ptr as u64, bytes)
    }
    fn create_stream(&self) -> Result<Arc<dyn Stream>> {
        Ok(HostStream::new()?)
    }
    fn create_event(&self) -> Result<Box<dyn Event>> {
        Ok(Box::new(HostEvent::default()))
    }
    fn order_streams(&self, earlier: u64, later: u64) -> Result<()> {
        if earlier == later {
            return Ok(());
        }
        HostStream::find(later)?.wait_for_work_of(earlier)
    }
    fn check_stream(&self, raw: u64) -> Result<()> {
        HostStream::find(raw).map(drop)
    }
    fn stream_ended(&self, raw: u64) -> bool {
        (FIRST_STREAM_ID..NEXT_STREAM_ID.load(Ordering::Relaxed)).contains(&raw)
            && !matches!(HostStream::lookup(raw), Some(Found::Live(_)))
    }
    fn create_async_pool(&self, release_threshold: u64, max_size: u64) -> Result<Box<dyn AsyncPool>> {
        Ok(Box::new(HostAsyncPool {
            inner: Arc::new(Mutex::new(AsyncPoolState::default())),
            release_threshold,
            max_size,
        }))
    }
    fn peer_access(&self, peer: &dyn Backend) -> Result<bool> {
        Ok(peer.kind() == BackendKind::Host && paired(self.device, peer.device()))
    }
}

type Work = Box<dyn FnOnce() + Send>;

/// A stream: a FIFO of closures run by one worker thread.
pub struct HostStream {
    id: u64,
    queue: Mutex<Option<Sender<Work>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// The process generation (see `fork_generation`) the worker thread runs in.
    generation: u64,
}

/// How many times this process is a forked child of a process that had host streams: a child
/// has none of its parent's threads, so a stream of an earlier generation can run no work (a
/// wait for it would never end). Such streams refuse work with an error instead, as a CUDA
/// context refuses to be used after a fork.
static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);

fn fork_generation() -> u64 {
    static WATCH: std::sync::Once = std::sync::Once::new();
    extern "C" fn in_child() {
        FORK_GENERATION.fetch_add(1, Ordering::Relaxed);
    }
    // SAFETY: registers a handler that only increments an atomic (async-signal-safe).
    WATCH.call_once(|| unsafe {
        libc::pthread_atfork(None, None, Some(in_child));
    });
    FORK_GENERATION.load(Ordering::Relaxed)
}

/// What the registry knows of a stream id.
enum Known {
    Live(Weak<HostStream>),
    /// The stream's last reference is gone, but its worker may still be running the work queued
    /// on it: the event completes after that work. Kept until it has.
    Retired(HostEvent),
}

/// A stream found by its raw id.
enum Found {
    Live(Arc<HostStream>),
    Retired(HostEvent),
}

fn stream_registry() -> &'static Mutex<HashMap<u64, Known>> {
    static REGISTRY: OnceLock<Mutex<HashMap<u64, Known>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Raw ids start high so a small integer passed by mistake is not taken for a stream.
const FIRST_STREAM_ID: u64 = 0x5000_0001;
static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(FIRST_STREAM_ID);

impl HostStream {
    fn new() -> Result<Arc<HostStream>> {
        let (tx, rx) = channel::<Work>();
        let id = NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed);
        let worker = std::thread::Builder::new()
            .name(format!("kmm-host-stream-{id:x}"))
            .spawn(move || {
                for work in rx {
                    work();
                }
            })
            .map_err(|e| crate::err!(KMM_ERROR_BACKEND, "cannot start a host stream thread: {e}"))?;
        let generation = fork_generation();
        let stream = Arc::new(HostStream { id, queue: Mutex::new(Some(tx)), worker: Mutex::new(Some(worker)), generation });
        lock(stream_registry()).insert(id, Known::Live(Arc::downgrade(&stream)));
        Ok(stream)
    }

    /// Whether this stream's worker runs in this process (not in the parent of a fork).
    fn runs_here(&self) -> bool {
        self.generation == FORK_GENERATION.load(Ordering::Relaxed)
    }

    /// An error unless this stream's worker runs in this process.
    fn check_runs_here(&self) -> Result<()> {
        if !self.runs_here() {
            fail!(
                KMM_ERROR_BACKEND,
                "host stream {:#x} belongs to the process this one was forked from: its worker thread does not run here (make a new manager in the child)",
                self.id
            );
        }
        Ok(())
    }

    fn enqueue(&self, work: Work) -> Result<()> {
        self.check_runs_here()?;
        match lock(&self.queue).as_ref() {
            Some(tx) if tx.send(work).is_ok() => Ok(()),
            _ => fail!(KMM_ERROR_BACKEND, "host stream {:#x} has stopped", self.id),
        }
    }

    /// The stream `raw` names, live or retired; `None` for an id that never named a stream or
    /// whose retired stream's work has all run.
    fn lookup(raw: u64) -> Option<Found> {
        loop {
            let registry = lock(stream_registry());
            match registry.get(&raw)? {
                Known::Retired(last) => return Some(Found::Retired(last.clone())),
                Known::Live(weak) => match weak.upgrade() {
                    Some(s) => return Some(Found::Live(s)),
                    // Its last reference is being dropped; `drop` retires it at once.
                    None => drop(registry),
                },
            }
            std::thread::yield_now();
        }
    }

    fn find(raw: u64) -> Result<Arc<HostStream>> {
        match Self::lookup(raw) {
            Some(Found::Live(s)) => Ok(s),
            _ => fail!(KMM_ERROR_INVALID_ARGUMENT, "stream {raw:#x} is not a live host-backend stream"),
        }
    }

    /// This stream waits for the work queued so far on the stream `earlier`, also when that
    /// stream is retired and its worker still runs what was queued on it.
    fn wait_for_work_of(&self, earlier: u64) -> Result<()> {
        match Self::lookup(earlier) {
            Some(Found::Live(s)) => {
                let ev = HostEvent::default();
                s.record(&ev)?;
                self.wait_event(&ev)
            }
            Some(Found::Retired(last)) => self.wait_event(&last),
            None => Ok(()),
        }
    }
}

impl Drop for HostStream {
    fn drop(&mut self) {
        // The worker may run queued work after this (it may even be the thread dropping the
        // last reference): the stream stays known, retired, until that work has run, so work
        // ordered after it still waits for it.
        let last = HostEvent::default();
        let retired = self.record(&last).is_ok();
        {
            let mut registry = lock(stream_registry());
            registry.retain(|_, known| !matches!(known, Known::Retired(e) if e.query().unwrap_or(false)));
            if retired {
                registry.insert(self.id, Known::Retired(last));
            } else {
                registry.remove(&self.id);
            }
        }
        lock(&self.queue).take();
        if let Some(worker) = lock(&self.worker).take() {
            // The last reference can be dropped by the worker itself (inside queued work); a
            // forked child has no worker to join.
            if worker.thread().id() != std::thread::current().id() && self.runs_here() {
                let _ = worker.join();
            }
        }
    }
}

/// Raw pointers moved into queued work. The caller of the unsafe copy functions guarantees the
/// memory stays valid until the work has run.
#[derive(Clone, Copy)]
struct SendPtr(u64);
unsafe impl Send for SendPtr {}

impl Stream for HostStream {
    fn raw(&self) -> u64 {
        self.id
    }
    unsafe fn copy_h2d(&self, dst: DevicePtr, src: *const u8, bytes: u64) -> Result<()> {
        self.copy_d2d(dst, src as u64, bytes)
    }
    unsafe fn copy_d2h(&self, dst: *mut u8, src: DevicePtr, bytes: u64) -> Result<()> {
        self.copy_d2d(dst as u64, src, bytes)
    }
    unsafe fn copy_d2d(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> Result<()> {
        let (d, s) = (SendPtr(dst), SendPtr(src));
        self.enqueue(Box::new(move || {
            let (d, s) = (d, s);
            // SAFETY: guaranteed by the caller; ranges may overlap within one buffer.
            unsafe { std::ptr::copy(s.0 as *const u8, d.0 as *mut u8, bytes as usize) }
        }))
    }
    unsafe fn copy_peer(&self, dst: DevicePtr, src: DevicePtr, _src_context: u64, bytes: u64) -> Result<()> {
        self.copy_d2d(dst, src, bytes)
    }
    unsafe fn memset(&self, dst: DevicePtr, value: u32, width: u32, count: u64) -> Result<()> {
        let d = SendPtr(dst);
        self.enqueue(Box::new(move || {
            let d = d;
            // SAFETY: guaranteed by the caller; fills are unaligned-safe byte by byte patterns.
            unsafe {
                let bytes = value.to_le_bytes();
                let pattern = &bytes[..width as usize];
                let out = std::slice::from_raw_parts_mut(d.0 as *mut u8, (count * width as u64) as usize);
                if width == 1 {
                    out.fill(pattern[0]);
                } else {
                    for elem in out.chunks_exact_mut(width as usize) {
                        elem.copy_from_slice(pattern);
                    }
                }
            }
        }))
    }
    fn record(&self, event: &dyn Event) -> Result<()> {
        let event = host_event(event)?;
        self.check_runs_here()?;
        let target = {
            let mut st = lock(&event.0.state);
            st.recorded += 1;
            st.generation = self.generation;
            st.recorded
        };
        let inner = event.0.clone();
        self.enqueue(Box::new(move || inner.complete(target)))
    }
    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        let event = host_event(event)?;
        let target = lock(&event.0.state).recorded;
        let inner = event.0.clone();
        self.enqueue(Box::new(move || {
            inner.wait_for(target);
        }))
    }
    fn wait_raw_stream(&self, foreign: u64) -> Result<()> {
        if foreign == self.id {
            return Ok(());
        }
        HostStream::find(foreign)?;
        self.wait_for_work_of(foreign)
    }
    fn signal_raw_stream(&self, foreign: u64) -> Result<()> {
        if foreign == self.id {
            return Ok(());
        }
        let ev = HostEvent::default();
        self.record(&ev)?;
        HostStream::find(foreign)?.wait_event(&ev)
    }
    fn synchronize(&self) -> Result<()> {
        let ev = HostEvent::default();
        self.record(&ev)?;
        ev.synchronize()
    }
    fn launch_host_fn(&self, f: Box<dyn FnOnce() + Send>) -> Result<()> {
        self.enqueue(f)
    }
}

#[derive(Default)]
struct EventState {
    recorded: u64,
    completed: u64,
    /// The process generation of the latest record: its work runs only there.
    generation: u64,
}

#[derive(Default)]
struct EventInner {
    state: Mutex<EventState>,
    done: Condvar,
}

impl EventInner {
    fn complete(&self, target: u64) {
        let mut st = lock(&self.state);
        st.completed = st.completed.max(target);
        self.done.notify_all();
    }
    /// Waits until the work before the `target`th record has run; false (at once) when that
    /// work was queued in the parent of a fork and can never run here.
    fn wait_for(&self, target: u64) -> bool {
        let mut st = lock(&self.state);
        while st.completed < target {
            if st.generation != FORK_GENERATION.load(Ordering::Relaxed) {
                return false;
            }
            st = self.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        true
    }
}

/// An event: complete once the work queued before its latest `record` has run.
/// Clones share one event.
#[derive(Default, Clone)]
pub struct HostEvent(Arc<EventInner>);

fn host_event(event: &dyn Event) -> Result<&HostEvent> {
    match event.as_any().downcast_ref::<HostEvent>() {
        Some(e) => Ok(e),
        None => fail!(KMM_ERROR_INVALID_ARGUMENT, "event of another backend passed to the host backend"),
    }
}

impl Event for HostEvent {
    fn query(&self) -> Result<bool> {
        let st = lock(&self.0.state);
        if st.completed < st.recorded && st.generation != FORK_GENERATION.load(Ordering::Relaxed) {
            fail!(KMM_ERROR_BACKEND, "the event's work was queued in the process this one was forked from: it never runs here");
        }
        Ok(st.completed >= st.recorded)
    }
    fn synchronize(&self) -> Result<()> {
        let target = lock(&self.0.state).recorded;
        if !self.0.wait_for(target) {
            fail!(KMM_ERROR_BACKEND, "the event's work was queued in the process this one was forked from: it never runs here");
        }
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[derive(Default)]
struct AsyncPoolState {
    sizes: HashMap<u64, u64>,
    cached: HashMap<u64, Vec<u64>>,
    cached_bytes: u64,
    reserved: u64,
    high: u64,
}

/// Stand-in for `cuMemPool`: caches freed blocks by size, frees are stream-ordered, and cached
/// bytes above the release threshold go back at once.
pub struct HostAsyncPool {
    inner: Arc<Mutex<AsyncPoolState>>,
    release_threshold: u64,
    max_size: u64,
}

fn release_block(ptr: u64, size: u64) {
    let layout = Layout::from_size_align(size.max(1) as usize, 256).expect("layout was valid at allocation");
    // SAFETY: allocated below with this layout and no longer referenced.
    unsafe { std::alloc::dealloc(ptr as *mut u8, layout) }
}

impl AsyncPool for HostAsyncPool {
    fn alloc(&self, bytes: u64, _stream: &dyn Stream) -> Result<DevicePtr> {
        let mut st = lock(&self.inner);
        if let Some(ptr) = st.cached.get_mut(&bytes).and_then(Vec::pop) {
            st.cached_bytes -= bytes;
            return Ok(ptr);
        }
        if st.reserved.saturating_add(bytes) > self.max_size {
            // Give back cached blocks of other sizes before refusing.
            let cached: Vec<(u64, Vec<u64>)> = st.cached.drain().collect();
            for (size, ptrs) in cached {
                for p in ptrs {
                    st.sizes.remove(&p);
                    release_block(p, size);
                }
            }
            st.reserved -= st.cached_bytes;
            st.cached_bytes = 0;
            if st.reserved.saturating_add(bytes) > self.max_size {
                fail!(KMM_ERROR_OUT_OF_MEMORY, "async pool maximum size {} reached", self.max_size);
            }
        }
        let layout = host_layout(bytes, 256)?;
        // SAFETY: non-zero layout.
        let ptr = unsafe { std::alloc::alloc(layout) } as u64;
        if ptr == 0 {
            fail!(KMM_ERROR_OUT_OF_MEMORY, "host backend: allocation of {bytes} bytes failed");
        }
        st.sizes.insert(ptr, bytes);
        st.reserved += bytes;
        st.high = st.high.max(st.reserved);
        Ok(ptr)
    }
    unsafe fn free(&self, ptr: DevicePtr, stream: &dyn Stream) -> Result<()> {
        let inner = self.inner.clone();
        let threshold = self.release_threshold;
        stream.launch_host_fn(Box::new(move || {
            let mut st = lock(&inner);
            let Some(&size) = st.sizes.get(&ptr) else { return };
            if st.cached_bytes + size > threshold {
                st.sizes.remove(&ptr);
                st.reserved -= size;
                release_block(ptr, size);
            } else {
                st.cached_bytes += size;
                st.cached.entry(size).or_default().push(ptr);
            }
        }))
    }
    fn reserved(&self) -> Result<(u64, u64)> {
        let st = lock(&self.inner);
        Ok((st.reserved, st.high))
    }
    fn trim(&self, keep_bytes: u64) -> Result<()> {
        let mut st = lock(&self.inner);
        let sizes: Vec<u64> = st.cached.keys().copied().collect();
        for size in sizes {
            while st.reserved > keep_bytes {
                let Some(p) = st.cached.get_mut(&size).and_then(Vec::pop) else { break };
                st.sizes.remove(&p);
                st.cached_bytes -= size;
                st.reserved -= size;
                release_block(p, size);
            }
        }
        Ok(())
    }
}

impl Drop for HostAsyncPool {
    fn drop(&mut self) {
        let mut st = lock(&self.inner);
        let all: Vec<(u64, u64)> = st.sizes.drain().collect();
        for (p, size) in all {
            release_block(p, size);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    /// A request past the machine's memory is out of memory without asking malloc (whose
    /// refusals AddressSanitizer reports, one warning each).
    #[test]
    fn a_request_past_the_machines_memory_is_refused_before_malloc() {
        let backend = HostBackend::get(0).unwrap();
        let e = backend.alloc_device(machine_capacity().saturating_add(1).min(1 << 62)).unwrap_err();
        assert_eq!(e.status, crate::KmmStatus::KMM_ERROR_OUT_OF_MEMORY);
        assert!(e.message.contains("RAM and swap"), "{}", e.message);
    }

    /// A stream whose last reference is dropped while its worker still runs queued work is not
    /// done: work ordered after it (a free recorded on it) must still wait for that work.
    #[test]
    fn a_dropped_stream_with_queued_work_is_waited_for() {
        let backend = HostBackend::get(0).unwrap();
        let (earlier, later) = (backend.create_stream().unwrap(), backend.create_stream().unwrap());
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        earlier
            .launch_host_fn(Box::new(move || {
                std::thread::sleep(Duration::from_millis(300));
                r.store(true, Ordering::SeqCst);
            }))
            .unwrap();
        let raw = earlier.raw();
        // The drop joins the worker, so it returns only after the sleep; order meanwhile.
        let dropper = std::thread::spawn(move || drop(earlier));
        std::thread::sleep(Duration::from_millis(100));
        backend.order_streams(raw, later.raw()).unwrap();
        later.synchronize().unwrap();
        assert!(ran.load(Ordering::SeqCst), "work ordered after a dropped stream ran before that stream's queued work");
        dropper.join().unwrap();
        // Once its work has run, the retired stream is forgotten at the next retirement.
        drop(backend.create_stream().unwrap());
        assert!(!lock(stream_registry()).contains_key(&raw), "a retired stream whose work has run is still known");
    }
}
