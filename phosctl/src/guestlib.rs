//! Where the guest library is, under the names applications ask for.
//!
//! The build produces one `libcudart.so`; applications need `libcudart.so.11.0`,
//! `libcudart.so.12` or `libcudart.so.13` depending on the CUDA they were built with. This
//! makes a directory of links with those names (next to the library when writable, else in
//! the temp directory) for `LD_LIBRARY_PATH`.

use std::path::{Path, PathBuf};

/// The sonames one build serves.
pub const SONAMES: &[&str] = &["libcudart.so.11.0", "libcudart.so.12", "libcudart.so.13"];

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

/// The library: `PHOS_GUEST_LIB`, else `libcudart.so` next to phosctl.
pub fn library() -> Result<PathBuf, GuestLibError> {
    if let Ok(p) = std::env::var("PHOS_GUEST_LIB") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(GuestLibError::NoExecutable)?;
    let lib = exe.with_file_name("libcudart.so");
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
