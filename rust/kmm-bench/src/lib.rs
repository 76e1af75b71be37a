//! What kmm-bench's binaries share that tests also use: the replay of allocation traces.

pub mod replay;
