//! KMM_BACKEND decides when the config says auto. Its own test binary: it sets the variable.
mod common;
use common::*;

#[test]
fn kmm_backend_variable_is_honoured_and_checked() {
    if gpu() {
        return;
    }
    let mut c = default_config();
    c.backend = KmmBackend::KMM_BACKEND_AUTO as u32;
    let mut m = 0;
    std::env::set_var("KMM_BACKEND", "cuda");
    expect_err(kmm_manager_create(&c, &mut m), KMM_ERROR_BACKEND_UNAVAILABLE, &["CUDA driver"]);
    std::env::set_var("KMM_BACKEND", "gpu");
    expect_err(kmm_manager_create(&c, &mut m), KMM_ERROR_INVALID_ARGUMENT, &["KMM_BACKEND=\"gpu\""]);
    std::env::set_var("KMM_BACKEND", "host");
    ok(kmm_manager_create(&c, &mut m));
    ok(kmm_manager_destroy(m, 0));
    std::env::remove_var("KMM_BACKEND");
}
