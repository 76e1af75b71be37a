//! Copies and fills. Everything is queued on the manager's stream; synchronous variants wait
//! for it. A buffer is pinned while a copy looks it up and queues work, so a concurrent free
//! cannot recycle it in between. Pageable host memory above a small size is staged.

use super::staging::parallel_copy;
use super::{Manager, MemoryKind};
use crate::error::{lock, Result};
use crate::fail;

/// Up to this size, pageable memory goes to the driver directly: staging would cost more than
/// it saves.
const DIRECT_PAGEABLE_MAX: u64 = 256 << 10;
/// Patterns are expanded on the host to this many bytes before doubling on the device.
const FILL_SEED_BYTES: u64 = 64 << 10;

/// Keeps a buffer pinned while a copy is being queued (a free meanwhile waits for its end).
struct Lease<'a> {
    manager: &'a Manager,
    handle: u64,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let _ = self.manager.state_of(self.handle).end_lease(self.handle, false);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// Return once the copy has run.
    Wait,
    /// Return at once with an event that completes when the copy has run.
    Event,
    /// Return at once; the caller orders later work through the stream or `synchronize`.
    Queue,
}

impl Manager {
    /// Pins the buffer (restoring it first when it is spilled) for a copy of `bytes` at `offset`.
    /// `arg` is the buffer's argument name in the call ("dst", "src", "buffer"), for messages.
    fn lease(&self, handle: u64, offset: u64, bytes: u64, arg: &str) -> Result<(Lease<'_>, u64, MemoryKind)> {
        let home = self.raw_stream();
        let (addr, kind) = self.resident(handle, |st| {
            let r = st.buffers.get_mut(handle)?;
            match offset.checked_add(bytes) {
                Some(end) if end <= r.bytes => {}
                _ => {
                    // The arguments' names: `dst_offset` of the dst buffer, `src_offset` of the src
                    // buffer; `offset` of `buffer`.
                    let (offset_arg, of) =
                        if arg == "buffer" { ("offset".to_string(), "buffer".to_string()) } else { (format!("{arg}_offset"), format!("{arg} buffer")) };
                    fail!(KMM_ERROR_OUT_OF_RANGE, "{offset_arg} = {offset} + bytes = {bytes} exceeds the {of}'s size of {} bytes", r.bytes)
                }
            }
            if r.is_spilled() {
                return Ok(None);
            }
            r.pins += 1;
            r.leases += 1;
            r.last_use = st.spill.tick();
            // Kmm's own work on the manager's stream: the buffer's free waits for it.
            r.users.insert(home);
            Ok(Some((r.addr + offset, r.kind)))
        })
        .map_err(|e| match e.status {
            // A copy has two buffers: say which one is not live here.
            crate::KmmStatus::KMM_ERROR_INVALID_HANDLE if arg != "buffer" => crate::error::Error::new(e.status, format!("{arg}: {}", e.message)),
            _ => e,
        })?;
        Ok((Lease { manager: self, handle }, addr, kind))
    }

    fn complete(&self, completion: Completion) -> Result<Option<u64>> {
        match completion {
            Completion::Wait => match self.stream.synchronize() {
                Ok(()) => Ok(None),
                Err(e) => {
                    // The copy may still be queued and use the caller's memory, which is valid
                    // only during this call: wait again before reporting the failure.
                    for _ in 0..3 {
                        if self.stream.synchronize().is_ok() {
                            break;
                        }
                    }
                    Err(e)
                }
            },
            Completion::Event => self.record_event().map(Some),
            Completion::Queue => Ok(None),
        }
    }

    fn goes_direct(&self, host: *const u8, bytes: u64) -> bool {
        bytes <= DIRECT_PAGEABLE_MAX || self.backend.is_pinned_host(host, bytes)
    }

    /// Host to device (or into a pinned buffer). With `Completion::Event`, `src` must stay
    /// valid until the returned event completes.
    ///
    /// # Safety
    /// `src` is valid for `bytes` bytes.
    pub unsafe fn copy_to_device(
        &self,
        dst: u64,
        dst_offset: u64,
        src: *const u8,
        bytes: u64,
        completion: Completion,
    ) -> Result<Option<u64>> {
        if src.is_null() && bytes > 0 {
            fail!(KMM_ERROR_NULL_POINTER, "src is NULL but bytes = {bytes}");
        }
        let (_lease, addr, _) = self.lease(dst, dst_offset, bytes, "dst")?;
        if bytes > 0 {
            if self.goes_direct(src, bytes) {
                self.stream.copy_h2d(addr, src, bytes)?;
            } else {
                let mut staging = lock(&self.staging);
                let slot = staging.slot_bytes();
                let mut off = 0;
                while off < bytes {
                    let len = slot.min(bytes - off);
                    let block = staging.acquire(len)?;
                    parallel_copy(block.addr as *mut u8, src.add(off as usize), len as usize);
                    if let Err(e) = self.stream.copy_h2d(addr + off, block.addr as *const u8, len) {
                        staging.abandon(block);
                        return Err(e);
                    }
                    staging.submit(self.stream.as_ref(), block, None)?;
                    off += len;
                }
            }
        }
        self.complete(completion)
    }

    /// Device (or pinned buffer) to host. With `Completion::Event`, `dst` must stay valid and
    /// untouched until the returned event completes.
    ///
    /// # Safety
    /// `dst` is valid for `bytes` bytes.
    pub unsafe fn copy_to_host(
        &self,
        dst: *mut u8,
        src: u64,
        src_offset: u64,
        bytes: u64,
        completion: Completion,
    ) -> Result<Option<u64>> {
        if dst.is_null() && bytes > 0 {
            fail!(KMM_ERROR_NULL_POINTER, "dst is NULL but bytes = {bytes}");
        }
        let (_lease, addr, _) = self.lease(src, src_offset, bytes, "src")?;
        if bytes > 0 {
            if self.goes_direct(dst, bytes) {
                self.stream.copy_d2h(dst, addr, bytes)?;
            } else {
                let mut staging = lock(&self.staging);
                let slot = staging.slot_bytes();
                let stage_out = |staging: &mut super::staging::Staging| -> Result<()> {
                    let mut off = 0;
                    while off < bytes {
                        let len = slot.min(bytes - off);
                        let block = staging.acquire(len)?;
                        if let Err(e) = self.stream.copy_d2h(block.addr as *mut u8, addr + off, len) {
                            staging.abandon(block);
                            return Err(e);
                        }
                        let out = dst as u64 + off;
                        if completion == Completion::Wait {
                            staging.submit(self.stream.as_ref(), block, Some((out, len)))?;
                        } else {
                            let from = block.addr;
                            let queued = self.stream.launch_host_fn(Box::new(move || {
                                // SAFETY: the caller keeps `dst` valid until the event completes.
                                unsafe { parallel_copy(out as *mut u8, from as *const u8, len as usize) }
                            }));
                            // The copy into the slot is queued either way: release it in order.
                            staging.submit(self.stream.as_ref(), block, None)?;
                            queued?;
                        }
                        off += len;
                    }
                    Ok(())
                };
                let queued = stage_out(&mut staging);
                if completion == Completion::Wait {
                    // Retiring a slot copies it into `dst`, which is only valid during this call:
                    // every slot retires before returning, on error too.
                    let retired = staging.retire_all();
                    queued?;
                    retired?;
                } else {
                    queued?;
                }
            }
        }
        self.complete(completion)
    }

    /// Fills `bytes` bytes at `offset` with copies of `pattern` (1 to 4096 bytes). Queued on the
    /// stream: later work sees the filled bytes.
    pub fn fill(&self, handle: u64, offset: u64, bytes: u64, pattern: &[u8]) -> Result<()> {
        let width = pattern.len() as u64;
        if width == 0 || width > 4096 {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "pattern_size = {width} must be in 1..=4096");
        }
        if bytes % width != 0 {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "bytes = {bytes} is not a multiple of pattern_size = {width}");
        }
        let (_lease, addr, _) = self.lease(handle, offset, bytes, "buffer")?;
        if bytes == 0 {
            return Ok(());
        }
        if matches!(width, 1 | 2 | 4) && addr % width == 0 {
            let mut value = [0u8; 4];
            value[..width as usize].copy_from_slice(pattern);
            // SAFETY: the leased range is live and in bounds.
            return unsafe { self.stream.memset(addr, u32::from_le_bytes(value), width as u32, bytes / width) };
        }
        // Expand the pattern on the host, copy it once, then double it on the device.
        // The seed must fit one staging slot (as small as 4 KiB, never below the 4 KiB pattern).
        let mut staging = lock(&self.staging);
        let seed = bytes.min((FILL_SEED_BYTES.min(staging.slot_bytes()) / width).max(1) * width);
        let block = staging.acquire(seed)?;
        // SAFETY: the staging slot holds at least `seed` bytes and is ours until submitted.
        unsafe {
            let out = std::slice::from_raw_parts_mut(block.addr as *mut u8, seed as usize);
            for chunk in out.chunks_exact_mut(width as usize) {
                chunk.copy_from_slice(pattern);
            }
            if let Err(e) = self.stream.copy_h2d(addr, block.addr as *const u8, seed) {
                staging.abandon(block);
                return Err(e);
            }
        }
        staging.submit(self.stream.as_ref(), block, None)?;
        drop(staging);
        let mut filled = seed;
        while filled < bytes {
            let n = filled.min(bytes - filled);
            // SAFETY: both ranges lie inside the leased range and do not overlap.
            unsafe { self.stream.copy_d2d(addr + filled, addr, n)? };
            filled += n;
        }
        Ok(())
    }
}

/// Device to device, within one manager or between two (same backend kind; between devices see
/// `peer`). Queued on the destination manager's stream, ordered after the source's work so far, and the source's stream
/// waits for the copy, so a later free on either side cannot recycle memory the copy still reads.
pub fn copy_buffer(
    dst_manager: &Manager,
    dst: u64,
    dst_offset: u64,
    src_manager: &Manager,
    src: u64,
    src_offset: u64,
    bytes: u64,
) -> Result<()> {
    let same = std::ptr::eq(dst_manager, src_manager);
    if same && dst == src && bytes > 0 && dst_offset < src_offset.saturating_add(bytes) && src_offset < dst_offset.saturating_add(bytes) {
        fail!(
            KMM_ERROR_INVALID_ARGUMENT,
            "source range {src_offset}..{} and destination range {dst_offset}..{} of one buffer overlap",
            src_offset.saturating_add(bytes),
            dst_offset.saturating_add(bytes)
        );
    }
    if dst_manager.backend.kind() != src_manager.backend.kind() {
        return copy_across_backends(dst_manager, dst, dst_offset, src_manager, src, src_offset, bytes);
    }
    let (_dst_lease, dst_addr, dst_kind) = dst_manager.lease(dst, dst_offset, bytes, "dst")?;
    let (_src_lease, src_addr, src_kind) = src_manager.lease(src, src_offset, bytes, "src")?;
    if bytes == 0 {
        return Ok(());
    }
    let devices_differ = dst_manager.backend.device() != src_manager.backend.device();
    if devices_differ && dst_kind == MemoryKind::Device && src_kind == MemoryKind::Device {
        // SAFETY: both leased ranges are live and in bounds.
        return unsafe { super::peer::copy_between_devices(dst_manager, dst_addr, src_manager, src_addr, bytes) };
    }
    // A pinned buffer is host memory every device reaches, but device memory (that of a
    // stream-ordered pool above all) only from its own device's context: the copy runs on the
    // stream of the manager whose device memory it touches, the destination's when both are.
    let (run, other) = if devices_differ && src_kind == MemoryKind::Device { (src_manager, dst_manager) } else { (dst_manager, src_manager) };
    if !same {
        other.backend.order_streams(other.raw_stream(), run.raw_stream())?;
    }
    // SAFETY: both leased ranges are live and in bounds.
    unsafe { run.stream.copy_d2d(dst_addr, src_addr, bytes)? };
    if !same {
        order_after_copy(run, other)?;
    }
    Ok(())
}

/// `other`'s later work (a write, a free) waits for the copy just queued on `run`'s stream. If
/// that wait cannot be queued, the copy is waited for on the host before the error returns: an
/// error must not leave a copy in flight that nothing orders.
pub(super) fn order_after_copy(run: &Manager, other: &Manager) -> Result<()> {
    run.backend.order_streams(run.raw_stream(), other.raw_stream()).or_else(|e| {
        for _ in 0..3 {
            if run.stream.synchronize().is_ok() {
                break;
            }
        }
        Err(e)
    })
}

/// Between a host-backend and a CUDA manager no stream can wait for the other: go through host
/// memory in pieces, synchronously. Both ranges are checked before any byte moves.
fn copy_across_backends(
    dst_manager: &Manager,
    dst: u64,
    dst_offset: u64,
    src_manager: &Manager,
    src: u64,
    src_offset: u64,
    bytes: u64,
) -> Result<()> {
    drop(dst_manager.lease(dst, dst_offset, bytes, "dst")?);
    drop(src_manager.lease(src, src_offset, bytes, "src")?);
    const PIECE: u64 = 16 << 20;
    let mut host = vec![0u8; bytes.min(PIECE) as usize];
    let mut done = 0;
    while done < bytes {
        let n = PIECE.min(bytes - done);
        // SAFETY: `host` holds at least `n` bytes and outlives both synchronous copies.
        unsafe {
            src_manager.copy_to_host(host.as_mut_ptr(), src, src_offset + done, n, Completion::Wait)?;
            dst_manager.copy_to_device(dst, dst_offset + done, host.as_ptr(), n, Completion::Wait)?;
        }
        done += n;
    }
    Ok(())
}

