//! The APIs of one guest library: where their shared file must not be mistaken for NVIDIA's.

use phos_tests::built;

/// The guest library exports the driver API too, so a server started where `libcuda.so`
/// resolves to it (LD_LIBRARY_PATH set to a directory of guest links) would call its own
/// guest: the cuda backend sees it for what it is and says so.
#[test]
fn the_server_refuses_the_guest_library_as_its_driver() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["libcuda.so", "libcuda.so.1"] {
        std::os::unix::fs::symlink(built("libphos_guest.so"), dir.path().join(name)).unwrap();
    }
    let out = std::process::Command::new(built("phos-api-server"))
        .args(["--backend", "cuda", "--session", "1", "--listen"])
        .arg(dir.path().join("server.sock"))
        .env("LD_LIBRARY_PATH", dir.path())
        .output()
        .expect("running phos-api-server");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("is Phos's guest library, not NVIDIA's driver"), "{stderr}");
}
