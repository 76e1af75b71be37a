//! Adversarial tests (eleventh run, 2026-11-29, C ABI): each test here fails on the code it was
//! written against (82c47d3) because of a confirmed, deterministic defect.
mod common;
use common::*;

#[test]
fn a_copy_names_which_of_its_two_buffers_is_not_live() {
    // "buffer 0x… belongs to another manager" did not say whether it was dst or src.
    let (a, b) = (Mgr::new(), Mgr::new());
    let (x, y) = (a.alloc(64, DEVICE), b.alloc(64, DEVICE));
    expect_err(kmm_copy_buffer(a.0, y, 0, a.0, x, 0, 8), KMM_ERROR_INVALID_HANDLE, &["dst: ", "another manager"]);
    expect_err(kmm_copy_buffer(a.0, x, 0, a.0, y, 0, 8), KMM_ERROR_INVALID_HANDLE, &["src: ", "another manager"]);
    a.free(x);
    expect_err(kmm_copy_buffer(a.0, x, 0, b.0, y, 0, 8), KMM_ERROR_INVALID_HANDLE, &["dst: ", "not live"]);
    b.free(y);
}
