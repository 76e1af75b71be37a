//! Leaf upstreams: chunks of device memory and of pinned host memory from a backend.

use super::Upstream;
use crate::backend::Backend;
use crate::error::Result;
use std::sync::Arc;

pub struct DeviceUpstream(pub Arc<dyn Backend>);

impl Upstream for DeviceUpstream {
    fn allocate(&self, bytes: u64) -> Result<u64> {
        self.0.alloc_device(bytes)
    }
    unsafe fn deallocate(&self, addr: u64, _bytes: u64) -> Result<()> {
        self.0.free_device(addr)
    }
}

pub struct PinnedUpstream(pub Arc<dyn Backend>);

impl Upstream for PinnedUpstream {
    fn allocate(&self, bytes: u64) -> Result<u64> {
        self.0.alloc_pinned(bytes).map(|p| p as u64)
    }
    unsafe fn deallocate(&self, addr: u64, _bytes: u64) -> Result<()> {
        self.0.free_pinned(addr as *mut u8)
    }
}
