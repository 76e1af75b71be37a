//! Kmm: a GPU memory manager for quantitative MRI.
//!
//! Layers, each with one job: [`backend`] talks to the device (CUDA through cudarc's driver
//! API, run-time compiled kernels included, or the host stand-in), [`pool`] composes allocators
//! and suballocators, [`manager`] owns streams, buffers and statistics behind handles, [`qmri`]
//! runs MRI kernels on a manager's buffers, and [`ffi`] is the C ABI (and its registry of live
//! managers, which the Rust API does without).

#![allow(non_camel_case_types)]

pub mod backend;
pub mod error;
pub mod ffi;
pub mod figures;
pub mod manager;
pub mod pool;
pub mod qmri;

pub use error::{Error, KmmStatus, Result};
