//! Kmm: a GPU memory manager for quantitative MRI.
//!
//! Layers, each with one job: [`backend`] talks to the device (CUDA through cudarc's driver
//! API, or the host stand-in), [`pool`] composes allocators and suballocators, [`manager`]
//! owns streams, buffers and statistics behind handles, and [`ffi`] is the C ABI.

#![allow(non_camel_case_types)]

pub mod backend;
pub mod error;
pub mod ffi;
pub mod manager;
pub mod module;
pub mod pool;
pub mod qmri;

pub use error::{Error, KmmStatus, Result};
