//! What a manager reports about its memory: per-kind figures and the readable summary.

use super::{Manager, MemoryKind};
use crate::pool::stats::UsageCounters;
use crate::pool::ResourceCounters;

/// Per-kind figures: what callers hold and what the resources reserve.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KindStats {
    pub usage: UsageCounters,
    pub resource: ResourceCounters,
    /// Device memory only: what spilling to host did.
    pub spill: super::SpillStats,
}

impl Manager {
    pub fn summary(&self) -> String {
        let mut out = format!(
            "Kmm manager on {} ({:?} backend, device {}), {:?} mode, {:?} suballocator\n",
            self.device_name(),
            self.backend_kind(),
            self.device(),
            self.config.alloc_mode,
            self.config.suballocator
        );
        out += &format!(
            "{:<8} {:>12} {:>12} {:>12} {:>12} {:>8} {:>8} {:>8} {:>8} {:>7} {:>12}\n",
            "kind", "in use", "peak use", "reserved", "peak resv", "live", "allocs", "frees", "misses", "failed", "largest free"
        );
        for kind in [MemoryKind::Device, MemoryKind::Pinned] {
            let s = self.stats(kind);
            out += &format!(
                "{:<8} {:>12} {:>12} {:>12} {:>12} {:>8} {:>8} {:>8} {:>8} {:>7} {:>12}\n",
                format!("{kind:?}").to_lowercase(),
                human_bytes(s.usage.in_use),
                human_bytes(s.usage.peak_in_use),
                human_bytes(s.resource.reserved),
                human_bytes(s.resource.peak_reserved),
                s.usage.live_buffers,
                s.usage.allocs,
                s.usage.frees,
                s.resource.pool_misses,
                s.usage.failed_allocs,
                human_bytes(s.resource.largest_free)
            );
        }
        out += "(misses: tries the pool's free blocks could not serve, each retry of the out-of-memory ladder counted)\n";
        let device = self.stats(MemoryKind::Device).resource;
        if device.compactions > 0 {
            out += &format!(
                "compactions: {} (unmapped device buffers moved instead of growing the pool; {} copied)\n",
                device.compactions,
                human_bytes(device.relocated_bytes)
            );
        }
        let spill = self.spill_stats();
        if spill.spills > 0 || self.config.spill_limit > 0 {
            out += &format!(
                "spill: {} on host now (peak {}, {} pageable) of a {} limit; {} spills ({} out), {} restores ({} in), {:.3} s moving\n",
                human_bytes(spill.spilled_bytes),
                human_bytes(spill.peak_spilled_bytes),
                human_bytes(spill.pageable_bytes),
                human_bytes(self.config.spill_limit),
                spill.spills,
                human_bytes(spill.bytes_out),
                spill.restores,
                human_bytes(spill.bytes_in),
                spill.time_ns as f64 * 1e-9
            );
        }
        out
    }
}

pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}
