//! What a manager is asked to be: its memory kinds, allocation mode and configuration, checked
//! before anything is allocated.

use crate::backend::BackendChoice;
use crate::error::Result;
use crate::fail;
use crate::pool::SuballocatorKind;

pub use crate::ffi::types::KMM_MAX_BUFFER_BYTES as MAX_BUFFER_BYTES;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    Device = 0,
    Pinned = 1,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocMode {
    Pool,
    CudaAsync,
    Direct,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub backend: BackendChoice,
    pub device: i32,
    pub alloc_mode: AllocMode,
    pub suballocator: SuballocatorKind,
    pub alignment: u64,
    pub chunk_size: u64,
    pub initial_pool_size: u64,
    pub fixed_block_size: u64,
    pub hard_limit: u64,
    pub release_threshold: u64,
    pub pinned_chunk_size: u64,
    pub pinned_limit: u64,
    pub staging_chunk_size: u64,
    pub staging_chunks: u32,
    pub compaction_ratio_pct: u32,
    pub spill_limit: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            backend: BackendChoice::Auto,
            device: 0,
            alloc_mode: AllocMode::Pool,
            suballocator: SuballocatorKind::Binned,
            alignment: 256,
            chunk_size: 8 << 20,
            initial_pool_size: 0,
            fixed_block_size: 1 << 20,
            hard_limit: 0,
            release_threshold: u64::MAX,
            pinned_chunk_size: 32 << 20,
            pinned_limit: 0,
            staging_chunk_size: 16 << 20,
            staging_chunks: 4,
            compaction_ratio_pct: 108,
            spill_limit: 0,
        }
    }
}

impl Config {
    pub fn validate(&self) -> Result<()> {
        if self.device < 0 {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "config.device = {} must be >= 0", self.device);
        }
        if !self.alignment.is_power_of_two() || self.alignment > (1 << 21) {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "config.alignment = {} must be a power of two up to 2 MiB", self.alignment);
        }
        if self.chunk_size == 0 || self.chunk_size > MAX_BUFFER_BYTES {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "config.chunk_size = {} must be in 1..=2^48", self.chunk_size);
        }
        if self.pinned_chunk_size == 0 || self.pinned_chunk_size > MAX_BUFFER_BYTES {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "config.pinned_chunk_size = {} must be in 1..=2^48", self.pinned_chunk_size);
        }
        if self.suballocator == SuballocatorKind::Fixed && (self.fixed_block_size == 0 || self.fixed_block_size > self.chunk_size) {
            fail!(
                KMM_ERROR_INVALID_ARGUMENT,
                "config.fixed_block_size = {} must be in 1..=chunk_size ({})",
                self.fixed_block_size,
                self.chunk_size
            );
        }
        if self.staging_chunk_size < 4096 || self.staging_chunk_size > (1 << 30) {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "config.staging_chunk_size = {} must be in 4096..=2^30", self.staging_chunk_size);
        }
        if !(2..=64).contains(&self.staging_chunks) {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "config.staging_chunks = {} must be in 2..=64", self.staging_chunks);
        }
        if self.compaction_ratio_pct != 0 && !(100..=1000).contains(&self.compaction_ratio_pct) {
            fail!(
                KMM_ERROR_INVALID_ARGUMENT,
                "config.compaction_ratio_pct = {} must be 0 (never move buffers) or in 100..=1000",
                self.compaction_ratio_pct
            );
        }
        if self.initial_pool_size > MAX_BUFFER_BYTES {
            fail!(KMM_ERROR_INVALID_ARGUMENT, "config.initial_pool_size = {} exceeds 2^48", self.initial_pool_size);
        }
        if self.alloc_mode == AllocMode::Pool && self.hard_limit != 0 && self.initial_pool_size > self.hard_limit {
            fail!(
                KMM_ERROR_INVALID_ARGUMENT,
                "config.initial_pool_size = {} exceeds config.hard_limit = {}: the manager could never reserve it",
                self.initial_pool_size,
                self.hard_limit
            );
        }
        Ok(())
    }
}
