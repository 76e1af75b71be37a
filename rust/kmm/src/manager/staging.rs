//! Staging for copies from and to pageable host memory: a ring over one pinned chunk. The CPU
//! copy into (or out of) one slot overlaps the DMA of the slots before it; a slot is reused once
//! the event recorded after its DMA has completed.

use crate::backend::{self, Backend, Event, Stream};
use crate::error::Result;
use crate::pool::ring::RingSuballocator;
use crate::pool::{round_up, Block, Suballocator};
use crate::err;
use rayon::prelude::*;
use std::collections::VecDeque;
use std::sync::Arc;

/// Bytes staged from a slot into user memory when the slot retires (synchronous device-to-host).
type HostCopy = Option<(u64, u64)>;

pub struct Staging {
    backend: Arc<dyn Backend>,
    slot_bytes: u64,
    slots: u32,
    base: Option<u64>,
    ring: RingSuballocator,
    pending: VecDeque<(Box<dyn Event>, Block, HostCopy)>,
    spare_events: Vec<Box<dyn Event>>,
}

impl Staging {
    pub fn new(backend: Arc<dyn Backend>, slot_bytes: u64, slots: u32) -> Self {
        Staging {
            backend,
            slot_bytes,
            slots,
            base: None,
            ring: RingSuballocator::new(),
            pending: VecDeque::new(),
            spare_events: Vec::new(),
        }
    }

    pub fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    pub fn reserved(&self) -> u64 {
        if self.base.is_some() { self.slot_bytes * self.slots as u64 } else { 0 }
    }

    /// A slot of `len <= slot_bytes` bytes, waiting for the oldest one in flight if all are busy.
    pub fn acquire(&mut self, len: u64) -> Result<Block> {
        if self.base.is_none() {
            let bytes = self.slot_bytes * self.slots as u64;
            let base = self.backend.alloc_pinned(bytes)? as u64;
            self.ring.add_chunk(base, bytes);
            self.base = Some(base);
        }
        loop {
            if let Some(block) = self.ring.alloc(round_up(len.max(1), 256)) {
                return Ok(block);
            }
            if self.pending.is_empty() {
                return Err(err!(
                    KMM_ERROR_BACKEND,
                    "no staging slot of {len} bytes is free: an earlier device failure left slots in use; trim the manager"
                ));
            }
            self.retire_oldest()?;
        }
    }

    /// Queues the slot's release behind the work just enqueued on `stream`. When the event
    /// cannot be recorded, the slot is released once the stream is idle; if even that fails it
    /// stays out of use until `release` (trim), so a device failure cannot corrupt later copies.
    pub fn submit(&mut self, stream: &dyn Stream, block: Block, host_copy: HostCopy) -> Result<()> {
        match backend::record_reusing(self.backend.as_ref(), stream, &mut self.spare_events) {
            Ok(event) => {
                self.pending.push_back((event, block, host_copy));
                Ok(())
            }
            Err(e) => {
                if stream.synchronize().is_ok() {
                    self.ring.free(block);
                }
                Err(e)
            }
        }
    }

    /// Returns a slot whose work could not be queued (the copy into or out of it failed).
    pub fn abandon(&mut self, block: Block) {
        self.ring.free(block);
    }

    fn retire_oldest(&mut self) -> Result<()> {
        let (event, block, host_copy) = self.pending.pop_front().expect("caller checked");
        let waited = event.synchronize();
        if waited.is_ok() {
            if let Some((dst, len)) = host_copy {
                // SAFETY: the caller of the synchronous copy keeps `dst` valid until it returns,
                // which is after every slot of that copy has retired.
                unsafe { parallel_copy(dst as *mut u8, block.addr as *const u8, len as usize) };
            }
        }
        self.ring.free(block);
        self.spare_events.push(event);
        waited
    }

    pub fn retire_all(&mut self) -> Result<()> {
        while !self.pending.is_empty() {
            self.retire_oldest()?;
        }
        Ok(())
    }

    /// Gives the pinned chunk back (trim and teardown).
    pub fn release(&mut self) -> Result<()> {
        self.retire_all()?;
        if let Some(base) = self.base.take() {
            self.ring = RingSuballocator::new();
            // SAFETY: every slot has retired, so no queued copy reads the chunk.
            unsafe { self.backend.free_pinned(base as *mut u8)? };
        }
        Ok(())
    }
}

/// memcpy split across threads: one core cannot keep up with a DMA engine.
///
/// # Safety
/// `dst` and `src` are valid for `len` bytes and do not overlap.
pub unsafe fn parallel_copy(dst: *mut u8, src: *const u8, len: usize) {
    const PIECE: usize = 256 << 10;
    if len < 4 * PIECE {
        std::ptr::copy_nonoverlapping(src, dst, len);
        return;
    }
    let (d, s) = (dst as usize, src as usize);
    (0..len.div_ceil(PIECE)).into_par_iter().for_each(|i| {
        let off = i * PIECE;
        let n = PIECE.min(len - off);
        // SAFETY: pieces are disjoint sub-ranges of the caller's ranges.
        unsafe { std::ptr::copy_nonoverlapping((s + off) as *const u8, (d + off) as *mut u8, n) }
    });
}
