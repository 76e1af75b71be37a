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

/// With CUDA usable, an auto manager on a device CUDA does not have is an error that names the
/// device, not a host stand-in that computes on the CPU in its place (it once fell back).
#[test]
fn auto_on_a_device_cuda_lacks_is_an_error_not_a_host_stand_in() {
    if !gpu() {
        return;
    }
    let mut c = default_config();
    c.backend = KmmBackend::KMM_BACKEND_AUTO as u32;
    let mut n = 0;
    ok(kmm_device_count(c.backend, &mut n));
    assert!(n >= 1, "a GPU run sees at least one CUDA device");
    c.device = n as i32;
    let mut m = 0;
    // CUDA's message: a host stand-in's own "does not exist on the host backend" would mean
    // auto fell back to it.
    expect_err(kmm_manager_create(&c, &mut m), KMM_ERROR_BACKEND_UNAVAILABLE, &[&format!("device {n} does not exist: {n} CUDA device(s) visible")]);
    c.device = 0;
    ok(kmm_manager_create(&c, &mut m));
    let mut info = KmmManagerInfo::default();
    ok(kmm_manager_info(m, &mut info));
    assert_eq!(info.backend, KmmBackend::KMM_BACKEND_CUDA as u32, "device 0 is CUDA's");
    ok(kmm_manager_destroy(m, 0));
}
