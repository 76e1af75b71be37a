//! Copies between managers on different devices of one backend. Peer to peer where the devices
//! allow it; otherwise staged through the destination manager's pinned ring, one slot at a
//! time, so the source's device-to-host copy of one slot overlaps the destination's
//! host-to-device copy of the one before. Either way the copy is stream-ordered on both sides:
//! it waits for the source's work so far, and a later write or free on either manager waits for
//! it (peer to peer, the source's stream waits for the destination's; staged, every read of the
//! source is on the source's own stream already). No path waits on the host except for a
//! staging slot still in flight.

use super::Manager;
use crate::error::{lock, Result};

/// # Safety
/// `dst_addr` and `src_addr` are leased, live, in-bounds ranges of `bytes` bytes on the two
/// managers (different devices of the same backend kind).
pub(super) unsafe fn copy_between_devices(dst: &Manager, dst_addr: u64, src: &Manager, src_addr: u64, bytes: u64) -> Result<()> {
    let (dst_raw, src_raw) = (dst.raw_stream(), src.raw_stream());
    if dst.backend.peer_access(src.backend.as_ref())? {
        src.backend.order_streams(src_raw, dst_raw)?;
        dst.stream.copy_peer(dst_addr, src_addr, src.backend.raw_context(), bytes)?;
        super::copy::order_after_copy(dst, src)
    } else {
        let mut staging = lock(&dst.staging);
        let slot = staging.slot_bytes();
        let mut off = 0;
        while off < bytes {
            let len = slot.min(bytes - off);
            let block = staging.acquire(len)?;
            let queued = src
                .stream
                .copy_d2h(block.addr as *mut u8, src_addr + off, len)
                .and_then(|_| src.backend.order_streams(src_raw, dst_raw))
                .and_then(|_| dst.stream.copy_h2d(dst_addr + off, block.addr as *const u8, len));
            if let Err(e) = queued {
                // The source's copy into the slot may be queued (the destination's is not): the
                // slot retires behind the source's stream, and trim waits for it like any other.
                let _ = staging.submit(src.stream.as_ref(), block, None);
                return Err(e);
            }
            // Released once the destination's copy out of it has run (which follows the source's).
            staging.submit(dst.stream.as_ref(), block, None)?;
            off += len;
        }
        Ok(())
    }
}
