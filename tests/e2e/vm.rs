//! A real VM end to end: QEMU boots Debian's kernel with an initramfs made here (busybox,
//! the virtio and vsock modules, nvcc-built CUDA programs, Phos's libcudart and the host
//! libraries they need); the guest runs the programs with `PHOS_ENDPOINT=vsock:2:PORT`, its
//! AF_VSOCK connections go through `phos-vmm-device` (QEMU's `vhost-user-vsock-pci`) to a
//! tenant's socket of a router on the emu backend, and the programs' output comes back over
//! the serial console, between markers, to be compared with `tests/cuda/expected`.
//!
//! Needs `qemu-system-x86_64`, `/bin/busybox` (busybox-static) and the kernel that
//! `tests/scripts/vm-kernel.sh` fetches (into `target/vm-kernel`, or `PHOS_VM_KERNEL`).
//! Without them the test is skipped, unless `PHOS_REQUIRE_VM=1` (CI), where it fails.
//! Runs on QEMU's TCG by default: nested KVM is often missing or broken where CI runs (in a
//! Firecracker VM, `/dev/kvm` is there but a guest on it never boots), and TCG boots this
//! kernel in seconds. `PHOS_VM_ACCEL=kvm` uses KVM.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use phos_router::TenantConfig;
use phos_tests::{TestRouter, build_program, built, cuda_dir, nvcc};

const PORT: u32 = 7070;
const GUEST_CID: u32 = 42;
/// The modules the guest loads, in dependency order (they are modules, not built in, in
/// Debian's cloud kernel).
const MODULES: [&str; 8] = [
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "vsock",
    "vmw_vsock_virtio_transport_common",
    "vmw_vsock_virtio_transport",
];

struct Kit {
    qemu: PathBuf,
    busybox: PathBuf,
    kernel: PathBuf,
    modules: PathBuf,
    nvcc: PathBuf,
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| std::env::split_paths(&paths).map(|d| d.join(name)).find(|p| p.exists()))
}

/// What the test needs, or `None` (skip) when something is missing and the VM test is not
/// required.
fn kit() -> Option<Kit> {
    let nvcc = nvcc()?;
    let kernel_dir = std::env::var_os("PHOS_VM_KERNEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/vm-kernel"));
    let qemu = which("qemu-system-x86_64");
    let busybox = ["/bin/busybox", "/usr/bin/busybox"].into_iter().map(PathBuf::from).find(|p| p.exists());
    let kernel = Some(kernel_dir.join("vmlinuz")).filter(|p| p.exists());
    let mut missing = Vec::new();
    if qemu.is_none() {
        missing.push("qemu-system-x86_64 (apt: qemu-system-x86)".to_string());
    }
    if busybox.is_none() {
        missing.push("/bin/busybox (apt: busybox-static)".to_string());
    }
    if kernel.is_none() {
        missing.push(format!("{}/vmlinuz (tests/scripts/vm-kernel.sh fetches it)", kernel_dir.display()));
    }
    if !missing.is_empty() {
        assert!(
            std::env::var("PHOS_REQUIRE_VM").as_deref() != Ok("1"),
            "the VM test is required (PHOS_REQUIRE_VM=1) but these are missing: {}",
            missing.join(", ")
        );
        eprintln!("skipping the VM test: missing {}", missing.join(", "));
        return None;
    }
    Some(Kit { qemu: qemu?, busybox: busybox?, kernel: kernel?, modules: kernel_dir.join("modules"), nvcc })
}

/// An initramfs in the kernel's `newc` cpio format, written here (no cpio tool needed).
#[derive(Default)]
struct Cpio {
    out: Vec<u8>,
    ino: u32,
    dirs: std::collections::BTreeSet<String>,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.ino += 1;
        let fields = [self.ino, mode, 0, 0, 1, 0, data.len() as u32, 0, 0, rdev.0, rdev.1, name.len() as u32 + 1, 0];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    /// `path`'s parent directories, once each.
    fn parents(&mut self, path: &str) {
        let mut at = String::new();
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        for p in &parts[..parts.len().saturating_sub(1)] {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(p);
            if self.dirs.insert(at.clone()) {
                self.entry(&at.clone(), 0o040755, (0, 0), &[]);
            }
        }
    }

    fn dir(&mut self, path: &str) {
        self.parents(&format!("{path}/x"));
    }

    fn file(&mut self, path: &str, mode: u32, data: &[u8]) {
        self.parents(path);
        self.entry(path.trim_start_matches('/'), 0o100000 | mode, (0, 0), data);
    }

    fn symlink(&mut self, path: &str, target: &str) {
        self.parents(path);
        self.entry(path.trim_start_matches('/'), 0o120777, (0, 0), target.as_bytes());
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.out
    }
}

/// The shared libraries `exe` loads, as `ldd` finds them on this host (the interpreter
/// included).
fn libraries(exe: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(exe).output().expect("running ldd");
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    if text.contains("not a dynamic executable") {
        return Vec::new();
    }
    assert!(out.status.success(), "ldd {}: {text}", exe.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.trim().split(' ').next()?,
                None => l.split(' ').next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// One of this build's files, stripped (the debug build's symbols would only cost the VM
/// memory).
fn stripped(name: &str, dir: &Path) -> Vec<u8> {
    let file = built(name);
    let out = dir.join(name);
    match Command::new("strip").arg("-o").arg(&out).arg(&file).status() {
        Ok(s) if s.success() => std::fs::read(&out).unwrap(),
        _ => std::fs::read(&file).unwrap(),
    }
}

/// Build the initramfs: `/init` loads the modules, runs `script` and powers the VM off.
fn initramfs(kit: &Kit, dir: &Path, programs: &BTreeMap<&str, PathBuf>, script: &str) -> PathBuf {
    let mut c = Cpio::default();
    for d in ["bin", "sbin", "dev", "proc", "sys", "tmp", "phos", "progs", "lib/modules"] {
        c.dir(d);
    }
    // The kernel opens the console for init before anything mounts /dev.
    c.entry("dev/console", 0o020600, (5, 1), &[]);
    c.file("/bin/busybox", 0o755, &std::fs::read(&kit.busybox).unwrap());
    for m in MODULES {
        let ko = kit.modules.join(format!("{m}.ko"));
        let data =
            std::fs::read(&ko).unwrap_or_else(|e| panic!("{}: {e} (rerun tests/scripts/vm-kernel.sh)", ko.display()));
        c.file(&format!("/lib/modules/{m}.ko"), 0o644, &data);
    }
    let mut libs = std::collections::BTreeSet::new();
    for exe in programs.values().chain([
        &built("libphos_guest.so"),
        &built("libphos_audit.so"),
        &built("phosctl"),
        &kit.busybox,
    ]) {
        libs.extend(libraries(exe));
    }
    for lib in libs {
        if lib
            .file_name()
            .is_some_and(|n| ["libcudart.so", "libcuda.so"].iter().any(|p| n.to_string_lossy().starts_with(p)))
        {
            continue;
        }
        let data = std::fs::read(&lib).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
        c.file(&lib.to_string_lossy(), 0o755, &data);
    }
    c.file("/phos/libphos_guest.so", 0o755, &stripped("libphos_guest.so", dir));
    c.file("/phos/phosctl", 0o755, &stripped("phosctl", dir));
    // `phosctl run` finds its audit module beside the guest library.
    c.file("/phos/libphos_audit.so", 0o755, &stripped("libphos_audit.so", dir));
    for soname in [
        "libcudart.so.11.0",
        "libcudart.so.12",
        "libcudart.so.13",
        "libcuda.so.1",
        "libcublas.so.11",
        "libcublas.so.12",
        "libcublas.so.13",
        "libcusolver.so.11",
        "libcusolver.so.12",
    ] {
        c.symlink(&format!("/phos/{soname}"), "libphos_guest.so");
    }
    for (name, exe) in programs {
        c.file(&format!("/progs/{name}"), 0o755, &std::fs::read(exe).unwrap());
    }
    let init = format!(
        "#!/bin/busybox sh\n\
         /bin/busybox --install -s /bin\n\
         mount -t proc proc /proc\n\
         mount -t sysfs sys /sys\n\
         mount -t devtmpfs dev /dev\n\
         for m in {modules}; do insmod /lib/modules/$m.ko || echo \"@@PHOS-MODULE-FAILED $m\"; done\n\
         export LD_LIBRARY_PATH=/phos PHOS_ENDPOINT=vsock:2:{PORT} PHOS_LOG=warn\n\
         cd /tmp\n\
         {script}\n\
         echo @@PHOS-DONE\n\
         poweroff -f\n",
        modules = MODULES.join(" "),
    );
    c.file("/init", 0o755, init.as_bytes());
    let path = dir.join("initramfs.cpio");
    std::fs::write(&path, c.finish()).unwrap();
    path
}

/// Guest shell: wait until process `$pid` has a socket (its channel), then a second more,
/// so that it is in the middle of its calls.
const WAIT_CONNECTED: &str =
    "for i in $(seq 600); do ls -l /proc/$pid/fd 2>/dev/null | grep -q socket && break; sleep 0.1; done\nsleep 1\n";

/// The guest shell's lines that run `name` and print its output between markers.
fn run_in_guest(name: &str, args: &str) -> String {
    format!(
        "echo @@PHOS-BEGIN {name}\n/progs/{name} {args} > /tmp/{name}.out 2>&1; rc=$?\ncat /tmp/{name}.out\necho @@PHOS-END {name} rc=$rc\n"
    )
}

/// The same through `phosctl run --transport vsock` (its logs, on standard error, after the
/// end marker).
fn phosctl_in_guest(name: &str) -> String {
    format!(
        "echo @@PHOS-BEGIN phosctl_{name}\nPHOS_GUEST_LIB=/phos/libphos_guest.so /phos/phosctl run --transport vsock -- /progs/{name} \
         > /tmp/p_{name}.out 2>/tmp/p_{name}.err; rc=$?\ncat /tmp/p_{name}.out\necho @@PHOS-END phosctl_{name} rc=$rc\ncat /tmp/p_{name}.err\n"
    )
}

/// A running VM and its device.
struct Vm {
    qemu: Child,
    device: Child,
    lines: mpsc::Receiver<String>,
    console: Vec<String>,
    booted: Instant,
}

fn kvm_wanted() -> bool {
    std::env::var("PHOS_VM_ACCEL").as_deref() == Ok("kvm")
        && std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_ok()
}

impl Vm {
    fn start(kit: &Kit, dir: &Path, initramfs: &Path, router_socket: &Path) -> Vm {
        let sock = dir.join("vhost-user.sock");
        let _ = std::fs::remove_file(&sock);
        let device = Command::new(built("phos-vmm-device"))
            .arg("--socket")
            .arg(&sock)
            .args(["--guest-cid", &GUEST_CID.to_string(), "--port", &PORT.to_string(), "--once", "--router"])
            .arg(router_socket)
            .env("PHOS_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("device.log")).unwrap())
            .spawn()
            .expect("starting phos-vmm-device");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sock.exists() {
            assert!(Instant::now() < deadline, "phos-vmm-device did not listen on {}", sock.display());
            std::thread::sleep(Duration::from_millis(10));
        }
        let accel: &[&str] = if kvm_wanted() {
            &["-accel", "kvm", "-cpu", "host,-arch-capabilities"]
        } else {
            &["-accel", "tcg,thread=multi", "-cpu", "max"]
        };
        let mut qemu = Command::new(&kit.qemu)
            .args(["-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-machine", "q35"])
            .args(accel)
            .args(["-smp", "2", "-m", "512M"])
            .args(["-object", "memory-backend-memfd,id=mem,size=512M,share=on", "-numa", "node,memdev=mem"])
            .arg("-kernel")
            .arg(&kit.kernel)
            .arg("-initrd")
            .arg(initramfs)
            .args(["-append", "console=ttyS0 quiet loglevel=1 panic=-1 rdinit=/init"])
            .args(["-serial", "stdio"])
            .arg("-chardev")
            .arg(format!("socket,id=c0,path={}", sock.display()))
            .args(["-device", "vhost-user-vsock-pci,chardev=c0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("qemu.log")).unwrap())
            .spawn()
            .expect("starting qemu");
        let out = qemu.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line.trim_end_matches('\r').to_string()).is_err() {
                    break;
                }
            }
        });
        Vm { qemu, device, lines, console: Vec::new(), booted: Instant::now() }
    }

    /// Console lines until one starts with `marker`; panics (with the console so far) on
    /// timeout or if the VM ends first.
    fn wait_for(&mut self, marker: &str, timeout: Duration, dir: &Path) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.console.push(line.clone());
                    if line.starts_with(marker) {
                        return line;
                    }
                }
                Err(e) => {
                    let _ = self.qemu.kill();
                    panic!(
                        "waiting for `{marker}` ({e:?}); console:\n{}\nqemu: {}\ndevice: {}",
                        self.console.join("\n"),
                        std::fs::read_to_string(dir.join("qemu.log")).unwrap_or_default(),
                        std::fs::read_to_string(dir.join("device.log")).unwrap_or_default()
                    )
                }
            }
        }
    }

    /// Wait for QEMU and the device (which exits with the VM) to end.
    fn finish(&mut self, dir: &Path) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(s) = self.qemu.try_wait().unwrap() {
                assert!(
                    s.success(),
                    "qemu: {s}; {}",
                    std::fs::read_to_string(dir.join("qemu.log")).unwrap_or_default()
                );
                break;
            }
            if Instant::now() > deadline {
                let _ = self.qemu.kill();
                panic!("the VM did not power off");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        wait_device(&mut self.device, dir);
        while let Ok(l) = self.lines.try_recv() {
            self.console.push(l);
        }
        std::mem::take(&mut self.console)
    }
}

impl Drop for Vm {
    /// A failed test leaves no VM or device behind.
    fn drop(&mut self) {
        let _ = self.qemu.kill();
        let _ = self.qemu.wait();
        let _ = self.device.kill();
        let _ = self.device.wait();
    }
}

/// The device exits by itself, cleanly, when its VM goes away (`--once`).
fn wait_device(device: &mut Child, dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(s) = device.try_wait().unwrap() {
            let log = std::fs::read_to_string(dir.join("device.log")).unwrap_or_default();
            assert!(s.success(), "phos-vmm-device: {s}\n{log}");
            assert!(!log.contains("panicked"), "phos-vmm-device:\n{log}");
            return;
        }
        if Instant::now() > deadline {
            let _ = device.kill();
            panic!(
                "phos-vmm-device did not exit after its VM:\n{}",
                std::fs::read_to_string(dir.join("device.log")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn expected(name: &str) -> String {
    std::fs::read_to_string(cuda_dir().join("expected").join(format!("{name}.out"))).unwrap()
}

/// A router with a tenant `vm` on a socket of its own, which the device connects to.
fn router() -> (TestRouter, PathBuf) {
    let router = TestRouter::start_with("emu", |c| {
        // memory_ops copies 64 MiB in one call (no staging region over vsock).
        c.max_payload = 256 << 20;
        c.tenants.push(TenantConfig {
            name: "vm".into(),
            uids: vec![],
            socket: Some(c.listen.with_file_name("vm.sock")),
            share: 1,
            quota: Default::default(),
            token: None,
        });
    });
    let socket = router.socket().with_file_name("vm.sock");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "the tenant socket did not appear");
        std::thread::sleep(Duration::from_millis(10));
    }
    (router, socket)
}

fn vm_calls(router: &TestRouter) -> u64 {
    router.router.tenants.usage().into_iter().find(|t| t.name == "vm").map_or(0, |t| t.calls)
}

fn timeout() -> Duration {
    // TCG emulates every instruction: far slower than KVM.
    Duration::from_secs(if kvm_wanted() { 240 } else { 900 })
}

/// Programs in a VM, one after another, two at once, a threaded one (a connection per
/// thread) and one killed mid-call, all through the device to the `vm` tenant.
#[test]
fn programs_in_a_vm_reach_the_router_over_vsock() {
    let Some(kit) = kit() else { return };
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let programs: BTreeMap<&str, PathBuf> = ["vector_add", "memory_ops", "host_threads", "iterative"]
        .into_iter()
        .map(|n| (n, build_program(&kit.nvcc, n, &["-arch=sm_70"])))
        .collect();
    let mut script = String::new();
    script += "echo @@PHOS-BOOTED\n";
    for name in ["vector_add", "memory_ops", "host_threads"] {
        script += &run_in_guest(name, "");
    }
    script += &phosctl_in_guest("vector_add");
    // Two programs at once.
    script += "(/progs/vector_add > /tmp/va2.out 2>&1; echo rc=$? >> /tmp/va2.out) &\n\
               (/progs/memory_ops > /tmp/mo2.out 2>&1; echo rc=$? >> /tmp/mo2.out) &\n\
               wait\n\
               echo @@PHOS-BEGIN concurrent_vector_add\ncat /tmp/va2.out\necho @@PHOS-END concurrent_vector_add rc=0\n\
               echo @@PHOS-BEGIN concurrent_memory_ops\ncat /tmp/mo2.out\necho @@PHOS-END concurrent_memory_ops rc=0\n";
    // Killed in the middle of its calls; then the next program must still be served.
    script += "/progs/iterative 100000 > /tmp/it.out 2>&1 &\npid=$!\n";
    script += WAIT_CONNECTED;
    script += "kill -9 $pid\nwait $pid 2>/dev/null\necho @@PHOS-KILLED\n";
    script += &run_in_guest("vector_add", "");
    let initrd = initramfs(&kit, dir.path(), &programs, &script);

    let (router, socket) = router();
    let mut vm = Vm::start(&kit, dir.path(), &initrd, &socket);
    vm.wait_for("@@PHOS-BOOTED", timeout(), dir.path());
    let boot = vm.booted.elapsed();
    vm.wait_for("@@PHOS-DONE", timeout(), dir.path());
    let vm_time = vm.booted.elapsed();
    let console = vm.finish(dir.path());
    eprintln!("the VM's console:\n{}", console.join("\n"));
    let vm = Console { console };

    for name in ["vector_add", "memory_ops", "host_threads"] {
        let (out, rc) = vm.output_of(name);
        assert_eq!(rc, "rc=0", "{name} in the VM:\n{out}");
        assert_eq!(out, expected(name), "{name}'s output in the VM");
    }
    let (out, rc) = vm.output_of("phosctl_vector_add");
    assert_eq!((out.as_str(), rc.as_str()), (expected("vector_add").as_str(), "rc=0"), "phosctl run --transport vsock");
    for name in ["vector_add", "memory_ops"] {
        let (out, _) = vm.output_of(&format!("concurrent_{name}"));
        assert_eq!(out, format!("{}rc=0\n", expected(name)), "{name}, run beside another program in the VM");
    }
    assert!(vm.console.iter().any(|l| l == "@@PHOS-KILLED"));
    // The program after the killed one ran (its markers are the last vector_add's).
    let last = vm.console.iter().rposition(|l| l == "@@PHOS-BEGIN vector_add").unwrap();
    assert!(last > vm.console.iter().position(|l| l == "@@PHOS-KILLED").unwrap());
    assert!(vm.console[last..].iter().any(|l| l == "@@PHOS-END vector_add rc=0"), "{}", vm.console[last..].join("\n"));
    assert!(!vm.console.iter().any(|l| l.starts_with("@@PHOS-MODULE-FAILED")), "{}", vm.console.join("\n"));
    // Every call went through the router, charged to the VM's tenant.
    assert!(vm_calls(&router) > 100, "the vm tenant made {} calls", vm_calls(&router));
    eprintln!(
        "VM test: boot {:.1}s, VM run {:.1}s, whole test {:.1}s ({})",
        boot.as_secs_f64(),
        vm_time.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        if kvm_wanted() { "kvm" } else { "tcg" }
    );
}

/// What the VM printed on its console.
struct Console {
    console: Vec<String>,
}

impl Console {
    /// The lines between `@@PHOS-BEGIN name` and `@@PHOS-END name`, and the exit status.
    fn output_of(&self, name: &str) -> (String, String) {
        let begin = self.console.iter().position(|l| l == &format!("@@PHOS-BEGIN {name}")).expect("begin marker");
        let end_prefix = format!("@@PHOS-END {name} ");
        let end = begin + self.console[begin..].iter().position(|l| l.starts_with(&end_prefix)).expect("end marker");
        let body: String = self.console[begin + 1..end].iter().map(|l| format!("{l}\n")).collect();
        (body, self.console[end][end_prefix.len()..].to_string())
    }
}

/// The whole VM killed while its program is in the middle of its calls: the device exits
/// cleanly, the router ends the session, and serves the next guest.
#[test]
fn a_vm_killed_mid_call_leaves_router_and_device_sound() {
    let Some(kit) = kit() else { return };
    let dir = tempfile::tempdir().unwrap();
    let programs: BTreeMap<&str, PathBuf> =
        [("iterative", build_program(&kit.nvcc, "iterative", &["-arch=sm_70"]))].into_iter().collect();
    let script =
        format!("echo @@PHOS-BOOTED\n/progs/iterative 100000 &\npid=$!\n{WAIT_CONNECTED}echo @@PHOS-RUNNING\nwait\n");
    let initrd = initramfs(&kit, dir.path(), &programs, &script);
    let (router, socket) = router();
    let mut vm = Vm::start(&kit, dir.path(), &initrd, &socket);
    vm.wait_for("@@PHOS-RUNNING", timeout(), dir.path());
    let deadline = Instant::now() + Duration::from_secs(60);
    while vm_calls(&router) == 0 {
        assert!(Instant::now() < deadline, "the program in the VM made no call through the router");
        std::thread::sleep(Duration::from_millis(50));
    }
    vm.qemu.kill().unwrap();
    let _ = vm.qemu.wait();
    wait_device(&mut vm.device, dir.path());
    // The session ends once its channels are gone (the device closed them).
    let deadline = Instant::now() + Duration::from_secs(30);
    while router.router.sessions().iter().any(|s| s.tenant.0 == "vm") {
        assert!(Instant::now() < deadline, "the killed VM's session is still open");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The router still serves: the same tenant's socket, a guest on the host.
    let out = Command::new(built("phosctl"))
        .arg("run")
        .arg("--endpoint")
        .arg(format!("unix:{}", socket.display()))
        .arg("--")
        .arg(build_program(&kit.nvcc, "vector_add", &["-arch=sm_70"]))
        .env("PHOS_GUEST_LIB", built("libphos_guest.so"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected("vector_add"));
    let _ = std::io::stderr().flush();
}
