//! The C ABI. Every exported function runs its body inside [`boundary`]: errors become a status
//! plus a thread-local message, panics become `KMM_ERROR_INTERNAL`, and nothing unwinds into C.
//! Handles are 64-bit values checked on every call; pointers are checked for NULL; enums arrive
//! as integers and are validated, so no value a caller passes is undefined behaviour in Rust.
//! A manager handle names a slot of [`registry`], which owns the managers made through the ABI.

pub mod buffer;
mod by_address;
pub mod copy;
pub mod cupy;
pub mod ipc;
pub mod manager;
pub mod module;
pub mod mrstat;
pub mod plugin;
pub mod qmri;
pub mod registry;
pub mod torch;
pub mod trace;
pub mod types;

use crate::error::{Error, KmmStatus, Result};
use crate::fail;
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    static LAST_STATUS: std::cell::Cell<KmmStatus> = const { std::cell::Cell::new(KmmStatus::KMM_OK) };
}

fn set_last_error(status: KmmStatus, message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
    LAST_STATUS.with(|s| s.set(status));
}

/// Runs `body`, turning its error or panic into a status and the thread's last-error message.
pub(crate) fn boundary(body: impl FnOnce() -> Result<()>) -> KmmStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => KmmStatus::KMM_OK,
        Ok(Err(Error { status, message })) => {
            set_last_error(status, &message);
            status
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(KmmStatus::KMM_ERROR_INTERNAL, &format!("internal error (a bug in Kmm, please report it): {what}"));
            KmmStatus::KMM_ERROR_INTERNAL
        }
    }
}

/// Writes `value` through an out-parameter; NULL is `KMM_ERROR_NULL_POINTER` naming `name`.
pub(crate) fn write_out<T>(ptr: *mut T, name: &str, value: T) -> Result<()> {
    if ptr.is_null() {
        fail!(KMM_ERROR_NULL_POINTER, "{name} is NULL");
    }
    // SAFETY: non-null, and the caller provides space for a T.
    unsafe { ptr.write(value) };
    Ok(())
}

/// Fails early when an out-parameter is NULL, before any work is done.
pub(crate) fn check_out<T>(ptr: *mut T, name: &str) -> Result<()> {
    if ptr.is_null() {
        fail!(KMM_ERROR_NULL_POINTER, "{name} is NULL");
    }
    Ok(())
}

/// Writes `text` into `buf` as a NUL-terminated string, truncated to `len` bytes (at a character
/// boundary: what is written is UTF-8), and the length the whole text needs (with its NUL) to
/// `*needed` when `needed` is not NULL; `buf` may be NULL when `len` is 0.
pub(crate) fn write_text(text: &str, buf: *mut c_char, len: usize, needed: *mut usize) -> Result<()> {
    if buf.is_null() && len > 0 {
        fail!(KMM_ERROR_NULL_POINTER, "buf is NULL but len = {len}");
    }
    let bytes = text.as_bytes();
    if len > 0 {
        let n = (0..=bytes.len().min(len - 1)).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        // SAFETY: buf holds len >= n + 1 bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, n);
            *buf.add(n) = 0;
        }
    }
    if !needed.is_null() {
        write_out(needed, "needed", bytes.len() + 1)?;
    }
    Ok(())
}

pub(crate) fn check_flags(flags: u32, allowed: u32, name: &str) -> Result<()> {
    if flags & !allowed != 0 {
        fail!(KMM_ERROR_INVALID_ARGUMENT, "{name} = {flags:#x} has unknown bits (allowed: {allowed:#x})");
    }
    Ok(())
}

/// Kmm's version, "major.minor.patch". Static string; never NULL; do not free.
#[no_mangle]
pub extern "C" fn kmm_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}

/// The ABI version of this library (`KMM_ABI_VERSION` of the header it was built with).
/// Bindings compare it with the header they were generated from.
#[no_mangle]
pub extern "C" fn kmm_abi_version() -> u32 {
    types::KMM_ABI_VERSION
}

/// The message of the last failed call on this thread, naming the argument and the bound.
/// Never NULL ("" before any failure). Valid until the next failing Kmm call on this thread;
/// do not free. Successful calls leave it unchanged.
#[no_mangle]
pub extern "C" fn kmm_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The status of the last failed call on this thread (`KMM_OK` before any failure), for the
/// functions that return an address instead of a status (`kmm_plugin_malloc`). Successful calls
/// leave it unchanged.
#[no_mangle]
pub extern "C" fn kmm_last_status() -> KmmStatus {
    LAST_STATUS.with(|s| s.get())
}

/// The name of a status code ("KMM_ERROR_OUT_OF_MEMORY"), or "KMM_UNKNOWN_STATUS".
/// Static string; never NULL; do not free.
#[no_mangle]
pub extern "C" fn kmm_status_name(status: u32) -> *const c_char {
    match KmmStatus::from_u32(status) {
        Some(s) => s.name().as_ptr(),
        None => c"KMM_UNKNOWN_STATUS".as_ptr(),
    }
}
