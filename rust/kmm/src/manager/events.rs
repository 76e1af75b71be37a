//! Events on the manager's stream and the ordering of the manager's stream with foreign ones.

use super::Manager;
use crate::backend::Event;
use crate::error::Result;
use std::sync::Arc;

impl Manager {
    pub fn record_event(&self) -> Result<u64> {
        let event: Arc<dyn Event> = Arc::from(self.backend.create_event()?);
        self.stream.record(event.as_ref())?;
        self.first_lane().events.insert(event)
    }

    fn event(&self, handle: u64) -> Result<Arc<dyn Event>> {
        self.first_lane().events.get(handle).cloned()
    }

    pub fn event_query(&self, handle: u64) -> Result<bool> {
        self.event(handle)?.query()
    }

    /// Waits without holding the manager's lock.
    pub fn event_wait(&self, handle: u64) -> Result<()> {
        self.event(handle)?.synchronize()
    }

    pub fn event_destroy(&self, handle: u64) -> Result<()> {
        self.first_lane().events.remove(handle).map(drop)
    }

    /// The manager's stream waits for the work queued so far on `foreign`.
    pub fn wait_for_stream(&self, foreign: u64) -> Result<()> {
        self.backend.check_stream(foreign)?;
        self.backend.order_streams(foreign, self.raw_stream())
    }

    /// `foreign` waits for the work queued so far on the manager's stream.
    pub fn order_stream_after(&self, foreign: u64) -> Result<()> {
        self.backend.order_streams(self.raw_stream(), foreign)
    }
}
