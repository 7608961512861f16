//! What a library's name says about it: one of the CUDA libraries Phos serves (and which of
//! its files serves it), or an NVIDIA library that drives the GPU and that Phos does not
//! serve yet. Pure functions over bytes: they run inside the dynamic loader's callbacks.

/// The files of Phos's guest-library directory (`PHOS_GUEST_DIR`), each a name of the one
/// guest library, by [`Served`] index.
pub const SERVED_FILES: [&core::ffi::CStr; SERVED_COUNT] = [
    c"libcudart.so.11.0",
    c"libcudart.so.12",
    c"libcudart.so.13",
    c"libcuda.so.1",
    c"libcublas.so.11",
    c"libcublas.so.12",
    c"libcublas.so.13",
    c"libcurand.so.10",
    c"libcusolver.so.11",
    c"libcusolver.so.12",
    c"libcusparse.so.11",
    c"libcusparse.so.12",
    c"libcudnn.so.9",
    c"libcudnn_graph.so.9",
    c"libcudnn_ops.so.9",
    c"libcudnn_cnn.so.9",
    c"libcudnn_adv.so.9",
    c"libcudnn_ext.so.9",
    c"libcublasLt.so.11",
    c"libcublasLt.so.12",
    c"libcublasLt.so.13",
    c"libcufft.so.10",
    c"libcufft.so.11",
    c"libcufft.so.12",
    c"libnvidia-ml.so.1",
];

/// How many files Phos serves libraries with.
pub const SERVED_COUNT: usize = 25;

/// Which of Phos's files serves a library name ([`SERVED_FILES`] index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    Runtime11 = 0,
    Runtime12 = 1,
    Runtime13 = 2,
    Driver = 3,
    Blas11 = 4,
    Blas12 = 5,
    Blas13 = 6,
    Rand10 = 7,
    Solver11 = 8,
    Solver12 = 9,
    Sparse11 = 10,
    Sparse12 = 11,
    Dnn9 = 12,
    DnnGraph9 = 13,
    DnnOps9 = 14,
    DnnCnn9 = 15,
    DnnAdv9 = 16,
    DnnExt9 = 17,
    BlasLt11 = 18,
    BlasLt12 = 19,
    BlasLt13 = 20,
    Fft10 = 21,
    Fft11 = 22,
    Fft12 = 23,
    Nvml1 = 24,
}

/// The last component of a path.
pub fn base_name(path: &[u8]) -> &[u8] {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => path.get(i + 1..).unwrap_or(&[]),
        None => path,
    }
}

/// The major version of a `.`-separated version (`12` of `12.4.127`; empty when there is none).
fn major(version: &[u8]) -> &[u8] {
    version.split(|&b| b == b'.').next().unwrap_or(&[])
}

/// `name` is `stem` alone or `stem` followed by a `.`-separated version.
fn versioned<'a>(name: &'a [u8], stem: &[u8]) -> Option<&'a [u8]> {
    let rest = name.strip_prefix(stem)?;
    match rest.first() {
        None => Some(rest),
        Some(b'.') => Some(rest.get(1..).unwrap_or(&[])),
        Some(_) => None,
    }
}

/// The file of Phos's that a search for `name` (a file name, or a path whose last
/// component is looked at) should open instead: the driver for every `libcuda.so*`, the
/// runtime of the same major version for `libcudart.so.11*`, `.12*` and `.13*`, and the
/// CUDA 12 runtime (Phos's default ABI) for an unversioned `libcudart.so`; cuBLAS of the same
/// major version for `libcublas.so.11*`, `.12*`, `.13*` (12 for `libcublas.so`); cuRAND for
/// `libcurand.so.10*` and `libcurand.so` (10 in CUDA 11, 12 and 13); cuSOLVER of the same
/// major version for `libcusolver.so.11*` (CUDA 11 and 12) and `.12*` (CUDA 13; 11 for
/// `libcusolver.so`); cuSPARSE of the same major version for `libcusparse.so.11*` (CUDA 11) and
/// `.12*` (CUDA 12 and 13; 12 for `libcusparse.so`); cuDNN 9 for `libcudnn.so.9*` and each of
/// its sub-libraries (`libcudnn_graph.so.9*`, ...; 9 for the unversioned names); cuBLASLt of the
/// same major version for `libcublasLt.so.11*`, `.12*`, `.13*` (12 for `libcublasLt.so`); cuFFT
/// of the same major version for `libcufft.so.10*` (CUDA 11), `.11*` (CUDA 12) and `.12*` (CUDA
/// 13; 11 for `libcufft.so`); NVML for every `libnvidia-ml.so*`. `None` for
/// anything else, including a runtime of a major version Phos does not present (left alone:
/// if it gets mapped, it is reported).
pub fn served(name: &[u8]) -> Option<Served> {
    let base = base_name(name);
    if versioned(base, b"libcuda.so").is_some() {
        return Some(Served::Driver);
    }
    if let Some(version) = versioned(base, b"libcublas.so") {
        return match major(version) {
            b"" | b"12" => Some(Served::Blas12),
            b"11" => Some(Served::Blas11),
            b"13" => Some(Served::Blas13),
            _ => None,
        };
    }
    if let Some(version) = versioned(base, b"libcurand.so") {
        return matches!(major(version), b"" | b"10").then_some(Served::Rand10);
    }
    if let Some(version) = versioned(base, b"libcusolver.so") {
        return match major(version) {
            b"" | b"11" => Some(Served::Solver11),
            b"12" => Some(Served::Solver12),
            _ => None,
        };
    }
    if let Some(version) = versioned(base, b"libcusparse.so") {
        return match major(version) {
            b"11" => Some(Served::Sparse11),
            b"" | b"12" => Some(Served::Sparse12),
            _ => None,
        };
    }
    for (stem, file) in [
        (&b"libcudnn.so"[..], Served::Dnn9),
        (b"libcudnn_graph.so", Served::DnnGraph9),
        (b"libcudnn_ops.so", Served::DnnOps9),
        (b"libcudnn_cnn.so", Served::DnnCnn9),
        (b"libcudnn_adv.so", Served::DnnAdv9),
        (b"libcudnn_ext.so", Served::DnnExt9),
    ] {
        if let Some(version) = versioned(base, stem) {
            return matches!(major(version), b"" | b"9").then_some(file);
        }
    }
    if let Some(version) = versioned(base, b"libcublasLt.so") {
        return match major(version) {
            b"" | b"12" => Some(Served::BlasLt12),
            b"11" => Some(Served::BlasLt11),
            b"13" => Some(Served::BlasLt13),
            _ => None,
        };
    }
    if let Some(version) = versioned(base, b"libcufft.so") {
        return match major(version) {
            b"10" => Some(Served::Fft10),
            b"" | b"11" => Some(Served::Fft11),
            b"12" => Some(Served::Fft12),
            _ => None,
        };
    }
    // NVML is `libnvidia-ml.so.1`, a link to the driver's `libnvidia-ml.so.<driver version>`.
    if versioned(base, b"libnvidia-ml.so").is_some() {
        return Some(Served::Nvml1);
    }
    let version = versioned(base, b"libcudart.so")?;
    match major(version) {
        b"" => Some(Served::Runtime12),
        b"11" => Some(Served::Runtime11),
        b"12" => Some(Served::Runtime12),
        b"13" => Some(Served::Runtime13),
        _ => None,
    }
}

/// A CUDA runtime or driver library by its name (file name or soname), of any version: what
/// must be Phos's in a process run through Phos.
pub fn is_runtime_or_driver(name: &[u8]) -> bool {
    let base = base_name(name);
    versioned(base, b"libcuda.so").is_some() || versioned(base, b"libcudart.so").is_some()
}

/// NVIDIA libraries that drive the GPU (through the driver API, or the kernel driver for
/// NVML) and that Phos does not serve yet, by file-name prefix, with the library's name.
/// NVRTC and nvJitLink need no GPU and are not listed.
const UNSERVED: &[(&[u8], &str)] = &[
    (b"libcudnn", "cuDNN"),
    (b"libcufftw", "cuFFTW"),
    (b"libcusparseLt.so", "cuSPARSELt"),
    (b"libcusolverMg.so", "cuSOLVERMg"),
    (b"libcutensor", "cuTENSOR"),
    (b"libnccl.so", "NCCL"),
    (b"libcupti.so", "CUPTI"),
    (b"libcufile", "cuFile"),
    (b"libnvjpeg.so", "nvJPEG"),
    (b"libnpp", "NPP"),
];

/// The NVIDIA library `name` is, if it is one that drives the GPU and Phos does not serve.
pub fn unserved(name: &[u8]) -> Option<&'static str> {
    let base = base_name(name);
    UNSERVED.iter().find(|(prefix, _)| base.starts_with(prefix)).map(|&(_, library)| library)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_and_driver_names_go_to_phos_files_of_their_version() {
        for (name, want) in [
            (&b"libcuda.so.1"[..], Some(Served::Driver)),
            (b"libcuda.so", Some(Served::Driver)),
            (b"/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05", Some(Served::Driver)),
            (b"libcudart.so.11.0", Some(Served::Runtime11)),
            (b"libcudart.so.12", Some(Served::Runtime12)),
            (b"/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12", Some(Served::Runtime12)),
            (b"libcudart.so.12.4.127", Some(Served::Runtime12)),
            (b"libcudart.so.13", Some(Served::Runtime13)),
            (b"libcudart.so", Some(Served::Runtime12)),
            // A runtime Phos does not present: left to fail or be reported.
            (b"libcudart.so.10.2", None),
            // Other libraries that merely start alike.
            (b"libcudart_static.a", None),
            (b"libcudadebugger.so.1", None),
            (b"libcuda_stub.so", None),
            (b"libcublas.so.12", Some(Served::Blas12)),
            (b"/site-packages/nvidia/cublas/lib/libcublas.so.12", Some(Served::Blas12)),
            (b"libcublas.so.11", Some(Served::Blas11)),
            (b"libcublas.so.13", Some(Served::Blas13)),
            (b"libcublas.so", Some(Served::Blas12)),
            (b"libcublasLt.so.12", Some(Served::BlasLt12)),
            (b"libcublas.so.10", None),
            (b"libcurand.so.10", Some(Served::Rand10)),
            (b"/usr/lib/x86_64-linux-gnu/libcurand.so.10.3.0.86", Some(Served::Rand10)),
            (b"libcurand.so", Some(Served::Rand10)),
            (b"libcurand.so.9", None),
            (b"libcusolver.so.11", Some(Served::Solver11)),
            (b"/site-packages/nvidia/cusolver/lib/libcusolver.so.11", Some(Served::Solver11)),
            (b"libcusolver.so.12", Some(Served::Solver12)),
            (b"libcusolver.so", Some(Served::Solver11)),
            (b"libcusolverMg.so.11", None),
            (b"libcusparse.so.11", Some(Served::Sparse11)),
            (b"/usr/lib/x86_64-linux-gnu/libcusparse.so.11.7.5.86", Some(Served::Sparse11)),
            (b"libcusparse.so.12", Some(Served::Sparse12)),
            (b"libcusparse.so", Some(Served::Sparse12)),
            (b"libcusparseLt.so.0", None),
            (b"libcudnn.so.9", Some(Served::Dnn9)),
            (b"/site-packages/nvidia/cudnn/lib/libcudnn_graph.so.9", Some(Served::DnnGraph9)),
            (b"libcudnn_ops.so.9.10.2", Some(Served::DnnOps9)),
            (b"libcudnn_cnn.so", Some(Served::DnnCnn9)),
            (b"libcudnn_adv.so.9", Some(Served::DnnAdv9)),
            (b"libcudnn_ext.so.9", Some(Served::DnnExt9)),
            // cuDNN 8 and the engine libraries NVIDIA's libcudnn loads itself: not Phos's.
            (b"libcudnn.so.8", None),
            (b"libcudnn_engines_precompiled.so.9", None),
            (b"libcublasLt.so.11", Some(Served::BlasLt11)),
            (b"/site-packages/nvidia/cublas/lib/libcublasLt.so.12", Some(Served::BlasLt12)),
            (b"libcublasLt.so.13.0.0", Some(Served::BlasLt13)),
            (b"libcublasLt.so", Some(Served::BlasLt12)),
            (b"libcublasLt.so.10", None),
            (b"libcufft.so.10", Some(Served::Fft10)),
            (b"/usr/lib/x86_64-linux-gnu/libcufft.so.10.9.0.58", Some(Served::Fft10)),
            (b"libcufft.so.11", Some(Served::Fft11)),
            (b"libcufft.so.12", Some(Served::Fft12)),
            (b"libcufft.so", Some(Served::Fft11)),
            (b"libcufftw.so.10", None),
            (b"libnvidia-ml.so.1", Some(Served::Nvml1)),
            (b"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.65.06", Some(Served::Nvml1)),
            (b"libnvidia-ml.so", Some(Served::Nvml1)),
            (b"libnvidia-mlx.so.1", None),
            (b"/opt/libcuda.so.1/libm.so.6", None),
            (b"", None),
        ] {
            assert_eq!(served(name), want, "{}", core::str::from_utf8(name).unwrap_or("?"));
        }
        for s in [
            Served::Runtime11,
            Served::Runtime12,
            Served::Runtime13,
            Served::Driver,
            Served::Blas11,
            Served::Blas12,
            Served::Blas13,
            Served::Rand10,
            Served::Solver11,
            Served::Solver12,
            Served::Sparse11,
            Served::Sparse12,
            Served::Dnn9,
            Served::DnnGraph9,
            Served::DnnOps9,
            Served::DnnCnn9,
            Served::DnnAdv9,
            Served::DnnExt9,
            Served::Fft10,
            Served::Fft11,
            Served::Fft12,
            Served::Nvml1,
        ] {
            assert_eq!(served(SERVED_FILES[s as usize].to_bytes()), Some(s), "Phos's own file names serve themselves");
        }
    }

    #[test]
    fn every_runtime_and_driver_version_is_one() {
        for name in ["libcuda.so.1", "libcudart.so.10.2", "/x/libcudart.so.12", "libcudart.so", "libcuda.so"] {
            assert!(is_runtime_or_driver(name.as_bytes()), "{name}");
        }
        for name in ["libcudart_static.a", "libcublas.so.12", "libcudnn.so.9", "libc.so.6", "/libcuda.so.1/x.so"] {
            assert!(!is_runtime_or_driver(name.as_bytes()), "{name}");
        }
    }

    #[test]
    fn gpu_libraries_phos_does_not_serve_are_named() {
        for (name, want) in [
            ("libcublas.so.12", None),
            ("libcudnn_engines_precompiled.so.9", Some("cuDNN")),
            ("libcudnn.so.8", Some("cuDNN")),
            ("/w/nvidia/cublas/lib/libcublasLt.so.12", None),
            ("libcufftw.so.11", Some("cuFFTW")),
            ("libcufft.so.11", None),
            ("libnccl.so.2", Some("NCCL")),
            ("libcurand.so.10", None),
            ("libnvidia-ml.so.1", None),
            ("libnvrtc.so.12", None),
            ("libnvJitLink.so.12", None),
            ("libcudart.so.12", None),
            ("libm.so.6", None),
        ] {
            assert_eq!(unserved(name.as_bytes()), want, "{name}");
        }
    }
}
