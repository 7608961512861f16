//! Routers as members of a fleet on the emu backend: a router configured with its peers lists
//! their sessions beside its own (`phosctl sessions --all`), one over TCP with the shared
//! secret, one over its Unix socket; a peer that does not answer is named on standard error
//! and the rest still listed, with exit status 7.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use phos_router::fleet::Peer;
use phos_tests::{TestRouter, build_program, built, nvcc};

const SECRET: &[u8] = b"fleet-test-shared-secret";

fn secret() -> phos_control::peer::Secret {
    phos_control::peer::Secret::new(SECRET).unwrap()
}

fn sessions_all(router: &TestRouter) -> Output {
    Command::new(built("phosctl"))
        .args(["sessions", "--all", "--router"])
        .arg(format!("unix:{}", router.socket().display()))
        .output()
        .expect("running phosctl")
}

fn start_guest(router: &TestRouter, exe: &Path) -> Child {
    Command::new(built("phosctl"))
        .args(["run", "--endpoint"])
        .arg(format!("unix:{}", router.socket().display()))
        .arg("--")
        .arg(exe)
        .args(["1000", "30"])
        .env("PHOS_GUEST_LIB", built("libphos_guest.so"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn wait_for_sessions(router: &TestRouter, n: usize) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ids: Vec<u64> = router.router.sessions().iter().map(|s| s.id).collect();
        if ids.len() >= n {
            return ids;
        }
        assert!(Instant::now() < deadline, "{n} sessions did not appear");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// (router, id, pid) of each session row of a `sessions --all` listing.
fn rows(listing: &str) -> Vec<(String, u64, u32)> {
    let mut lines = listing.lines();
    let header: Vec<&str> = lines.next().expect("a header").split_whitespace().collect();
    assert_eq!(&header[..3], ["router", "id", "tenant"], "{listing}");
    lines
        .filter(|l| !l.trim_start().starts_with("bypass:"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].to_string(), f[1].parse().unwrap(), f[4].parse().unwrap())
        })
        .collect()
}

/// Router A knows B (over TCP) and C (over its Unix socket): one listing at A shows the
/// sessions of all three, each with the router that holds it. Once C is gone, the listing
/// names C on standard error, still lists A's and B's, and exits with 7.
#[test]
fn sessions_all_lists_every_router_of_the_fleet_and_names_a_dead_one() {
    let Some(nvcc) = nvcc() else { return };
    let exe = build_program(&nvcc, "iterative", &["-arch=sm_70"]);
    let b = TestRouter::start_with("emu", |c| {
        c.peer_listen = Some("127.0.0.1:0".parse().unwrap());
        c.peer_secret = Some(secret());
    });
    let c = TestRouter::start("emu");
    let b_endpoint = format!("tcp:{}", b.router.peer_addr().unwrap());
    let c_endpoint = format!("unix:{}", c.socket().display());
    let a = TestRouter::start_with("emu", |conf| {
        conf.name = Some("router-a".into());
        conf.peer_secret = Some(secret());
        conf.peers =
            vec![format!("router-b={b_endpoint}").parse::<Peer>().unwrap(), c_endpoint.parse::<Peer>().unwrap()];
    });
    let mut guests = vec![start_guest(&a, &exe), start_guest(&b, &exe), start_guest(&b, &exe), start_guest(&c, &exe)];
    let at_a = wait_for_sessions(&a, 1);
    let at_b = wait_for_sessions(&b, 2);
    let at_c = wait_for_sessions(&c, 1);

    let out = sessions_all(&a);
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}\n{listing}", String::from_utf8_lossy(&out.stderr));
    let listed = rows(&listing);
    let ids_of = |router: &str| -> Vec<u64> {
        let mut ids: Vec<u64> = listed.iter().filter(|r| r.0 == router).map(|r| r.1).collect();
        ids.sort();
        ids
    };
    assert_eq!(ids_of("router-a"), at_a, "{listing}");
    assert_eq!(ids_of("router-b"), at_b, "{listing}");
    assert_eq!(ids_of(&c_endpoint), at_c, "{listing}");
    assert_eq!(listed.len(), 4, "{listing}");
    // Each row is the session of the process that router holds.
    let pid_of = |r: &TestRouter, id: u64| r.router.session(id).unwrap().pid;
    assert!(listed.iter().any(|row| row.0 == "router-b" && row.2 == pid_of(&b, at_b[1])), "{listing}");

    // C goes away with its program.
    let mut c_guest = guests.pop().unwrap();
    let _ = c_guest.kill();
    let _ = c_guest.wait();
    drop(c);
    let out = sessions_all(&a);
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(7), "{err}\n{listing}");
    assert!(err.contains(&format!("router {c_endpoint} ({c_endpoint}) did not answer")), "{err}");
    assert!(err.contains("1 of 3 routers did not answer"), "{err}");
    let listed = rows(&listing);
    assert_eq!(listed.iter().filter(|r| r.0 == "router-a").count(), 1, "{listing}");
    assert_eq!(listed.iter().filter(|r| r.0 == "router-b").count(), 2, "{listing}");
    assert_eq!(listed.len(), 3, "{listing}");

    // A peer with another secret refuses, and is named so.
    let d = TestRouter::start_with("emu", |conf| {
        conf.peer_listen = Some("127.0.0.1:0".parse().unwrap());
        conf.peer_secret = Some(phos_control::peer::Secret::new(b"another-secret-altogether").unwrap());
    });
    let d_endpoint = format!("tcp:{}", d.router.peer_addr().unwrap());
    let e = TestRouter::start_with("emu", |conf| {
        conf.peer_secret = Some(secret());
        conf.peers = vec![format!("d={d_endpoint}").parse::<Peer>().unwrap()];
    });
    let out = sessions_all(&e);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(7), "{err}");
    assert!(err.contains(&format!("router d ({d_endpoint}) did not answer")) && err.contains("secret"), "{err}");

    for mut g in guests {
        let _ = g.kill();
        let _ = g.wait();
    }
}
