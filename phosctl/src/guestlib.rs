//! Where the guest library is, under the names applications ask for.
//!
//! The build produces one `libphos_guest.so` carrying every API Phos serves; applications ask
//! for `libcudart.so.11.0`, `libcudart.so.12` or `libcudart.so.13` (the runtime, depending on
//! the CUDA they were built with) and `libcuda.so.1` (the driver). This makes a directory of
//! symbolic links with those names (next to the library when writable, else in the temp
//! directory) for `LD_LIBRARY_PATH`. Links, not copies: the dynamic loader loads a file once
//! however many names reach it, so a program that uses both APIs gets one copy of the guest
//! library, hence one session.
//!
//! `LD_LIBRARY_PATH` is not enough to make a program's CUDA libraries Phos's: a library's
//! `DT_RPATH` is searched before it, and a library loaded by its full path (PyTorch preloads
//! its wheels' `nvidia/*/lib` libraries so) is not searched for at all. So `phosctl run` also
//! names the audit module (`libphos_audit.so`, the `phos-guest-audit` crate) in `LD_AUDIT`:
//! the dynamic loader asks it before every search, and it answers each CUDA runtime or driver
//! name with Phos's file in this directory ([`Offer::dir`], `PHOS_GUEST_DIR`).

use std::path::{Path, PathBuf};

/// The file the build produces.
pub const LIBRARY: &str = "libphos_guest.so";

/// The audit module's file, found beside the guest library.
pub const AUDIT_MODULE: &str = "libphos_audit.so";

/// The sonames one build serves.
pub const SONAMES: &[&str] = &[
    "libcudart.so.11.0",
    "libcudart.so.12",
    "libcudart.so.13",
    "libcuda.so.1",
    "libcublas.so.11",
    "libcublas.so.12",
    "libcublas.so.13",
    "libcurand.so.10",
    "libcusolver.so.11",
    "libcusolver.so.12",
    "libcusparse.so.11",
    "libcusparse.so.12",
    "libcudnn.so.9",
    "libcudnn_graph.so.9",
    "libcudnn_ops.so.9",
    "libcudnn_cnn.so.9",
    "libcudnn_adv.so.9",
    "libcudnn_ext.so.9",
    "libcublasLt.so.11",
    "libcublasLt.so.12",
    "libcublasLt.so.13",
    "libcufft.so.10",
    "libcufft.so.11",
    "libcufft.so.12",
    "libnvidia-ml.so.1",
];

/// Why the guest library cannot be offered to a program.
#[derive(Debug, thiserror::Error)]
pub enum GuestLibError {
    #[error("cannot find phosctl's own executable: {0}")]
    NoExecutable(std::io::Error),
    #[error("{} does not exist (build {crate_name}, or set {variable})", path.display())]
    Missing { path: PathBuf, crate_name: &'static str, variable: &'static str },
    #[error("{}: the audit module's path cannot hold `:` (LD_AUDIT is a list separated by colons)", .0.display())]
    AuditPath(PathBuf),
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
    if lib.exists() {
        Ok(lib)
    } else {
        Err(GuestLibError::Missing { path: lib, crate_name: "phos-guestlib", variable: "PHOS_GUEST_LIB" })
    }
}

/// The audit module: `PHOS_AUDIT_LIB`, else `libphos_audit.so` beside the guest library
/// `lib`; an absolute path, as `LD_AUDIT` takes it.
pub fn audit_module(lib: &Path) -> Result<PathBuf, GuestLibError> {
    let module = match std::env::var_os("PHOS_AUDIT_LIB") {
        Some(p) => PathBuf::from(p),
        None => lib.with_file_name(AUDIT_MODULE),
    };
    let module = module.canonicalize().map_err(|_| GuestLibError::Missing {
        path: module.clone(),
        crate_name: "phos-guest-audit",
        variable: "PHOS_AUDIT_LIB",
    })?;
    if module.as_os_str().as_encoded_bytes().contains(&b':') {
        return Err(GuestLibError::AuditPath(module));
    }
    Ok(module)
}

/// What `phosctl run` offers a program: the guest library under every soname, and the audit
/// module that makes the program's CUDA libraries those.
pub struct Offer {
    /// Phos's guest library under every name it serves (`LD_LIBRARY_PATH`, `PHOS_GUEST_DIR`).
    pub dir: PathBuf,
    /// The audit module (`LD_AUDIT`).
    pub audit: PathBuf,
}

/// Make every soname in `dir` a link to `lib`. Other `phosctl run`s may be loading programs
/// through the same directory at this moment: a link already right is left alone, and one to
/// change is replaced in one step (a new link renamed over it), never removed first (a
/// program loading then found the name missing, bypassed Phos for that library and said so).
fn populate(dir: &Path, lib: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for name in SONAMES {
        let link = dir.join(name);
        if std::fs::read_link(&link).is_ok_and(|to| to == lib) {
            continue;
        }
        let new = dir.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&new);
        std::os::unix::fs::symlink(lib, &new)?;
        std::fs::rename(&new, &link)?;
    }
    Ok(())
}

/// A directory holding the library under every soname, and the audit module.
pub fn prepare() -> Result<Offer, GuestLibError> {
    let lib = library()?;
    let lib = lib.canonicalize().map_err(|source| GuestLibError::Io { path: lib.clone(), source })?;
    let audit = audit_module(&lib)?;
    let beside = lib.parent().map(|d| d.join("phos-guest"));
    if let Some(dir) = beside
        && populate(&dir, &lib).is_ok()
    {
        return Ok(Offer { dir, audit });
    }
    let dir = std::env::temp_dir().join(format!("phos-guest-{}", std::process::id()));
    populate(&dir, &lib).map_err(|source| GuestLibError::Io { path: dir.clone(), source })?;
    Ok(Offer { dir, audit })
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
        // A link to something else is replaced; the rest stay as they are.
        let other = dir.path().join("other");
        std::fs::write(&other, b"").unwrap();
        let first = links.join(super::SONAMES[0]);
        std::fs::remove_file(&first).unwrap();
        std::os::unix::fs::symlink(&other, &first).unwrap();
        super::populate(&links, &lib).unwrap();
        assert_eq!(std::fs::read_link(&first).unwrap(), lib);
        let left: Vec<_> = std::fs::read_dir(&links).unwrap().filter_map(|e| e.ok()).collect();
        assert_eq!(left.len(), super::SONAMES.len(), "no temporary link left behind");
    }
}
