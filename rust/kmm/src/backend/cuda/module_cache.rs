//! The on-disk cache of compiled modules: one file per key under `$KMM_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/kmm`, else `~/.cache/kmm`. Failures to read or write it only cost a
//! recompilation.

use std::path::PathBuf;

/// FNV-1a over every input that changes the compiled image (stable across builds, unlike
/// `DefaultHasher`).
pub fn key(src: &str, opts: &[String], arch: (i32, i32), nvrtc: (i32, i32)) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    };
    eat(src.as_bytes());
    for o in opts {
        eat(o.as_bytes());
    }
    eat(format!("sm_{}{} nvrtc {}.{} kmm {}", arch.0, arch.1, nvrtc.0, nvrtc.1, env!("CARGO_PKG_VERSION")).as_bytes());
    h
}

pub fn dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("KMM_CACHE_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d).join("kmm"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("kmm"))
}

fn path(key: u64) -> Option<PathBuf> {
    dir().map(|d| d.join(format!("{key:016x}.bin")))
}

pub fn read(key: u64) -> Option<Vec<u8>> {
    let data = std::fs::read(path(key)?).ok()?;
    (!data.is_empty()).then_some(data)
}

/// Writes through a temporary file and a rename, so a concurrent reader never sees half a file.
pub fn write(key: u64, image: &[u8]) {
    let Some(path) = path(key) else { return };
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = dir.join(format!("{key:016x}.{}.tmp", std::process::id()));
    if std::fs::write(&tmp, image).is_ok() && std::fs::rename(&tmp, &path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_depends_on_every_input_and_files_round_trip() {
        let opts = vec!["-DNS=32".to_string()];
        let k = key("src", &opts, (9, 0), (13, 0));
        assert_eq!(k, key("src", &opts, (9, 0), (13, 0)), "stable");
        assert_ne!(k, key("src ", &opts, (9, 0), (13, 0)));
        assert_ne!(k, key("src", &["-DNS=33".to_string()], (9, 0), (13, 0)));
        assert_ne!(k, key("src", &opts, (8, 0), (13, 0)));
        assert_ne!(k, key("src", &opts, (9, 0), (12, 8)));
        // Option boundaries count: ["ab"] and ["a", "b"] differ.
        assert_ne!(key("s", &["ab".into()], (9, 0), (13, 0)), key("s", &["a".into(), "b".into()], (9, 0), (13, 0)));
        let dir = std::env::temp_dir().join(format!("kmm-cache-test-{}", std::process::id()));
        std::env::set_var("KMM_CACHE_DIR", &dir);
        assert_eq!(super::dir(), Some(dir.clone()));
        write(k, b"image");
        assert_eq!(read(k).as_deref(), Some(&b"image"[..]));
        assert_eq!(read(k ^ 1), None);
        std::env::remove_var("KMM_CACHE_DIR");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
