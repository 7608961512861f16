//! The router as the place where tenants are policed, on the emu backend: quotas, the
//! shipped eBPF policies (rate limits, fair share), policies swapped while guests run,
//! policies that fault or run too long, and tenants that try each other's sessions, handles
//! and memory.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use phos_control::{KernelCheck, PolicyLoad};
use phos_protocol::cudart::*;
use phos_protocol::{CudaError, Ptr};
use phos_router::tenants::Amount;
use phos_router::{RouterConfig, TenantConfig};
use phos_tests::{RawGuest, TestRouter, build_policy, build_program, build_program_from, built, nvcc, shipped_policy};

/// A tenant with a socket of its own in the router's directory.
fn tenant(config: &RouterConfig, name: &str, quota_bytes: Option<u64>) -> TenantConfig {
    TenantConfig {
        name: name.into(),
        uids: vec![],
        socket: Some(config.listen.with_file_name(format!("{name}.sock"))),
        share: 1,
        quota: quota_bytes.map(|q| [("device_memory".to_string(), Amount(q))].into()).unwrap_or_default(),
        token: None,
    }
}

fn tenant_socket(router: &TestRouter, name: &str) -> std::path::PathBuf {
    let path = router.socket().with_file_name(format!("{name}.sock"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(Instant::now() < deadline, "tenant socket {} did not appear", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
    path
}

fn load(
    router: &TestRouter,
    name: &str,
    elf: &[u8],
    params: &[&str],
    kernel_check: KernelCheck,
) -> Result<(), phos_control::ControlError> {
    router
        .router
        .load_policy(
            PolicyLoad {
                name: name.into(),
                source: format!("test:{name}"),
                elf: elf.to_vec(),
                params: params.iter().map(|s| s.to_string()).collect(),
                kernel_check,
            },
            &phos_control::Cancel::default(),
        )
        .map(|_| ())
}

fn malloc(g: &mut RawGuest, size: u64) -> Result<u64, i32> {
    g.call(&CudaMallocRequest { size }).map(|r| r.devPtr)
}

fn usage_of(router: &TestRouter, tenant: &str) -> phos_control::TenantUsage {
    router.router.tenants.usage().into_iter().find(|t| t.name == tenant).expect("tenant known")
}

fn held_memory(router: &TestRouter, tenant: &str) -> u64 {
    usage_of(router, tenant).resources.iter().find(|r| r.0 == "device_memory").unwrap().2
}

/// The router reads a call's API from its frame and charges it from that API's cost table: the
/// driver API's function with cudaMalloc's id, carrying cudaMalloc's request for more than the
/// quota, is no allocation (the server answers it as the function it is), while the same
/// frame of the runtime API is refused by the quota.
#[test]
fn a_call_is_charged_by_its_api() {
    use phos_protocol::cuda;
    let router = TestRouter::start_with("emu", |c| {
        let t = tenant(c, "small", Some(64 << 20));
        c.tenants = vec![t];
    });
    let mut g = RawGuest::connect(&tenant_socket(&router, "small"), None).unwrap();
    let session = g.welcome.session;
    let id = FunctionId::CudaMalloc as u32;
    let driver_function = cuda::FunctionId::from_u32(id).expect("the driver API has a function of cudaMalloc's id");
    // Not a function the server carries (the guest library implements it, or nobody does).
    assert_ne!(driver_function.info().exec, phos_protocol::spec::Exec::Remote, "{}", driver_function.name());
    let request = phos_protocol::encode(&CudaMallocRequest { size: 128 << 20 });
    let r = g.call_raw_api(cuda::API_ID, id, session, &request).unwrap();
    assert_eq!(r.status, cuda::NOT_SUPPORTED.0, "{} is answered by the server", driver_function.name());
    assert_eq!((usage_of(&router, "small").rejected, held_memory(&router, "small")), (0, 0));
    let r = g.call_raw_api(phos_protocol::cudart::API_ID, id, session, &request).unwrap();
    assert_eq!(r.status, CudaError::MemoryAllocation.0, "cudaMalloc past the quota");
    assert_eq!(usage_of(&router, "small").rejected, 1);
}

#[test]
fn an_allocation_past_the_quota_fails_as_out_of_memory_and_frees_give_it_back() {
    let router = TestRouter::start_with("emu", |c| {
        let t = tenant(c, "small", Some(64 << 20));
        c.tenants = vec![t];
    });
    let mut g = RawGuest::connect(&tenant_socket(&router, "small"), None).unwrap();
    let a = malloc(&mut g, 32 << 20).expect("within the quota");
    let b = malloc(&mut g, 16 << 20).expect("within the quota");
    assert_eq!(held_memory(&router, "small"), 48 << 20);
    // 48 + 32 MiB > 64 MiB: refused as a full device would refuse it.
    assert_eq!(malloc(&mut g, 32 << 20), Err(CudaError::MemoryAllocation.0));
    // Nothing else broke: the session's memory is usable.
    g.call(&CudaMemsetRequest { devPtr: b, value: 7, count: 16 << 20 }).expect("memset");
    // A free gives the budget back.
    g.call(&CudaFreeRequest { devPtr: a }).expect("free");
    assert_eq!(held_memory(&router, "small"), 16 << 20);
    let c = malloc(&mut g, 32 << 20).expect("fits again after the free");
    assert_ne!(c, 0);
    assert_eq!(usage_of(&router, "small").rejected, 1);
    // Another tenant is not bound by it.
    let mut other = RawGuest::connect(&router.socket(), None).unwrap();
    malloc(&mut other, 128 << 20).expect("the other tenant has no quota");
    // A session that ends gives back what it held.
    drop(g);
    let deadline = Instant::now() + Duration::from_secs(20);
    while held_memory(&router, "small") != 0 {
        assert!(Instant::now() < deadline, "the ended session's memory still counts");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_rate_limit_policy_holds_copies_to_their_rate() {
    let Some(elf) = shipped_policy("rate_limit") else { return };
    let router = TestRouter::start("emu");
    let mut g = RawGuest::connect(&router.socket(), None).unwrap();
    let buf = malloc(&mut g, 1 << 20).unwrap();
    let data = vec![1u8; 1 << 20];
    let copy = |g: &mut RawGuest| {
        g.call(&CudaMemcpyRequest {
            dst: Ptr::Device(buf),
            src: Ptr::In(&data),
            count: 1 << 20,
            kind: consts::cudaMemcpyHostToDevice,
            direction: consts::cudaMemcpyHostToDevice,
        })
        .expect("copy")
    };
    // Unpoliced, eight 1 MiB copies take well under the time the limit will impose.
    let started = Instant::now();
    for _ in 0..8 {
        copy(&mut g);
    }
    let free_run = started.elapsed();
    load(&router, "rate", elf, &["bytes_per_s=8MiB", "bytes_burst=1MiB"], KernelCheck::Skip).unwrap();
    let started = Instant::now();
    for _ in 0..8 {
        copy(&mut g);
    }
    let limited = started.elapsed();
    // The burst covers the first copy; the other 7 MiB go at 8 MiB/s: about 0.875 s.
    assert!(limited >= Duration::from_millis(800), "8 MiB at 8 MiB/s took {limited:?}");
    assert!(limited < Duration::from_secs(5) + free_run, "{limited:?}");
    let t = usage_of(&router, "uid:0");
    assert!(t.delayed >= 6, "{t:?}");
    // Unloaded, the limit is gone at once.
    router.router.policies.unload("rate").unwrap();
    let started = Instant::now();
    for _ in 0..8 {
        copy(&mut g);
    }
    assert!(started.elapsed() < limited / 2, "{:?} after the unload", started.elapsed());
}

#[test]
fn the_rate_limit_policy_holds_a_real_program_to_its_launch_rate() {
    let (Some(nvcc), Some(elf)) = (nvcc(), shipped_policy("rate_limit")) else { return };
    let exe = build_program(&nvcc, "iterative", &["-arch=sm_70"]);
    let router = TestRouter::start("emu");
    load(&router, "rate", elf, &["launches_per_s=100", "launch_burst=10"], KernelCheck::Auto).unwrap();
    let started = Instant::now();
    let out = run_guest(&router.socket(), &exe, &["60", "0"]);
    let took = started.elapsed();
    // 60 launches, 10 from the burst, 50 at 100/s: at least half a second.
    assert!(took >= Duration::from_millis(450), "60 launches at 100/s took {took:?}");
    assert!(out.contains("iteration 60"), "{out}");
    let launches = usage_of(&router, "uid:0").resources.iter().find(|r| r.0 == "kernel_launches").unwrap().2;
    assert_eq!(launches, 60);
}

/// What the `queue_probe` policy saw of `tenant`'s launches: (launches, launches while the
/// tenant had kernels queued but for those another thread waited for, most kernels queued,
/// launches another thread waited for).
fn probed(router: &TestRouter, tenant: &str) -> (u64, u64, u64, u64) {
    let index = usage_of(router, tenant).index as u32;
    let v = router.router.policies.map_lookup("probe", "seen", &index.to_le_bytes()).unwrap().expect("an entry");
    let word = |i: usize| u64::from_le_bytes(v[i * 8..i * 8 + 8].try_into().unwrap());
    (word(0), word(1), word(2), word(3))
}

fn device_time(router: &TestRouter, tenant: &str) -> u64 {
    usage_of(router, tenant).resources.iter().find(|r| r.0 == "device_time").unwrap().2
}

#[test]
fn fair_share_lets_a_tenant_ahead_keep_one_kernel_queued() {
    let (Some(nvcc), Some(fair), Some(probe)) = (nvcc(), shipped_policy("fair_share"), build_policy("queue_probe"))
    else {
        return;
    };
    // Four threads, each launching kernels in runs of eight before it waits for them (and,
    // with a barrier, for the others' launches before its own).
    let exe = build_program(&nvcc, "stream_traffic", &["-arch=sm_70"]);
    let router = TestRouter::start_with("emu", |c| c.tenants = vec![tenant(c, "a", None), tenant(c, "b", None)]);
    let socket = tenant_socket(&router, "a");
    let traffic = || {
        let started = Instant::now();
        run_guest(&socket, &exe, &["40"]);
        // A launch held for a queue that cannot drain (its kernels behind a barrier waiting
        // for that launch) would hold the program until the barrier gives up, after 30 s.
        let took = started.elapsed();
        assert!(took < Duration::from_secs(15), "the program took {took:?}: {}", router.server_logs());
    };
    // The probe sees the launches that reach it.
    load(&router, "probe", &probe, &[], KernelCheck::Skip).unwrap();
    traffic();
    let (launches, queued, most, _) = probed(&router, "a");
    assert!(queued * 5 > launches && most > 1, "unpoliced: {launches} launches, {queued} with kernels queued");
    // Tenant "b" stays active without using the device: "a" is soon ahead of it, and stays
    // so. Past the slack it would be stopped; with no hold, it is only braked. (However
    // late the starved machine lets "b" call, it is not taken to have gone idle.)
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let b = {
        let (stop, mut g) = (stop.clone(), RawGuest::connect(&tenant_socket(&router, "b"), None).unwrap());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                g.call(&CudaGetDeviceCountRequest {}).unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    router.router.policies.unload("probe").unwrap();
    load(
        &router,
        "fair",
        fair,
        &["quantum_ns=0", "slack_ns=1000s", "brake_ns=2ms", "hold_div=0", "idle_ns=1000s"],
        KernelCheck::Skip,
    )
    .unwrap();
    // Once ahead (after a first run), "a" stays ahead; chained after fair_share, the probe
    // sees the launches it lets through in a second one.
    traffic();
    let delayed = usage_of(&router, "a").delayed;
    load(&router, "probe", &probe, &[], KernelCheck::Skip).unwrap();
    traffic();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    b.join().unwrap();
    let (launches, queued, most, awaited) = probed(&router, "a");
    let report = format!(
        "braked: {launches} launches, {queued} with kernels queued (at most {most}), {awaited} waited for by \
         another thread; {} delayed",
        usage_of(&router, "a").delayed - delayed
    );
    // Every launch went with no kernel of its own queued, but those another thread waited
    // for, and it was held back to get there.
    assert!(launches == 160 && queued == 0, "{report}");
    assert!(usage_of(&router, "a").delayed > delayed && usage_of(&router, "b").delayed == 0, "{report}");
}

#[test]
fn fair_share_moves_device_time_towards_the_shares() {
    let (Some(nvcc), Some(fair)) = (nvcc(), shipped_policy("fair_share")) else { return };
    // The fairness benchmark's load: one thread keeping two batches of kernels queued.
    let bench = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench");
    let exe = build_program_from(&nvcc, &bench, "tenant_load", &["-arch=sm_70"]);
    // Tenant "b" is worth three of "a".
    let router = TestRouter::start_with("emu", |c| {
        let a = tenant(c, "a", None);
        let mut b = tenant(c, "b", None);
        b.share = 3;
        c.tenants = vec![a, b];
    });
    load(&router, "fair", fair, &[], KernelCheck::Skip).unwrap();
    let logs = tempfile::tempdir().unwrap();
    let guests: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|t| {
            let (socket, exe, log) = (tenant_socket(&router, t), exe.clone(), logs.path().join(t));
            // Kernels of about 0.3 ms on emu, for 3 s.
            std::thread::spawn(move || run_guest(&socket, &exe, &["run", "20", "3", log.to_str().unwrap()]))
        })
        .collect();
    // A window while both run, once they are under way.
    std::thread::sleep(Duration::from_millis(700));
    let before = [device_time(&router, "a"), device_time(&router, "b")];
    std::thread::sleep(Duration::from_millis(1500));
    let (a, b) = (device_time(&router, "a") - before[0], device_time(&router, "b") - before[1]);
    let (a_delayed, b_delayed) = (usage_of(&router, "a").delayed, usage_of(&router, "b").delayed);
    for g in guests {
        assert!(g.join().unwrap().starts_with("kernels "));
    }
    let report = format!("a: {a} ns, {a_delayed} delayed; b: {b} ns, {b_delayed} delayed");
    // "a" gets near its weight (1 in 4; unpoliced, on two cores, each would have about
    // half), the two taking turns on the device.
    assert!(a * 100 < (a + b) * 35 && a * 100 > (a + b) * 15, "{report}");
}

/// Run a program through `phosctl run --endpoint`, returning its stdout; it must succeed.
fn run_guest(socket: &Path, exe: &Path, args: &[&str]) -> String {
    let out = Command::new(built("phosctl"))
        .args(["run", "--endpoint"])
        .arg(format!("unix:{}", socket.display()))
        .arg("--")
        .arg(exe)
        .args(args)
        .env("PHOS_GUEST_LIB", built("libphos_guest.so"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_refused_launch_that_did_not_wait_fails_at_the_next_check_without_a_reconnect() {
    let (Some(nvcc), Some(quota)) = (nvcc(), build_policy("launch_quota")) else { return };
    let exe = build_program(&nvcc, "iterative", &["-arch=sm_70"]);
    let router = TestRouter::start("emu");
    load(&router, "quota", &quota, &["max_launches=30"], KernelCheck::Skip).unwrap();
    let out = Command::new(built("phosctl"))
        .args(["run", "--endpoint"])
        .arg(format!("unix:{}", router.socket().display()))
        .arg("--")
        .arg(&exe)
        .args(["60", "0"])
        .env("PHOS_GUEST_LIB", built("libphos_guest.so"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The 31st launch (sent without waiting: its shape launched before) is refused by the
    // router; the program learns it from its next check, as from an asynchronous error.
    assert!(!out.status.success(), "{stdout}");
    assert!(stdout.contains("iteration 30") && !stdout.contains("iteration 40"), "{stdout}");
    assert!(stdout.contains("cudaErrorNotPermitted"), "{stdout}");
    assert!(!stderr.contains("reconnecting"), "a refusal is not a lost connection: {stderr}");
    let launches = usage_of(&router, "uid:0").resources.iter().find(|r| r.0 == "kernel_launches").unwrap().2;
    assert_eq!(launches, 30, "refused launches are not counted");
}

#[test]
fn policies_swap_while_guests_run() {
    let (Some(nvcc), Some(counting)) = (nvcc(), build_policy("count_and_admit")) else { return };
    let exe = build_program(&nvcc, "stream_traffic", &["-arch=sm_70"]);
    let router = TestRouter::start("emu");
    let mut guest = Command::new(built("phosctl"))
        .args(["run", "--endpoint"])
        .arg(format!("unix:{}", router.socket().display()))
        .arg("--")
        .arg(&exe)
        .arg("96")
        .env("PHOS_GUEST_LIB", built("libphos_guest.so"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Swap policies in and out, under the same name and others, while the traffic runs.
    let mut swaps = 0;
    let mut saw_runs = false;
    while guest.try_wait().unwrap().is_none() && swaps < 200 {
        let mark = format!("mark={}", swaps % 3 + 1);
        load(&router, "count", &counting, &[&mark], KernelCheck::Skip).unwrap();
        if swaps % 4 == 0 {
            load(&router, "second", &counting, &[], KernelCheck::Skip).unwrap();
        }
        if swaps % 4 == 2 {
            let _ = router.router.policies.unload("second");
        }
        saw_runs |= router.router.policies.list().iter().any(|p| p.runs > 0);
        swaps += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = guest.wait().unwrap();
    let mut out = String::new();
    guest.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let mut err = String::new();
    guest.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "{err}");
    assert!(out.ends_with("PASS\n"), "{out}");
    assert!(swaps > 10, "the program ended before the swaps ({swaps})");
    assert!(saw_runs, "the swapped policies decided calls");
    let calls_entries = || {
        let (_, _, maps) = router.router.policies.show("count").unwrap();
        maps.iter().find(|m| m.name == "calls").expect("the policy's map").entries
    };
    // One tenant, one entry (none if the guest made no call after the last swap: a fast
    // guest can finish right after it).
    assert!(calls_entries() <= 1, "the guest's tenant was counted once");
    // A replaced policy's maps go with it: the new version starts from empty state.
    load(&router, "count", &counting, &[], KernelCheck::Skip).unwrap();
    assert_eq!(calls_entries(), 0);
    let mut g = RawGuest::connect(&router.socket(), None).unwrap();
    malloc(&mut g, 4096).unwrap();
    assert_eq!(calls_entries(), 1);
}

#[test]
fn a_faulting_policy_is_unloaded_and_calls_go_on() {
    let Some(bad) = build_policy("out_of_bounds") else { return };
    let router = TestRouter::start("emu");
    load(&router, "bad", &bad, &[], KernelCheck::Skip).unwrap();
    let mut g = RawGuest::connect(&router.socket(), None).unwrap();
    // The first call makes it fault: it is admitted all the same, by the default policy.
    let p = malloc(&mut g, 4096).expect("admitted after the policy faulted");
    assert_ne!(p, 0);
    assert!(router.router.policies.list().is_empty(), "the faulting policy is still loaded");
    malloc(&mut g, 4096).expect("and later calls too");
}

#[test]
fn a_policy_that_runs_too_long_is_unloaded_and_calls_go_on() {
    let Some(spin) = build_policy("spins") else { return };
    let router = TestRouter::start("emu");
    load(&router, "spin", &spin, &[], KernelCheck::Skip).unwrap();
    let mut g = RawGuest::connect(&router.socket(), None).unwrap();
    let started = Instant::now();
    malloc(&mut g, 4096).expect("admitted once the policy ran out of budget");
    assert!(started.elapsed() < Duration::from_secs(5), "the budget stopped it quickly");
    assert!(router.router.policies.list().is_empty());
}

#[test]
fn the_kernel_verifier_checks_policies_where_the_router_may_load_them() {
    let Some(spin) = build_policy("spins") else { return };
    if !phos_policy::kernel::available() {
        eprintln!("no permission to load eBPF programs here: skipping");
        return;
    }
    let router = TestRouter::start("emu");
    // The shipped policies pass the kernel's verifier.
    for name in ["rate_limit", "fair_share", "memory_quota"] {
        let Some(elf) = shipped_policy(name) else { return };
        load(&router, name, elf, &[], KernelCheck::Require).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    assert!(router.router.policies.list().iter().all(|p| p.kernel_verified));
    // An unbounded loop does not: the verifier's refusal comes back to the operator.
    let err = load(&router, "spin", &spin, &[], KernelCheck::Require).unwrap_err();
    assert!(
        matches!(&err, phos_control::ControlError::PolicyRefused { reason, .. } if reason.contains("verifier")),
        "{err}"
    );
}

#[test]
fn tenants_cannot_reach_each_others_sessions_handles_or_memory() {
    let router = TestRouter::start_with("emu", |c| {
        let t = tenant(c, "mallory", None);
        c.tenants = vec![t];
    });
    let mut alice = RawGuest::connect(&router.socket(), None).unwrap();
    let stream = alice.call(&CudaStreamCreateRequest {}).unwrap().pStream;
    let secret = malloc(&mut alice, 4096).unwrap();
    alice.call(&CudaMemsetRequest { devPtr: secret, value: 0x5a, count: 4096 }).unwrap();

    let socket = tenant_socket(&router, "mallory");
    // Her session token does not open her session to another tenant.
    let token = alice.welcome.token;
    let err = RawGuest::connect(&socket, Some(token)).err().expect("refused");
    assert!(err.contains("unknown session"), "{err}");
    // In a session of its own, her handles and pointers mean nothing.
    let mut mallory = RawGuest::connect(&socket, None).unwrap();
    assert_ne!(mallory.welcome.session, alice.welcome.session);
    assert_eq!(mallory.call(&CudaStreamSynchronizeRequest { stream }).unwrap_err(), CudaError::InvalidResourceHandle.0);
    assert_eq!(mallory.call(&CudaStreamDestroyRequest { stream }).unwrap_err(), CudaError::InvalidResourceHandle.0);
    let r = mallory.call(&CudaMemcpyRequest {
        dst: Ptr::Out(4096),
        src: Ptr::Device(secret),
        count: 4096,
        kind: consts::cudaMemcpyDeviceToHost,
        direction: consts::cudaMemcpyDeviceToHost,
    });
    assert_eq!(r.unwrap_err(), CudaError::InvalidValue.0, "a read of her memory");
    assert_eq!(
        mallory.call(&CudaMemsetRequest { devPtr: secret, value: 0, count: 4096 }).unwrap_err(),
        CudaError::InvalidValue.0,
        "a write to her memory"
    );
    assert_eq!(mallory.call(&CudaFreeRequest { devPtr: secret }).unwrap_err(), CudaError::InvalidValue.0);
    // Her state is untouched.
    alice.call(&CudaStreamSynchronizeRequest { stream }).unwrap();
    let back = alice
        .call(&CudaMemcpyRequest {
            dst: Ptr::Out(4096),
            src: Ptr::Device(secret),
            count: 4096,
            kind: consts::cudaMemcpyDeviceToHost,
            direction: consts::cudaMemcpyDeviceToHost,
        })
        .unwrap();
    assert!(back.dst.unwrap().iter().all(|&b| b == 0x5a));
    assert_eq!(usage_of(&router, "mallory").sessions, 1);
    assert_eq!(usage_of(&router, "uid:0").sessions, 1);
}

fn read(g: &mut RawGuest, addr: u64, count: u64) -> Result<Vec<u8>, i32> {
    g.call(&CudaMemcpyRequest {
        dst: Ptr::Out(count),
        src: Ptr::Device(addr),
        count,
        kind: consts::cudaMemcpyDeviceToHost,
        direction: consts::cudaMemcpyDeviceToHost,
    })
    .map(|r| r.dst.unwrap().to_vec())
}

fn open_ipc(g: &mut RawGuest, handle: phos_protocol::types::IpcHandle, flags: u32) -> Result<u64, i32> {
    g.call(&CudaIpcOpenMemHandleRequest { handle, flags }).map(|r| r.devPtr)
}

/// IPC handles open between sessions of one tenant (the allocation's base, the same memory
/// both ways), and never in another tenant's session; forged, malformed and stale handles are
/// refused and change nothing.
#[test]
fn ipc_handles_open_within_a_tenant_and_never_across() {
    let router = TestRouter::start_with("emu", |c| {
        let t = tenant(c, "mallory", None);
        c.tenants = vec![t];
    });
    let mut alice = RawGuest::connect(&router.socket(), None).unwrap();
    let mem = malloc(&mut alice, 4 << 20).unwrap();
    let small = malloc(&mut alice, 256).unwrap();
    alice.call(&CudaMemsetRequest { devPtr: mem, value: 0x5a, count: 4 << 20 }).unwrap();
    alice.call(&CudaMemsetRequest { devPtr: small, value: 0x11, count: 256 }).unwrap();
    let handle = alice.call(&CudaIpcGetMemHandleRequest { devPtr: mem + 100 }).unwrap().handle;
    let small_handle = alice.call(&CudaIpcGetMemHandleRequest { devPtr: small }).unwrap().handle;
    // Not memory of hers: refused before anything is exported.
    assert!(alice.call(&CudaIpcGetMemHandleRequest { devPtr: 0x1000 }).is_err());
    // Her own process cannot open it (CUDA's invalid context).
    assert_eq!(open_ipc(&mut alice, handle, 1).unwrap_err(), CudaError::DeviceUninitialized.0);

    // Another session of her tenant opens it: the base, her bytes, and its writes are hers.
    let mut alice2 = RawGuest::connect(&router.socket(), None).unwrap();
    assert_ne!(alice2.welcome.session, alice.welcome.session);
    let p = open_ipc(&mut alice2, handle, 1).unwrap();
    assert!(read(&mut alice2, p, 4 << 20).unwrap().iter().all(|&b| b == 0x5a));
    alice2.call(&CudaMemsetRequest { devPtr: p + 4096, value: 0x33, count: 16 }).unwrap();
    assert!(read(&mut alice, mem + 4096, 16).unwrap().iter().all(|&b| b == 0x33));
    // Opened again: the same pointer, closed as often as opened.
    assert_eq!(open_ipc(&mut alice2, handle, 0).unwrap(), p);
    let q = open_ipc(&mut alice2, small_handle, 1).unwrap();
    assert!(read(&mut alice2, q, 256).unwrap().iter().all(|&b| b == 0x11));
    // Only the opened allocation may be named, not beyond it.
    assert!(read(&mut alice2, q, 512).is_err());
    // Opened memory is not the opener's to free.
    assert_eq!(alice2.call(&CudaFreeRequest { devPtr: p }).unwrap_err(), CudaError::InvalidValue.0);

    // Another tenant: the handle names nothing there.
    let mut mallory = RawGuest::connect(&tenant_socket(&router, "mallory"), None).unwrap();
    assert_eq!(open_ipc(&mut mallory, handle, 0).unwrap_err(), CudaError::MapBufferObjectFailed.0);
    assert_eq!(open_ipc(&mut mallory, small_handle, 0).unwrap_err(), CudaError::MapBufferObjectFailed.0);
    // Forged keys, malformed handles, and flags CUDA does not know.
    let mut forged = handle;
    forged.reserved[30] ^= 1;
    assert_eq!(open_ipc(&mut alice2, forged, 0).unwrap_err(), CudaError::MapBufferObjectFailed.0);
    let mut other_session = handle;
    other_session.reserved[16] ^= 0x40;
    assert_eq!(open_ipc(&mut alice2, other_session, 0).unwrap_err(), CudaError::MapBufferObjectFailed.0);
    let zeros = phos_protocol::types::IpcHandle::default();
    assert_eq!(open_ipc(&mut alice2, zeros, 0).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(open_ipc(&mut alice2, handle, 2).unwrap_err(), CudaError::InvalidValue.0);
    assert_eq!(
        alice2.call(&CudaIpcCloseMemHandleRequest { devPtr: mem + (64 << 20) }).unwrap_err(),
        CudaError::InvalidValue.0
    );

    // Events: interprocess and untimed only; another tenant cannot open them.
    let plain = alice.call(&CudaEventCreateWithFlagsRequest { flags: 0x2 }).unwrap().event;
    assert_eq!(
        alice.call(&CudaIpcGetEventHandleRequest { event: plain }).unwrap_err(),
        CudaError::InvalidResourceHandle.0
    );
    assert_eq!(alice.call(&CudaEventCreateWithFlagsRequest { flags: 0x4 }).unwrap_err(), CudaError::InvalidValue.0);
    let shared = alice.call(&CudaEventCreateWithFlagsRequest { flags: 0x6 }).unwrap().event;
    let event_handle = alice.call(&CudaIpcGetEventHandleRequest { event: shared }).unwrap().handle;
    assert!(mallory.call(&CudaIpcOpenEventHandleRequest { handle: event_handle }).is_err());
    assert_eq!(
        alice2.call(&CudaIpcOpenEventHandleRequest { handle }).unwrap_err(),
        CudaError::InvalidValue.0,
        "a memory handle is no event handle"
    );
    let opened = alice2.call(&CudaIpcOpenEventHandleRequest { handle: event_handle }).unwrap().event;
    alice2.call(&CudaEventRecordRequest { event: opened, stream: 0 }).unwrap();
    alice2.call(&CudaEventSynchronizeRequest { event: opened }).unwrap();
    alice.call(&CudaEventSynchronizeRequest { event: shared }).unwrap();

    // A session holding opened IPC memory or events is not checkpointed: the memory is
    // another session's.
    let image = router.dir.path().join("ipc-image");
    let ck = router.phosctl(&["checkpoint", &alice2.welcome.session.to_string(), "--out", image.to_str().unwrap()]);
    let said = format!("{}{}", String::from_utf8_lossy(&ck.stdout), String::from_utf8_lossy(&ck.stderr));
    assert!(!ck.status.success() && said.contains("IPC"), "{said}");
    // The exporter frees: what is open stays, the handle is stale for new opens.
    alice.call(&CudaFreeRequest { devPtr: mem }).unwrap();
    assert!(read(&mut alice2, p + 4096, 16).unwrap().iter().all(|&b| b == 0x33));
    let mut alice3 = RawGuest::connect(&router.socket(), None).unwrap();
    assert_eq!(open_ipc(&mut alice3, handle, 0).unwrap_err(), CudaError::MapBufferObjectFailed.0);
    alice2.call(&CudaIpcCloseMemHandleRequest { devPtr: p }).unwrap();
    alice2.call(&CudaIpcCloseMemHandleRequest { devPtr: p }).unwrap();
    assert_eq!(alice2.call(&CudaIpcCloseMemHandleRequest { devPtr: p }).unwrap_err(), CudaError::InvalidValue.0);
    assert!(read(&mut alice2, p, 16).is_err(), "closed memory is gone");
    alice2.call(&CudaIpcCloseMemHandleRequest { devPtr: q }).unwrap();

    // Each refusal is logged.
    let logs = router.server_logs();
    assert!(logs.contains("cudaIpcOpenMemHandle refused"), "{logs}");
    assert!(logs.contains("does not export"), "{logs}");
}

#[test]
fn usage_reaches_the_metrics_endpoint_and_phosctl_top() {
    let router = TestRouter::start("emu");
    let mut g = RawGuest::connect(&router.socket(), None).unwrap();
    malloc(&mut g, 3 << 20).unwrap();
    let addr = phos_router::metrics::serve(router.router.clone(), "127.0.0.1:0".parse().unwrap()).unwrap();
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut page = String::new();
    conn.read_to_string(&mut page).unwrap();
    assert!(page.starts_with("HTTP/1.1 200 OK"), "{page}");
    assert!(page.contains("phos_tenant_calls_total{tenant=\"uid:0\"}"), "{page}");
    assert!(
        page.contains(&format!(
            "phos_tenant_resource{{tenant=\"uid:0\",resource=\"device_memory\",kind=\"held\"}} {}",
            3 << 20
        )),
        "{page}"
    );
    let top = Command::new(built("phosctl"))
        .args(["top", "--once", "--interval", "0.2", "--router"])
        .arg(format!("unix:{}", router.socket().display()))
        .output()
        .unwrap();
    assert!(top.status.success(), "{}", String::from_utf8_lossy(&top.stderr));
    let text = String::from_utf8_lossy(&top.stdout);
    assert!(text.contains("uid:0") && text.contains("3.0 MiB"), "{text}");
}

/// A barrier of one channel names an async call of another that the router then refuses (a
/// quota): the router withdraws the call at the server, so the barrier's channel goes on at
/// once instead of waiting out the server's barrier timeout for a call that never comes.
#[test]
fn a_barrier_naming_an_async_call_the_router_refuses_does_not_wait_for_it() {
    use phos_protocol::frame::{FLAG_ASYNC, FLAG_REFUSED};
    use phos_protocol::transport::Transport;
    use phos_protocol::{FrameHeader, FrameKind};
    let router = TestRouter::start_with("emu", |c| {
        let t = tenant(c, "small", Some(64 << 20));
        c.tenants = vec![t];
    });
    let socket = tenant_socket(&router, "small");
    let mut a = RawGuest::connect(&socket, None).unwrap();
    let mut b = RawGuest::connect(&socket, Some(a.welcome.token)).unwrap();
    assert_eq!(a.welcome.session, b.welcome.session, "two channels of one session");
    const REFUSED_CALL: u64 = 5000;
    // Channel b waits for a's call 5000 (not refused yet, so the router forwards the id)...
    let mut barrier = FrameHeader::new(FrameKind::Barrier);
    barrier.session = b.welcome.session;
    barrier.payload_len = 8;
    b.transport.send(&barrier, &[&REFUSED_CALL.to_le_bytes()]).unwrap();
    let started = Instant::now();
    b.send_as(&CudaGetDeviceCountRequest {}, 6000, 0).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // ...which the router refuses: an allocation past the tenant's quota, sent async.
    a.send_as(&CudaMallocRequest { size: 128 << 20 }, REFUSED_CALL, FLAG_ASYNC).unwrap();
    let mut buf = Vec::new();
    let refusal = a.transport.recv(&mut buf).unwrap();
    assert_eq!((refusal.kind, refusal.call_id, refusal.flags), (FrameKind::Reply, REFUSED_CALL, FLAG_REFUSED));
    assert_eq!(refusal.status, CudaError::MemoryAllocation.0);
    let count = b.reply_to::<CudaGetDeviceCountRequest>(6000).expect("the call behind the barrier ran");
    assert!(count.count >= 1);
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(10), "the barrier waited {waited:?} for a call that was refused");
    // The session goes on: both channels serve.
    assert!(malloc(&mut a, 1 << 20).is_ok());
    assert!(malloc(&mut b, 1 << 20).is_ok());
}

/// Only the router withdraws calls: a guest that sends a withdrawal loses that channel, and
/// only it.
#[test]
fn a_guest_cannot_withdraw_calls() {
    use phos_protocol::transport::Transport;
    use phos_protocol::{FrameHeader, FrameKind};
    let router = TestRouter::start_with("emu", |_| {});
    let mut a = RawGuest::connect(&router.socket(), None).unwrap();
    let mut b = RawGuest::connect(&router.socket(), Some(a.welcome.token)).unwrap();
    let mut w = FrameHeader::new(FrameKind::Withdrawn);
    w.session = a.welcome.session;
    w.call_id = 1;
    a.transport.send(&w, &[]).unwrap();
    let mut buf = Vec::new();
    assert_eq!(a.transport.recv(&mut buf).unwrap().kind, FrameKind::Refused);
    assert!(malloc(&mut b, 1 << 20).is_ok(), "the session's other channel serves");
}
