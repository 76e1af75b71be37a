//! Generational handle tables. A handle is 64 bits: a 4-bit tag saying what it names, the
//! 12-bit owner id of the owning manager (its slot in the C ABI's registry), a 20-bit
//! generation, the 4-bit lane of the manager whose table issued it, and a 24-bit index. Stale
//! (freed), foreign (another manager's), forged and mistyped handles all fail the lookup. A
//! handle never comes back: a slot whose generation has gone once around (2^20 uses) is retired
//! instead of reused, and a manager that takes over an owner id (the C ABI's registry slot)
//! takes over its predecessor's tables' generations too (`History`), so no handle an earlier
//! manager of that id issued is ever issued again.

use crate::error::Result;
use crate::fail;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub const TAG_MANAGER: u64 = 0xA;
pub const TAG_BUFFER: u64 = 0xB;
pub const TAG_MODULE: u64 = 0xC;
pub const TAG_EVENT: u64 = 0xE;

const GEN_BITS: u32 = 20;
const GEN_SHIFT: u32 = 28;
const GEN_MASK: u32 = (1 << GEN_BITS) - 1;
pub const LANE_BITS: u32 = 4;
const INDEX_BITS: u32 = 24;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
/// The bits a table's handles share: tag, owner and lane (generation and index vary).
const FIXED_MASK: u64 = !((GEN_MASK as u64) << GEN_SHIFT | INDEX_MASK);

/// The lane a handle names (any value: forged handles are turned away by the lane's table).
pub fn lane_of(handle: u64) -> usize {
    ((handle >> INDEX_BITS) & ((1 << LANE_BITS) - 1)) as usize
}

pub fn tag_name(tag: u64) -> &'static str {
    match tag {
        TAG_MANAGER => "manager",
        TAG_BUFFER => "buffer",
        TAG_MODULE => "module",
        TAG_EVENT => "event",
        _ => "unknown",
    }
}

fn article(noun: &str) -> &'static str {
    if noun.starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" }
}

/// The next manager's serial, process-wide (the C ABI's registry draws from it too): it seeds
/// the manager's handle tables, so two managers with one owner id seldom share a seed.
pub fn next_serial() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The owner id of a manager made outside the registry: its serial's low 12 bits, so such
/// managers take the ids in turn (one that repeats is told apart by the seed, as when the
/// registry reuses a slot).
pub fn owner_of(serial: u64) -> u16 {
    (serial & 0xFFF) as u16
}

struct Slot<T> {
    /// The generation of the slot's live handle, or of its next one.
    generation: u32,
    /// The generation of the slot's first handle, which it must not reach again.
    first: u32,
    value: Option<T>,
}

/// What a torn-down table leaves for the next table of the same tag, owner and lane: per slot,
/// its next generation and its first one (equal: the slot retired). Shared, and read by the next
/// table only as it grows into those slots: a manager never pays for its predecessor's peak.
#[derive(Default, Clone)]
pub struct History(Arc<Vec<(u32, u32)>>);

pub struct HandleTable<T> {
    tag: u64,
    /// Tag, owner and lane in their places in a handle.
    fixed: u64,
    seed: u32,
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    live: usize,
    /// The last table's slots: slot `i` starts from `history[i]` when the table grows to it.
    history: History,
}

impl<T> HandleTable<T> {
    /// `seed` differs per manager so a stale handle of an earlier manager with the same owner id
    /// (one that used the same registry slot) is unlikely to match a live one.
    /// `lane` is below 2^LANE_BITS.
    pub fn new(tag: u64, owner: u16, lane: usize, seed: u32) -> Self {
        Self::resume(tag, owner, lane, seed, History::default())
    }

    /// A table that goes on from `history`, the `take_history` of the last table of this tag,
    /// owner and lane: its slots issue only generations that table never issued. Slots past the
    /// history start at `seed`.
    pub fn resume(tag: u64, owner: u16, lane: usize, seed: u32, history: History) -> Self {
        debug_assert!(lane < 1 << LANE_BITS);
        let fixed = (tag << 60) | ((owner as u64 & 0xFFF) << 48) | ((lane as u64) << INDEX_BITS);
        HandleTable { tag, fixed, seed: seed & GEN_MASK, slots: Vec::new(), free: Vec::new(), live: 0, history }
    }

    /// Empties the table for good: every live handle counts as removed (its slot's generation
    /// moves on), and the slots' generations, with the history's slots the table never reached,
    /// go to the next table of this tag, owner and lane. Every slot has issued a handle, so one
    /// back at its first generation is retired. In place when no one else holds the history.
    pub fn take_history(&mut self) -> History {
        self.free.clear();
        self.live = 0;
        let mut history = std::mem::take(&mut self.history);
        let entries = Arc::make_mut(&mut history.0);
        for (i, s) in std::mem::take(&mut self.slots).into_iter().enumerate() {
            let generation = if s.value.is_some() { (s.generation + 1) & GEN_MASK } else { s.generation };
            let entry = (generation, s.first);
            match entries.get_mut(i) {
                Some(e) => *e = entry,
                None => entries.push(entry),
            }
        }
        history
    }

    fn encode(&self, index: u32, generation: u32) -> u64 {
        self.fixed | (((generation & GEN_MASK) as u64) << GEN_SHIFT) | index as u64
    }

    #[inline]
    pub fn insert(&mut self, value: T) -> Result<u64> {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let Some(i) = self.grow() else {
                    fail!(
                        KMM_ERROR_OUT_OF_MEMORY,
                        "no {} handle left in this lane of the manager: {} live, the other slots retired after 2^20 uses each",
                        tag_name(self.tag),
                        self.live
                    );
                };
                i
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.value = Some(value);
        let generation = slot.generation;
        self.live += 1;
        Ok(self.encode(index, generation))
    }

    /// A new slot, where the history says it goes on (past its retired slots), or at the seed;
    /// None when the lane has no index left.
    #[cold]
    fn grow(&mut self) -> Option<u32> {
        while self.slots.len() as u64 <= INDEX_MASK {
            let i = self.slots.len();
            let (generation, first) = self.history.0.get(i).copied().unwrap_or((self.seed, self.seed));
            self.slots.push(Slot { generation, first, value: None });
            if i >= self.history.0.len() || generation != first {
                return Some(i as u32);
            }
        }
        None
    }

    fn index_of(&self, handle: u64) -> Result<usize> {
        let index = (handle & INDEX_MASK) as usize;
        let generation = ((handle >> GEN_SHIFT) as u32) & GEN_MASK;
        match self.slots.get(index) {
            Some(slot) if handle & FIXED_MASK == self.fixed && slot.value.is_some() && slot.generation == generation => {
                Ok(index)
            }
            _ => Err(self.lookup_error(handle)),
        }
    }

    /// Why `handle` names no live value here (the lookup's slow path).
    #[cold]
    fn lookup_error(&self, handle: u64) -> crate::error::Error {
        let what = tag_name(self.tag);
        let tag = handle >> 60;
        if tag != self.tag {
            let (a, b) = (article(what), tag_name(tag));
            return crate::err!(KMM_ERROR_INVALID_HANDLE, "{handle:#x} is not {a} {what} handle (it looks like {} {b} handle)", article(b));
        }
        if (handle ^ self.fixed) >> 48 & 0xFFF != 0 {
            return crate::err!(KMM_ERROR_INVALID_HANDLE, "{what} {handle:#x} belongs to another manager, live or destroyed");
        }
        crate::err!(KMM_ERROR_INVALID_HANDLE, "{what} {handle:#x} is not live (freed, stale or never issued)")
    }

    /// The slot index of a live handle (the owner its pool blocks carry).
    pub fn slot_of(&self, handle: u64) -> Result<u32> {
        self.index_of(handle).map(|i| i as u32)
    }

    pub fn get(&self, handle: u64) -> Result<&T> {
        let i = self.index_of(handle)?;
        Ok(self.slots[i].value.as_ref().expect("checked live"))
    }

    pub fn get_mut(&mut self, handle: u64) -> Result<&mut T> {
        let i = self.index_of(handle)?;
        Ok(self.slots[i].value.as_mut().expect("checked live"))
    }

    pub fn remove(&mut self, handle: u64) -> Result<T> {
        self.remove_if(handle, |_| Ok(()))
    }

    /// Removes the value of `handle` once `check` accepts it (one lookup for both).
    #[inline]
    pub fn remove_if(&mut self, handle: u64, check: impl FnOnce(&T) -> Result<()>) -> Result<T> {
        let i = self.index_of(handle)?;
        check(self.slots[i].value.as_ref().expect("checked live"))?;
        let slot = &mut self.slots[i];
        slot.generation = slot.generation.wrapping_add(1) & GEN_MASK;
        // Back at the generation it started with, the slot would issue its first handle again.
        if slot.generation != slot.first {
            self.free.push(i as u32);
        }
        self.live -= 1;
        Ok(slot.value.take().expect("checked live"))
    }

    /// Keeps the slot of `handle`, just removed, from the next `insert`s until `release_slot`:
    /// its index still owns something elsewhere (a pool block whose owner it is).
    pub fn hold_slot(&mut self, handle: u64) {
        let index = (handle & INDEX_MASK) as u32;
        if let Some(at) = self.free.iter().rposition(|&i| i == index) {
            self.free.swap_remove(at);
        }
    }

    /// Gives a slot held by `hold_slot` back to `insert` (unless it retired).
    pub fn release_slot(&mut self, handle: u64) {
        let index = (handle & INDEX_MASK) as u32;
        if let Some(slot) = self.slots.get(index as usize) {
            if slot.value.is_none() && slot.generation != slot.first && !self.free.contains(&index) {
                self.free.push(index);
            }
        }
    }

    /// The index the next `insert` will use.
    pub fn next_index(&self) -> u32 {
        self.free.last().copied().unwrap_or(self.slots.len() as u32)
    }

    /// The live value at `index`, by index rather than handle (for owners known by slot).
    pub fn at(&self, index: u32) -> Option<&T> {
        self.slots.get(index as usize).and_then(|s| s.value.as_ref())
    }

    /// The handle of the live value at `index` (0 when none lives there).
    pub fn handle_at(&self, index: u32) -> u64 {
        match self.slots.get(index as usize) {
            Some(s) if s.value.is_some() => self.encode(index, s.generation),
            _ => 0,
        }
    }

    pub fn at_mut(&mut self, index: u32) -> Option<&mut T> {
        self.slots.get_mut(index as usize).and_then(|s| s.value.as_mut())
    }

    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Every live handle (teardown and leak reports).
    pub fn handles(&self) -> Vec<u64> {
        self.iter().map(|(h, _)| h).collect()
    }

    /// Every live handle with its value.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &T)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.value.as_ref().map(|v| (self.encode(i as u32, s.generation), v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_foreign_forged_and_mistyped_handles_are_rejected() {
        let mut t = HandleTable::new(TAG_BUFFER, 7, 3, 12345);
        let a = t.insert("a").unwrap();
        let b = t.insert("b").unwrap();
        assert_eq!(*t.get(a).unwrap(), "a");
        assert_eq!(t.remove(a).unwrap(), "a");
        let msg = t.get(a).unwrap_err().message;
        assert!(msg.contains("not live"), "{msg}");
        // The slot is reused with a new generation: the old handle stays dead.
        let c = t.insert("c").unwrap();
        assert_ne!(a, c);
        assert!(t.get(a).is_err());
        assert_eq!(*t.get(c).unwrap(), "c");
        let foreign = HandleTable::<&str>::new(TAG_BUFFER, 8, 3, 1).encode(0, 0);
        assert!(t.get(foreign).unwrap_err().message.contains("another manager"));
        // The same index and generation issued by another lane of the same manager.
        let other_lane = HandleTable::<&str>::new(TAG_BUFFER, 7, 4, 12345).encode(1, 12345);
        assert_eq!(lane_of(other_lane), 4);
        assert_eq!(lane_of(b), 3);
        assert!(t.get(other_lane).unwrap_err().message.contains("not live"));
        assert_eq!(other_lane & !(0xF << INDEX_BITS), b & !(0xF << INDEX_BITS), "differs in the lane only");
        let mistyped = (TAG_EVENT << 60) | (b & ((1 << 60) - 1));
        assert!(t.get(mistyped).unwrap_err().message.contains("not a buffer handle"));
        assert!(t.get(0).is_err());
        assert!(t.get(u64::MAX).is_err());
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn a_resumed_table_never_issues_its_predecessors_handles() {
        let mut t = HandleTable::new(TAG_BUFFER, 5, 2, 100);
        let freed = t.insert(0u8).unwrap();
        let live = t.insert(1u8).unwrap();
        t.remove(freed).unwrap();
        let history = t.take_history();
        assert!(t.is_empty() && t.get(live).is_err());
        // Another seed, as a later manager of the owner id has: its slots go on regardless.
        let mut next = HandleTable::resume(TAG_BUFFER, 5, 2, 7, history);
        for _ in 0..64 {
            let h = next.insert(2u8).unwrap();
            assert!(h != freed && h != live, "an earlier table's handle came back");
            next.remove(h).unwrap();
        }
        assert!(next.get(live).is_err() && next.get(freed).is_err());
        // A slot that retired stays retired in the next table.
        let mut t = HandleTable::new(TAG_BUFFER, 1, 0, 9);
        for _ in 0..(1u32 << GEN_BITS) {
            let h = t.insert(0u8).unwrap();
            t.remove(h).unwrap();
        }
        let mut next = HandleTable::resume(TAG_BUFFER, 1, 0, 9, t.take_history());
        assert_eq!(next.insert(0u8).unwrap() & INDEX_MASK, 1, "slot 0 retired");
    }

    #[test]
    fn a_slot_is_retired_before_its_generation_comes_around() {
        let mut t = HandleTable::new(TAG_BUFFER, 1, 0, 77);
        let first = t.insert(0u8).unwrap();
        t.remove(first).unwrap();
        let mut last = first;
        for _ in 1..(1u32 << GEN_BITS) {
            last = t.insert(0u8).unwrap();
            assert_eq!(last & INDEX_MASK, first & INDEX_MASK, "the one slot is reused until it retires");
            t.remove(last).unwrap();
        }
        let fresh = t.insert(1u8).unwrap();
        assert_ne!(fresh & INDEX_MASK, first & INDEX_MASK, "the slot was retired");
        assert!(t.get(first).is_err() && t.get(last).is_err());
        assert_eq!(*t.get(fresh).unwrap(), 1);
    }
}
