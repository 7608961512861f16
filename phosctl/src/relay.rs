//! `phosctl vm-relay`: one guest connection carried between standard input/output and a
//! router's socket, for QEMU's user networking (`-netdev user,...,guestfwd=tcp:ADDR:PORT-cmd:
//! phosctl vm-relay --router PATH`): QEMU starts the command for each connection the guest
//! opens to ADDR:PORT, with the connection as its standard input, output and error.
//!
//! It is the VM's second way to its router, beside the vsock device: the path its channels
//! take while the device is unplugged for a migration (docs/operations.md, "Migrating a VM
//! with its GPU work"). The router sees a connection on the tenant's socket, as from the
//! VM's phos-vmm-device: the same tenant, whatever the guest says, and its channels join
//! their session by its token. Nothing is written to standard error, which is the guest's
//! connection too; `--log` names a file for the relay's own failures.

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::ExitCode;

/// Carry the connection on standard input/output to the router socket `router` until
/// either side ends it.
pub fn relay(router: &Path, log: Option<&Path>) -> ExitCode {
    let failed = |what: String| {
        if let Some(log) = log
            && let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(log)
        {
            let _ = writeln!(f, "phosctl vm-relay (pid {}): {what}", std::process::id());
        }
        ExitCode::FAILURE
    };
    // Descriptors of their own: the standard streams' buffers are not wanted here.
    let (guest_in, guest_out) =
        match (std::io::stdin().as_fd().try_clone_to_owned(), std::io::stdout().as_fd().try_clone_to_owned()) {
            (Ok(i), Ok(o)) => (std::fs::File::from(i), std::fs::File::from(o)),
            (Err(e), _) | (_, Err(e)) => return failed(format!("the guest's connection: {e}")),
        };
    match carry(guest_in, guest_out, router) {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => failed(why),
    }
}

/// Carry bytes between the guest's connection (`guest_in`, `guest_out`) and the router
/// socket `router` until the router closes (or the guest does, which makes the router close).
fn carry(guest_in: std::fs::File, guest_out: std::fs::File, router: &Path) -> Result<(), String> {
    let to_router =
        UnixStream::connect(router).map_err(|e| format!("cannot reach the router at {}: {e}", router.display()))?;
    let from_router = to_router.try_clone().map_err(|e| format!("the router's connection: {e}"))?;
    // Guest to router on a thread; its end (the guest closed) ends the router's side for
    // writing, and the router then closes, which ends the other direction.
    std::thread::spawn(move || {
        let mut guest_in = guest_in;
        let mut to_router = to_router;
        let _ = std::io::copy(&mut guest_in, &mut to_router);
        let _ = to_router.shutdown(std::net::Shutdown::Write);
    });
    let mut from_router = from_router;
    let mut guest_out = guest_out;
    let _ = std::io::copy(&mut from_router, &mut guest_out);
    // The router closed (or the guest went): the caller's leaving closes the guest's
    // connection.
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::OwnedFd;
    use std::os::unix::net::{UnixListener, UnixStream};

    /// Bytes go both ways through the relay, and it ends when the router closes.
    #[test]
    fn a_relay_carries_a_connection_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("router.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let (mut guest, relay_end) = UnixStream::pair().unwrap();
        let guest_in = std::fs::File::from(OwnedFd::from(relay_end.try_clone().unwrap()));
        let guest_out = std::fs::File::from(OwnedFd::from(relay_end));
        let relay = std::thread::spawn(move || super::carry(guest_in, guest_out, &sock));
        let (mut router, _) = listener.accept().unwrap();
        guest.write_all(b"hello router").unwrap();
        let mut got = [0u8; 12];
        router.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello router");
        router.write_all(b"welcome").unwrap();
        let mut got = [0u8; 7];
        guest.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"welcome");
        drop(router);
        assert!(relay.join().unwrap().is_ok(), "the relay ends with the router's side");
    }

    #[test]
    fn a_relay_without_its_router_fails() {
        let dir = tempfile::tempdir().unwrap();
        let (_guest, relay_end) = UnixStream::pair().unwrap();
        let guest_in = std::fs::File::from(OwnedFd::from(relay_end.try_clone().unwrap()));
        let guest_out = std::fs::File::from(OwnedFd::from(relay_end));
        let err = super::carry(guest_in, guest_out, &dir.path().join("absent.sock")).unwrap_err();
        assert!(err.contains("cannot reach the router"), "{err}");
    }
}
