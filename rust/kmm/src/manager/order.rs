//! The one stream-ordering rule for all of a manager's memory, after RMM's stream-ordered
//! resources and PyTorch's `record_stream`.
//!
//! - Every buffer knows the streams that may use its memory ([`StreamSet`]): the stream it was
//!   allocated for, the manager's own stream once Kmm queued work on it, and every stream
//!   recorded with `kmm_buffer_record_stream`.
//! - Every resource knows how its freed blocks become reusable ([`Reuse`]): in the order of one
//!   stream (a lane's device pool, CUDA's pool), or only once the manager's stream has passed
//!   the free (the deferred resources: pinned memory, direct and adopted memory).
//! - A free makes the resource's ordering stream wait for each of the buffer's streams (an
//!   event on each, waited for on the ordering stream: stream-ordered, nothing blocks), and only
//!   then hands the block back. A block is then handed out for work on another stream only after
//!   that stream waits for the ordering stream. Trims and compaction moves go through the same
//!   ordering stream (see `lane`), so no path relies on a stream being idle.
//! - A lane's device pool follows the stream its work is for: a stream that lives as long as the
//!   manager (its own, or CUDA's default streams) takes the pool over, so a plugin that always
//!   allocates and frees on one such stream (Numba on the default stream) needs no event at all.
//!   A stream that may be destroyed earlier never orders a pool (an event would be recorded on it
//!   after it is gone): its allocations and frees wait through the ordering stream every time.

use crate::backend::Backend;
use crate::error::Result;

/// No stream (an empty set's first entry).
const NONE: u64 = u64::MAX;

/// The raw streams that may use a buffer's memory. One stream is the common case: it costs no
/// allocation, and the set is two words in every buffer's record.
#[derive(Debug, Clone)]
pub struct StreamSet {
    first: u64,
    rest: Option<Box<Vec<u64>>>,
}

impl StreamSet {
    pub fn empty() -> StreamSet {
        StreamSet { first: NONE, rest: None }
    }

    pub fn of(stream: u64) -> StreamSet {
        StreamSet { first: stream, rest: None }
    }

    pub fn insert(&mut self, stream: u64) {
        if self.first == NONE {
            self.first = stream;
        } else if self.first != stream {
            let rest = self.rest.get_or_insert_with(Default::default);
            if !rest.contains(&stream) {
                rest.push(stream);
            }
        }
    }

    /// Whether `stream` is the only stream (or there is none).
    pub fn only(&self, stream: u64) -> bool {
        self.rest.is_none() && (self.first == stream || self.first == NONE)
    }

    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        let rest = self.rest.as_deref().map_or(&[][..], |r| &r[..]);
        (self.first != NONE).then_some(self.first).into_iter().chain(rest.iter().copied())
    }
}

/// How a resource's freed blocks become reusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// In the order of `stream`: later work on it may use a freed block at once, work on any
    /// other stream waits for it first. `follows`: a long-lived stream may take the order over.
    Ordered { stream: u64, follows: bool },
    /// Once the manager's stream has passed the free (deferred resources): ready for any stream.
    Completed,
}

impl Reuse {
    /// The stream a free is ordered on: the resource's, or the manager's (`home`).
    pub fn free_stream(&self, home: u64) -> u64 {
        match *self {
            Reuse::Ordered { stream, .. } => stream,
            Reuse::Completed => home,
        }
    }
}

/// Whether `stream` is one stream that lives as long as the manager: its own, or CUDA's legacy
/// default stream (0, or `CU_STREAM_LEGACY` = 1), which is never destroyed. Not
/// `CU_STREAM_PER_THREAD` (2): that handle names another stream on every host thread, so work
/// "on 2" from two threads is not ordered by either.
pub fn long_lived(stream: u64, home: u64, cuda: bool) -> bool {
    stream == home || (cuda && stream <= 1)
}

/// The raw stream a caller's `stream` names: on the host backend 0 names the manager's own
/// (`home`); on CUDA 0 is the legacy default stream, a stream of its own.
pub fn stream_arg(stream: u64, home: u64, cuda: bool) -> u64 {
    if stream == 0 && !cuda {
        home
    } else {
        stream
    }
}

/// Before a block goes back to a resource whose frees are ordered on `on`: `on` waits for every
/// stream of `users`. Nothing waits on the host; an error leaves the caller's buffer as it was.
pub fn order_free(backend: &dyn Backend, on: u64, users: &StreamSet) -> Result<()> {
    if users.only(on) {
        return Ok(());
    }
    for user in users.iter() {
        if user != on {
            backend.order_streams(user, on)?;
        }
    }
    Ok(())
}

/// After a block was taken from a resource reused as `reuse`, for work on `stream`: `stream`
/// waits for the resource's ordering stream, or takes it over when it may (see the module docs).
pub fn order_alloc(backend: &dyn Backend, reuse: &mut Reuse, stream: u64, home: u64) -> Result<()> {
    let Reuse::Ordered { stream: order, follows } = *reuse else {
        return Ok(());
    };
    if stream == order {
        return Ok(());
    }
    backend.order_streams(order, stream)?;
    if follows && long_lived(stream, home, backend.kind() == crate::backend::BackendKind::Cuda) {
        *reuse = Reuse::Ordered { stream, follows };
    }
    Ok(())
}

/// Makes a pool reused as `reuse` ordered on `target` (a long-lived stream), for work that must
/// run there on any of its free blocks (a compaction's copies, chunks moved between lanes).
pub fn take_over(backend: &dyn Backend, reuse: &mut Reuse, target: u64) -> Result<()> {
    if let Reuse::Ordered { stream, follows } = *reuse {
        if stream != target {
            backend.order_streams(stream, target)?;
            *reuse = Reuse::Ordered { stream: target, follows };
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_sets_hold_each_stream_once() {
        let mut s = StreamSet::empty();
        assert_eq!(s.iter().count(), 0);
        s.insert(7);
        s.insert(7);
        s.insert(0);
        s.insert(9);
        s.insert(0);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![7, 0, 9]);
        assert_eq!(StreamSet::of(3).iter().collect::<Vec<_>>(), vec![3]);
    }

    #[test]
    fn only_the_home_and_cuda_default_streams_live_long() {
        assert!(long_lived(0x5000_0001, 0x5000_0001, false));
        assert!(!long_lived(0, 0x5000_0001, false));
        assert!(long_lived(0, 0xdead, true));
        assert!(long_lived(1, 0xdead, true));
        assert!(!long_lived(2, 0xdead, true), "the per-thread stream differs per thread");
        assert!(!long_lived(0x7f00_1234, 0xdead, true));
    }
}
