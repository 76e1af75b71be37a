//! Spill to host. Under device pressure, unmapped device buffers move to host memory, least
//! recently used first, and come back on their next use that needs device memory (a map, a copy,
//! a fill, a qMRI call, a recorded stream). This is what the handles and pins are for: a buffer
//! that is not mapped has no device address anyone holds, so Kmm may move it, on the device
//! (compaction) or off it.
//!
//! - The copies run on the manager's stream. The copy out waits for every stream that used the
//!   buffer (the ordering rule of `order`), and the device block goes back to its pool after it,
//!   stream-ordered; the copy back in is queued before any later work of Kmm's on the buffer, and
//!   a `map` waits for it (the buffer settles, as after a compaction move).
//! - Host memory comes from the spill store (`spill_store.rs`): a pinned pool (the manager's
//!   pinned upstream and limit) while it has room, then pageable memory, up to
//!   `Config::spill_limit` bytes of spilled buffers. A
//!   copy to pageable memory is synchronous in CUDA: that spill waits for it with its lane locked.
//! - Pinned memory is the user's first: a pinned allocation out of memory (the pinned limit, or
//!   the pinned upstream) moves spilled buffers on from pinned to pageable memory
//!   (`Manager::unpin_spilled`, a rung of `climb`), and the store's emptied pinned chunks go back
//!   upstream before it tries again. That copy is the CPU's, host to host, made only once a fence
//!   recorded on the manager's stream after the buffers' copies out has passed.
//! - The store's lock is a leaf: taken under a lane's lock (a free of a spilled buffer), never
//!   the other way round.

use super::lane::{Origin, State};
use super::order;
use super::spill_store::{HostPlace, SpillStats};
use super::trace::Action;
use super::{Growth, Manager, MemoryKind};
use crate::error::{KmmStatus, Result};
use crate::pool::Block;
use crate::{err, fail};
use std::time::Instant;

impl super::lane::BufferRecord {
    pub(super) fn is_spilled(&self) -> bool {
        matches!(self.origin, Origin::Spilled(_))
    }

    /// Whether the buffer may go to the host now: resident device memory of the pool, unmapped,
    /// not marked to stay.
    pub(super) fn spillable(&self) -> bool {
        self.kind == MemoryKind::Device
            && self.pins == 0
            && !self.never_spill
            && self.bytes > 0
            && matches!(self.origin, Origin::Resource(_) | Origin::Lent { .. })
    }
}

impl State {
    /// Moves the buffer to `place` if it may still go and was not used since `stamp`; false when
    /// it stays (the caller gives `place` back, as on an error).
    pub(super) fn evict(&mut self, handle: u64, place: HostPlace, stamp: u64) -> Result<bool> {
        let (backend, stream, home) = (self.backend.as_ref(), self.stream.as_ref(), self.home);
        let Ok(r) = self.buffers.get_mut(handle) else {
            return Ok(false);
        };
        if !r.spillable() || r.last_use != stamp {
            return Ok(false);
        }
        // The copy runs on the manager's stream after every stream that used the buffer; the
        // block then goes back to a pool ordered on that stream, behind the copy.
        order::take_over(backend, &mut self.reuse[0], home)?;
        order::order_free(backend, home, &r.users)?;
        // SAFETY: the buffer's block is live pool memory and `place` holds `r.bytes`.
        unsafe { stream.copy_d2h(place.block.addr as *mut u8, r.addr, r.bytes)? };
        let (bytes, from, origin) = (r.bytes, r.addr, r.origin);
        // The lane's own block goes back before the record changes: a failure (CUDA's pool
        // refusing the free) leaves the buffer where it was, and the caller gives `place` back.
        // No other thread allocates from this lane's pool before its lock is dropped.
        if let Origin::Resource(block) = origin {
            self.resources[0].deallocate(block)?;
        }
        let r = self.buffers.get_mut(handle)?;
        r.origin = Origin::Spilled(place);
        r.addr = 0;
        r.settling = false;
        r.users.insert(home);
        self.usage[0].in_use -= bytes;
        self.change_in_use(true, bytes, Action::Spill, MemoryKind::Device, from, bytes, home, handle, place.block.addr);
        self.spill.made(place, bytes);
        // A lent block goes back after its record: the lender may hand it out at once.
        if let Origin::Lent { lane, block } = origin {
            self.return_lent(lane, block, true);
        }
        // The copy out may still be queued: a new buffer in the freed block settles (its map
        // waits for the copy), as after a compaction move.
        self.fence_moves();
        Ok(true)
    }

    /// Moves a buffer spilled to pinned `from` on to pageable `to`, if it still lies there from the
    /// same spill: its stamp is unchanged (a restore stamps it anew, and a spilled buffer is not
    /// used otherwise), so its copy out is the one the caller's fence waited for, and no restore's
    /// copy in reads `from`. False when it left (the caller gives `to` back).
    pub(super) fn unpin_spilled(&mut self, handle: u64, from: HostPlace, stamp: u64, to: HostPlace) -> bool {
        let Ok(r) = self.buffers.get_mut(handle) else {
            return false;
        };
        if !matches!(r.origin, Origin::Spilled(place) if place == from) || r.last_use != stamp {
            return false;
        }
        // Host to host: the CPU copies (both places are host memory, and no stream work is
        // queued on either). Under the lane's lock: no restore reads `from` meanwhile.
        // SAFETY: `from` holds the buffer's `r.bytes`, written by a copy out that has run (the
        // caller's fence); `to` is a fresh place of `r.bytes` that nothing else holds.
        unsafe { std::ptr::copy_nonoverlapping(from.block.addr as *const u8, to.block.addr as *mut u8, r.bytes as usize) };
        r.origin = Origin::Spilled(to);
        self.spill.moved_to_pageable(from, r.bytes);
        true
    }

    /// Brings a spilled buffer back into this lane's pool (compacting or growing it as an
    /// allocation would); false when it was not spilled.
    pub(super) fn restore(&mut self, handle: u64) -> Result<bool> {
        let r = self.buffers.get(handle)?;
        if !r.is_spilled() {
            return Ok(false);
        }
        let (bytes, owner) = (r.bytes, self.buffers.slot_of(handle)?);
        let block = self
            .allocate_block(bytes, MemoryKind::Device, owner, Growth::Allow)?
            .ok_or_else(|| err!(KMM_ERROR_INTERNAL, "a restore that may grow was declined"))?;
        if let Err(e) = order::order_alloc(self.backend.as_ref(), &mut self.reuse[0], self.home, self.home) {
            self.resources[0].deallocate(block)?;
            return Err(e);
        }
        match self.restore_into(handle, Origin::Resource(block), block) {
            Ok(true) => Ok(true),
            done => {
                self.resources[0].deallocate(block)?;
                done
            }
        }
    }

    /// A free block of this lane's pool (no compaction, no growth) for a spilled buffer of
    /// another lane, ready for the manager's stream; `None` when none fits.
    pub(super) fn lend(&mut self, bytes: u64) -> Option<Block> {
        let block = self.allocate_block(bytes, MemoryKind::Device, crate::pool::NO_OWNER, Growth::Never).ok().flatten()?;
        if order::order_alloc(self.backend.as_ref(), &mut self.reuse[0], self.home, self.home).is_err() {
            let _ = self.resources[0].deallocate(block);
            return None;
        }
        Some(block)
    }

    /// Copies a spilled buffer back into `block` (held as `origin`); false, with nothing done,
    /// when the buffer is no longer spilled (the caller keeps the block).
    pub(super) fn restore_into(&mut self, handle: u64, origin: Origin, block: Block) -> Result<bool> {
        let home = self.home;
        let r = self.buffers.get_mut(handle)?;
        let Origin::Spilled(place) = r.origin else {
            return Ok(false);
        };
        let bytes = r.bytes;
        // SAFETY: `place` holds the buffer's bytes until given back below, after the copy.
        unsafe { self.stream.copy_h2d(block.addr, place.block.addr as *const u8, bytes)? };
        r.origin = origin;
        r.addr = block.addr;
        r.last_use = self.spill.tick();
        // Settling: a map waits for the copy in (the moves' fence recorded below).
        r.settling = true;
        // Off the spilled bytes before it counts in use again: a snapshot between the two sees
        // the buffer in neither, never in both.
        self.spill.give_back(place, bytes, true);
        self.usage[0].in_use += bytes;
        self.change_in_use(false, bytes, Action::Restore, MemoryKind::Device, block.addr, bytes, home, handle, place.block.addr);
        self.spill.count(|s| {
            s.restores += 1;
            s.bytes_in += bytes;
        });
        self.fence_moves();
        Ok(true)
    }
}

/// Rounds of spilling one out-of-memory climb makes at most (the goal doubles each round).
const CLIMB_ROUNDS: u32 = 48;

/// Uses that find a buffer spilled restore it and try again, this many times at most: other
/// threads' allocations may spill it again in between.
const RESTORE_TRIES: u32 = 8;

impl Manager {
    /// Spills unmapped device buffers, least recently used first, until `goal` bytes went to the
    /// host or none that fits the limit (plus `headroom`) is left; returns the bytes spilled and
    /// how many buffers that fit the limit stayed because others used, spilled or freed them
    /// after it looked.
    fn spill_lru(&self, goal: u64, headroom: u64) -> Result<(u64, usize)> {
        let mut candidates: Vec<(u64, u64, u64)> = Vec::new();
        for lane in 0..=super::cells::kind_lane_mask(MemoryKind::Device, self.lane_mask()) {
            let st = self.lane(lane);
            candidates.extend(st.buffers.iter().filter(|(_, r)| r.spillable()).map(|(h, r)| (r.last_use, h, r.bytes)));
        }
        candidates.sort_unstable();
        let mut contested = 0;
        let mut spilled = 0u64;
        for (stamp, handle, bytes) in candidates {
            if spilled >= goal {
                break;
            }
            // Over the limit: a smaller buffer may still fit.
            let Some(place) = self.spill.take(bytes, headroom)? else {
                continue;
            };
            let evicted = self.state_of(handle).evict(handle, place, stamp);
            match evicted {
                Ok(true) => spilled += bytes,
                Ok(false) => {
                    contested += 1;
                    self.spill.give_back(place, bytes, false)
                }
                Err(e) => {
                    self.spill.give_back(place, bytes, false);
                    return Err(e);
                }
            }
        }
        Ok((spilled, contested))
    }

    /// For a device request of `bytes` that no room made on the device can serve, its block
    /// (aligned) being larger than the most the manager may ever hold: that most, and what
    /// bounds it (the hard limit, else the device's memory). `None` when it may fit, or the
    /// backend cannot say.
    pub(super) fn never_fits_device(&self, bytes: u64) -> Option<(u64, &'static str)> {
        let room = match self.config.hard_limit {
            0 => self.backend.memory_info().ok().map(|(_, total)| (total, "the device's memory")),
            hard => Some((hard, "the hard limit")),
        };
        let block = bytes.checked_next_multiple_of(self.config.alignment).unwrap_or(u64::MAX);
        room.filter(|&(most, _)| block > most)
    }

    /// The headroom past the spill limit for a swap that no buffer fitting the limit could
    /// make (the host near its limit, the victims larger than the room left): the host may hold
    /// every spilled byte more for a moment, that is any victim the limit alone could hold, and
    /// `settle` then brings other spilled buffers back into the room the victim left. Only while
    /// the live bytes fit the hard limit plus the spill limit, so that a placement within both
    /// exists (with no hard limit the device's room is not known: none).
    fn swap_headroom(&self, bytes: u64, restoring: bool) -> Option<u64> {
        let hard = self.config.hard_limit;
        if hard == 0 {
            return None;
        }
        let device = self.stats(MemoryKind::Device);
        let spilled = device.spill.spilled_bytes;
        // A restore's own bytes are among the spilled ones.
        let incoming = if restoring { 0 } else { bytes };
        let live = device.usage.in_use.saturating_add(spilled).saturating_add(incoming);
        (live <= hard.saturating_add(self.spill.limit)).then_some(spilled.max(bytes))
    }

    /// After a swap past the spill limit (`swap_headroom`), whether the allocation or restore
    /// it served was made or not: brings spilled buffers back into device memory they find
    /// without spilling others, until the store is within its limit. First one that alone
    /// brings it within (most recently used first), then any, most recently used first. Best
    /// effort: a buffer that finds no room (or was used, freed or restored meanwhile) stays;
    /// with no room in whole blocks the store stays past its limit by less than the victims.
    fn settle(&self) {
        let mut spilled: Vec<(u64, u64, u64)> = Vec::new();
        for lane in 0..=super::cells::kind_lane_mask(MemoryKind::Device, self.lane_mask()) {
            let st = self.lane(lane);
            spilled.extend(st.buffers.iter().filter(|(_, r)| r.is_spilled()).map(|(h, r)| (r.last_use, h, r.bytes)));
        }
        spilled.sort_unstable_by(|a, b| b.cmp(a));
        let over = || self.spill.taken().saturating_sub(self.spill.limit);
        let enough = over();
        let one_that_suffices = spilled.iter().filter(|&&(_, _, bytes)| bytes >= enough);
        for &(_, handle, _) in one_that_suffices.chain(spilled.iter()) {
            if over() == 0 {
                break;
            }
            let _ = self.restore_somewhere(handle, super::handles::lane_of(handle) & self.lane_mask());
        }
    }

    /// Moves buffers spilled to pinned memory on to pageable memory, least recently used first,
    /// until `goal` bytes moved or none is left (or the host has no pageable memory); returns the
    /// bytes moved. Their pinned blocks go back to the store's pool, whose emptied chunks
    /// `release_spill` then gives upstream: the rung of a pinned allocation out of memory.
    fn unpin_spilled(&self, goal: u64) -> Result<u64> {
        let mut candidates: Vec<(u64, u64, HostPlace, u64)> = Vec::new();
        for lane in 0..=super::cells::kind_lane_mask(MemoryKind::Device, self.lane_mask()) {
            let st = self.lane(lane);
            candidates.extend(st.buffers.iter().filter_map(|(h, r)| match r.origin {
                Origin::Spilled(place) if place.pinned => Some((r.last_use, h, place, r.bytes)),
                _ => None,
            }));
        }
        if candidates.is_empty() {
            return Ok(0);
        }
        let started = Instant::now();
        candidates.sort_unstable_by_key(|&(stamp, handle, _, _)| (stamp, handle));
        let mut chosen = 0u64;
        candidates.retain(|c| {
            let keep = chosen < goal;
            chosen += if keep { c.3 } else { 0 };
            keep
        });
        // A spill queues its copy out on the manager's stream before it marks the buffer
        // spilled, under the lane's lock: every copy out of the buffers seen above is queued
        // before this fence, and their pinned places are read only once it has passed (waited
        // for with no lock held; the stream itself when no event can be recorded).
        match self.backend.create_event().and_then(|e| self.stream.record(e.as_ref()).map(|_| e)) {
            Ok(fence) => fence.synchronize()?,
            Err(_) => self.stream.synchronize()?,
        }
        let mut moved = 0;
        for (stamp, handle, from, bytes) in candidates {
            let Some(to) = self.spill.take_pageable(bytes)? else {
                break;
            };
            if self.state_of(handle).unpin_spilled(handle, from, stamp, to) {
                moved += bytes;
            } else {
                self.spill.untake_pageable(to);
            }
        }
        self.spill.count(|s| s.time_ns += started.elapsed().as_nanos() as u64);
        Ok(moved)
    }

    /// Whether moving spilled data out of pinned memory can make room for a pinned request of
    /// `bytes`: it gives back the spill store's pinned chunks only, so the request (as the pool
    /// rounds it) must fit the pinned limit beside everything else held of it, the user's pinned
    /// buffers first. Otherwise nothing is moved for it (pageable memory is slower to restore
    /// from).
    fn unpinning_may_serve(&self, bytes: u64) -> bool {
        let limit = &self.limits[1];
        let held_by_others = limit.used().current().saturating_sub(self.spill.pinned_reserved());
        crate::pool::round_up(bytes.max(1), self.config.alignment) <= limit.max().saturating_sub(held_by_others)
    }

    /// The out-of-memory rungs for `attempt` (an allocation or a restore of `bytes` of `kind`)
    /// after it failed once: every lane's cached chunks are given back once the work that used
    /// them has run, and the attempt repeated; then, while spill is on, device buffers are
    /// spilled, `bytes` at first and twice as many each time, the attempt repeated after each
    /// spill and again after giving chunks back, until it succeeds or none is left to spill.
    /// `spilled` gets the bytes spilled. A restore (`restoring`) may take the spill limit past by
    /// its own bytes until its copy in gives them back: a swap with the host full must be able
    /// to happen. For pinned memory the spill rung is another: buffers spilled to pinned memory
    /// move on to pageable memory (`unpin_spilled`), `bytes` at first and twice as many each
    /// time, their emptied pinned chunks go back upstream and the attempt is repeated; `spilled`
    /// gets the bytes moved.
    pub(super) fn climb<T>(
        &self,
        bytes: u64,
        kind: MemoryKind,
        restoring: bool,
        spilled: &mut u64,
        mut attempt: impl FnMut() -> Result<T>,
    ) -> Result<T> {
        let out_of_memory = |r: &Result<T>| matches!(r, Err(e) if e.status == KmmStatus::KMM_ERROR_OUT_OF_MEMORY);
        // The spill store's idle pinned chunks count against the pinned limit too.
        let released = self.release(kind, 0).and_then(|_| if kind == MemoryKind::Pinned { self.release_spill() } else { Ok(()) });
        let mut result = released.and_then(|_| attempt());
        if kind == MemoryKind::Pinned && self.spill.limit != 0 && self.unpinning_may_serve(bytes) {
            // Spilled data in pinned memory counts against the pinned limit (and holds the pinned
            // upstream's memory), but pageable memory serves it too: a user's pinned buffer comes
            // first. Whole chunks only go back, so the goal grows until enough of them emptied.
            let mut goal = bytes.max(1);
            for _ in 0..CLIMB_ROUNDS {
                if !out_of_memory(&result) {
                    break;
                }
                let moved = self.unpin_spilled(goal)?;
                // Nothing moved: none left in pinned memory, or no pageable memory for it.
                if moved == 0 {
                    break;
                }
                *spilled += moved;
                self.release_spill()?;
                result = attempt();
                goal = goal.saturating_mul(2);
            }
        }
        // Spilling cannot make room for a request larger than the device itself: every buffer
        // would go to the host for nothing (and stay there).
        if kind != MemoryKind::Device || self.spill.limit == 0 || self.never_fits_device(bytes).is_some() {
            return result;
        }
        let mut goal = bytes.max(1);
        let mut headroom = if restoring { bytes } else { 0 };
        let mut swapped_past_limit = false;
        // Threads out of memory together spill together: one's spill may serve another, and
        // the buffers one picked may be spilled by another first. A round that spilled nothing
        // while buffers could still spill tries again; the rounds are bounded all the same.
        for _ in 0..CLIMB_ROUNDS {
            if !out_of_memory(&result) {
                break;
            }
            let started = Instant::now();
            let mut round = self.spill_lru(goal, headroom);
            if matches!(round, Ok((0, 0))) && !swapped_past_limit {
                // No victim fits the limit: a swap past it, settled below, if a placement exists.
                if let Some(more) = self.swap_headroom(bytes, restoring) {
                    swapped_past_limit = true;
                    headroom = more;
                    round = self.spill_lru(goal, headroom);
                }
            }
            // The spilled buffers' blocks are back in their pools, stream-ordered behind the
            // copies out: the attempt may use them at once. Only when they do not serve it are
            // the chunks given back (which waits for those copies) for a chunk of its own size.
            let (moved, contested) = round?;
            if moved > 0 {
                result = attempt();
            }
            if out_of_memory(&result) {
                self.release(kind, 0)?;
                result = attempt();
            }
            // A restore counts its whole time itself.
            if !restoring {
                self.spill.count(|s| s.time_ns += started.elapsed().as_nanos() as u64);
            }
            // Nothing spilled and nothing raced for: nothing left that fits the limit.
            if moved == 0 && contested == 0 {
                break;
            }
            *spilled += moved;
            goal = goal.saturating_mul(2);
        }
        // Also after a failure: the victims moved for nothing come back.
        if swapped_past_limit {
            self.settle();
        }
        result
    }

    /// Brings a spilled buffer back to the device; nothing when it is there.
    pub(super) fn restore(&self, handle: u64) -> Result<()> {
        let started = Instant::now();
        let lane = super::handles::lane_of(handle) & self.lane_mask();
        let first = self.restore_somewhere(handle, lane);
        let result = match first {
            Err(e) if e.status == KmmStatus::KMM_ERROR_OUT_OF_MEMORY => {
                let bytes = self.lane(lane).buffers.get(handle)?.bytes;
                let mut spilled = 0;
                let before = self.stats(MemoryKind::Device).resource;
                self.climb(bytes, MemoryKind::Device, true, &mut spilled, || self.restore_somewhere(handle, lane)).map_err(|e| {
                    // A failed allocation of device memory, counted and traced as one.
                    let home = {
                        let mut own = self.lane(lane);
                        own.usage[MemoryKind::Device as usize].on_failure();
                        own.home
                    };
                    if let Some(t) = self.recording() {
                        t.record(super::trace::Action::AllocateFailure, MemoryKind::Device, 0, bytes, home, handle, e.status as u64);
                    }
                    let why = format!("restoring spilled buffer {handle:#x}: {}", e.message);
                    let explained = self.explain_out_of_memory(bytes, MemoryKind::Device, &before, spilled, &why);
                    err!(KMM_ERROR_OUT_OF_MEMORY, "{explained}")
                })
            }
            done => done,
        };
        // A buffer that was on the device cost nothing to restore.
        if !matches!(result, Ok(false)) {
            self.spill.count(|s| s.time_ns += started.elapsed().as_nanos() as u64);
        }
        result.map(drop)
    }

    /// One try of a restore: the buffer's own lane (its free blocks, other lanes' free chunks,
    /// compaction, growth), then a free block another lane lends (lanes busy now are passed over).
    fn restore_somewhere(&self, handle: u64, lane: usize) -> Result<bool> {
        let own = self.lane(lane).restore(handle);
        let Err(e) = own else {
            return own;
        };
        if e.status != KmmStatus::KMM_ERROR_OUT_OF_MEMORY {
            return Err(e);
        }
        let bytes = self.lane(lane).buffers.get(handle)?.bytes;
        let mask = super::cells::kind_lane_mask(MemoryKind::Device, self.lane_mask());
        for other in (1..=mask).map(|i| (lane + i) & mask) {
            let Some(block) = self.cells.lane(other).try_lock().and_then(|mut cell| cell.as_mut()?.lend(bytes)) else {
                continue;
            };
            let mut st = self.lane(lane);
            let restored = st.restore_into(handle, Origin::Lent { lane: other, block }, block);
            if !matches!(restored, Ok(true)) {
                st.return_lent(other, block, false);
            }
            return restored;
        }
        Err(e)
    }

    /// Runs `use_it` on the buffer's lane once the buffer is on the device: `use_it` gives `None`
    /// for a spilled buffer, which is then restored and tried again.
    pub(super) fn resident<R>(&self, handle: u64, mut use_it: impl FnMut(&mut State) -> Result<Option<R>>) -> Result<R> {
        for _ in 0..RESTORE_TRIES {
            if let Some(r) = use_it(&mut self.state_of(handle))? {
                return Ok(r);
            }
            self.restore(handle)?;
        }
        fail!(
            KMM_ERROR_OUT_OF_MEMORY,
            "buffer {handle:#x} was spilled to host again {RESTORE_TRIES} times before it could be used: other threads' allocations need the device memory it takes"
        )
    }

    /// Whether the buffer may spill (`never`: it stays on the device; a spilled one comes back).
    /// A failed restore leaves the setting as it was.
    pub fn set_never_spill(&self, handle: u64, never: bool) -> Result<()> {
        let was = std::mem::replace(&mut self.state_of(handle).buffers.get_mut(handle)?.never_spill, never);
        if never {
            if let Err(e) = self.restore(handle) {
                if let Ok(r) = self.state_of(handle).buffers.get_mut(handle) {
                    r.never_spill = was;
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Whether the buffer is memory allocated elsewhere (`wrap`), which no pool owns.
    pub fn is_wrapped(&self, handle: u64) -> Result<bool> {
        self.state_of(handle).is_wrapped(handle)
    }

    /// Whether the buffer's bytes are on the host now.
    pub fn is_spilled(&self, handle: u64) -> Result<bool> {
        Ok(self.state_of(handle).buffers.get(handle)?.is_spilled())
    }

    pub fn spill_stats(&self) -> SpillStats {
        self.spill.stats()
    }

    pub(super) fn release_spill(&self) -> Result<()> {
        self.spill.release(self.upstreams[1].as_ref())
    }
}
