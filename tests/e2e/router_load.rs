//! How many channels and sessions one router serves on this machine, and what they cost it
//! (memory, threads, descriptors). Opt-in, being heavy and a measurement rather than a
//! check: `cargo test -p phos-tests --test router_load -- --ignored --nocapture`; the
//! figures go to docs/perf.md. `PHOS_LOAD_TENANTS`, `PHOS_LOAD_SESSIONS` (per tenant) and
//! `PHOS_LOAD_CHANNELS` (per session) size the run; `PHOS_LOAD_SHM=1` puts the channels on
//! shared-memory rings.

use std::time::Instant;

use phos_protocol::cudart::{CudaFreeRequest, CudaMallocRequest};
use phos_tests::{ChildRouter, RawGuest};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn channels_and_sessions_one_router_serves() {
    let (tenants, sessions, channels) =
        (env("PHOS_LOAD_TENANTS", 4), env("PHOS_LOAD_SESSIONS", 5), env("PHOS_LOAD_CHANNELS", 100));
    let shm = std::env::var("PHOS_LOAD_SHM").as_deref() == Ok("1");
    let mut config = String::from("[limits]\nchannels_per_tenant = 100000\nsessions_per_tenant = 1000\n");
    for t in 0..tenants {
        config.push_str(&format!("[[tenant]]\nname = \"t{t}\"\nsocket = \"{{dir}}/t{t}.sock\"\n"));
    }
    let mut router = ChildRouter::start(&config, || Ok(()));
    let (rss0, threads0, fds0) = (router.rss_bytes(), router.threads(), fds(&router));
    let started = Instant::now();
    let mut open: Vec<Box<dyn FnMut() -> i32>> = Vec::new();
    for t in 0..tenants {
        let socket = router.tenant_socket(&format!("t{t}"));
        for _ in 0..sessions {
            let mut token = None;
            for _ in 0..channels {
                let call: Box<dyn FnMut() -> i32> = if shm {
                    let mut g = RawGuest::connect_shm(&socket, token, None).expect("a channel");
                    token = Some(g.welcome.token);
                    Box::new(move || round_trip(&mut g))
                } else {
                    let mut g = RawGuest::connect(&socket, token).expect("a channel");
                    token = Some(g.welcome.token);
                    Box::new(move || round_trip(&mut g))
                };
                open.push(call);
            }
        }
    }
    let opened = started.elapsed();
    // Every channel carries a call, so every one is really served.
    let started = Instant::now();
    for c in &mut open {
        assert_eq!(c(), 0);
    }
    let called = started.elapsed();
    let (rss, threads, fds1) = (router.rss_bytes(), router.threads(), fds(&router));
    // What the channels cost the router once they have been idle for a while.
    std::thread::sleep(std::time::Duration::from_secs(10));
    let cpu = router.cpu_seconds();
    std::thread::sleep(std::time::Duration::from_secs(5));
    let idle_cpu = (router.cpu_seconds() - cpu) / 5.0;
    let n = open.len();
    println!(
        "| {} | {} | {} | {:.1} MiB ({:.1} KiB each) | {} ({:.2} each) | {} ({:.2} each) | {:.2} s | {:.0} µs | {:.1}% |",
        if shm { "shm" } else { "unix" },
        tenants * sessions,
        n,
        rss as f64 / (1 << 20) as f64,
        (rss.saturating_sub(rss0)) as f64 / 1024.0 / n as f64,
        threads,
        (threads - threads0) as f64 / n as f64,
        fds1,
        (fds1 - fds0) as f64 / n as f64,
        opened.as_secs_f64(),
        called.as_secs_f64() * 1e6 / n as f64,
        idle_cpu * 100.0,
    );
    assert!(router.alive());
}

fn round_trip<T: phos_protocol::transport::Transport>(g: &mut RawGuest<T>) -> i32 {
    match g.call(&CudaMallocRequest { size: 256 }) {
        Ok(r) => match g.call(&CudaFreeRequest { devPtr: r.devPtr }) {
            Ok(_) => 0,
            Err(e) => e,
        },
        Err(e) => e,
    }
}

fn fds(router: &ChildRouter) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", router.child.id())).map_or(0, |d| d.count())
}
