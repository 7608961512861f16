//! Where the guest library is, under the names applications ask for.
//!
//! The build produces one `libphos_guest.so` carrying every API Phos serves; applications ask
//! for `libcudart.so.11.0`, `libcudart.so.12` or `libcudart.so.13` (the runtime, depending on
//! the CUDA they were built with) and `libcuda.so.1` (the driver). This makes a directory of
//! symbolic links with those names (next to the library when writable, else in the temp
//! directory) for `LD_LIBRARY_PATH`. Links, not copies: the dynamic loader loads a file once
//! however many names reach it, so a program that uses both APIs gets one copy of the guest
//! library, hence one session.

use std::path::{Path, PathBuf};

/// The file the build produces.
pub const LIBRARY: &str = "libphos_guest.so";

/// The sonames one build serves.
pub const SONAMES: &[&str] = &["libcudart.so.11.0", "libcudart.so.12", "libcudart.so.13", "libcuda.so.1"];

/// Why the guest library cannot be offered to a program.
#[derive(Debug, thiserror::Error)]
pub enum GuestLibError {
    #[error("cannot find phosctl's own executable: {0}")]
    NoExecutable(std::io::Error),
    #[error("{} does not exist (build phos-guestlib)", .0.display())]
    Missing(PathBuf),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

/// The library: `PHOS_GUEST_LIB`, else `libphos_guest.so` next to phosctl.
pub fn library() -> Result<PathBuf, GuestLibError> {
    if let Ok(p) = std::env::var("PHOS_GUEST_LIB") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(GuestLibError::NoExecutable)?;
    let lib = exe.with_file_name(LIBRARY);
    if lib.exists() { Ok(lib) } else { Err(GuestLibError::Missing(lib)) }
}

fn populate(dir: &Path, lib: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for name in SONAMES {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(lib, &link)?;
    }
    Ok(())
}

/// A directory holding the library under every soname.
pub fn prepare() -> Result<PathBuf, GuestLibError> {
    let lib = library()?;
    let lib = lib.canonicalize().map_err(|source| GuestLibError::Io { path: lib.clone(), source })?;
    let beside = lib.parent().map(|d| d.join("phos-guest"));
    if let Some(dir) = beside
        && populate(&dir, &lib).is_ok()
    {
        return Ok(dir);
    }
    let dir = std::env::temp_dir().join(format!("phos-guest-{}", std::process::id()));
    populate(&dir, &lib).map_err(|source| GuestLibError::Io { path: dir.clone(), source })?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    /// Every soname leads to the one library file.
    #[test]
    fn each_soname_is_a_link_to_the_library() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join(super::LIBRARY);
        std::fs::write(&lib, b"not really a library").unwrap();
        let links = dir.path().join("links");
        super::populate(&links, &lib).unwrap();
        for name in super::SONAMES {
            let link = links.join(name);
            assert_eq!(std::fs::read_link(&link).unwrap(), lib, "{name}");
        }
        assert!(super::SONAMES.contains(&"libcuda.so.1"));
    }
}
