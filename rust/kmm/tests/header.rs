//! gen/kmm.h is generated from the crate by cbindgen and committed; this test fails when it is
//! stale. `KMM_BLESS=1` rewrites it.

use std::path::PathBuf;

#[test]
fn header_is_current() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let header_path = crate_dir.join("../../gen/kmm.h");
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen")
        .write(&mut generated);
    let generated = String::from_utf8(generated).unwrap();
    if std::env::var_os("KMM_BLESS").is_some() {
        std::fs::write(&header_path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&header_path).unwrap_or_default();
    assert!(
        committed == generated,
        "gen/kmm.h is stale: regenerate it with KMM_BLESS=1 cargo test -p kmm --test header"
    );
}
