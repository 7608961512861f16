//! The generated calls into a vendor's library (`phos_api_server::vendor`, from
//! codegen/src/emit/vendor.rs), against a stand-in for libcublas built here: a C library whose
//! functions have cuBLAS's prototypes and compute on the CPU, so the arguments' order, types
//! and shapes (host scalars, device addresses, results in the reply) are checked without a GPU;
//! and likewise for libcurand (value arguments of C's float, double and size_t, a host
//! generator's output in the reply).
#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::process::Command;

use phos_api_server::vendor::cublas::{Library, Translate, VendorCall};
use phos_protocol::Ptr;
use phos_protocol::cublas::*;

/// The handle the stand-in expects: calls with any other fail with CUBLAS_STATUS_NOT_INITIALIZED.
const VENDOR_HANDLE: u64 = 0x1234;

const STAND_IN: &str = r#"
#include <stdint.h>
#define EXPECT_HANDLE(h) if ((uintptr_t)(h) != 0x1234) return 1
int cublasSaxpy_v2(void *h, int n, const float *alpha, const float *x, int incx, float *y, int incy) {
    EXPECT_HANDLE(h);
    for (int i = 0; i < n; ++i) y[i * incy] += *alpha * x[i * incx];
    return 0;
}
int cublasSdot_v2(void *h, int n, const float *x, int incx, const float *y, int incy, float *result) {
    EXPECT_HANDLE(h);
    float acc = 0;
    for (int i = 0; i < n; ++i) acc += x[i * incx] * y[i * incy];
    *result = acc;
    return 0;
}
int cublasSgemm_v2(void *h, int ta, int tb, int m, int n, int k, const float *alpha, const float *a, int lda,
                   const float *b, int ldb, const float *beta, float *c, int ldc) {
    EXPECT_HANDLE(h);
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
            float acc = 0;
            for (int p = 0; p < k; ++p)
                acc += (ta ? a[p + i * lda] : a[i + p * lda]) * (tb ? b[j + p * ldb] : b[p + j * ldb]);
            c[i + j * ldc] = *alpha * acc + *beta * c[i + j * ldc];
        }
    return 0;
}
int cublasSgemmStridedBatched(void *h, int ta, int tb, int m, int n, int k, const float *alpha, const float *a,
                              int lda, long long sa, const float *b, int ldb, long long sb, const float *beta,
                              float *c, int ldc, long long sc, int batch) {
    for (int i = 0; i < batch; ++i) {
        int r = cublasSgemm_v2(h, ta, tb, m, n, k, alpha, a + i * sa, lda, b + i * sb, ldb, beta, c + i * sc, ldc);
        if (r) return r;
    }
    return 0;
}
"#;

struct Objects;

impl Translate for Objects {
    fn object(&self, kind: &'static str, _: u64) -> Result<*mut std::ffi::c_void, CublasStatus> {
        assert_eq!(kind, "cublas_handle");
        Ok(VENDOR_HANDLE as *mut std::ffi::c_void)
    }
}

/// The stand-in, built with `cc` into a temporary directory.
fn stand_in(dir: &Path) -> PathBuf {
    build_stand_in(dir, "libcublas_stand_in", STAND_IN)
}

fn build_stand_in(dir: &Path, name: &str, source: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let lib = dir.join(format!("{name}.so"));
    let out = Command::new("cc").args(["-shared", "-fPIC", "-O1", "-o"]).arg(&lib).arg(&src).output().expect("cc");
    assert!(out.status.success(), "cc: {}", String::from_utf8_lossy(&out.stderr));
    lib
}

fn floats(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|f| f.to_le_bytes()).collect()
}

fn addr<T>(v: &mut [T]) -> u64 {
    v.as_mut_ptr() as u64
}

#[test]
fn generated_calls_pass_each_argument_as_the_prototype_says() {
    let dir = tempfile::tempdir().unwrap();
    // SAFETY: the stand-in has no initialisers.
    let lib = unsafe { Library::open(&stand_in(dir.path())) }.unwrap();
    assert_eq!(lib.found(), 4, "the stand-in's four functions are found, the others are not");

    // axpy with a host scalar and strides; the "device" memory is this process's.
    let mut x = vec![1.0f32, 0.0, 2.0, 0.0, 3.0];
    let mut y = vec![10.0f32, 20.0, 30.0];
    let alpha = floats(&[2.0]);
    let req = CublasSaxpyV2Request {
        handle: 7,
        n: 3,
        alpha: Ptr::In(&alpha),
        x: Ptr::Device(addr(&mut x)),
        incx: 2,
        y: Ptr::Device(addr(&mut y)),
        incy: 1,
        mode: 0,
    };
    // SAFETY: every address is of a live vector of the sizes the request gives.
    unsafe { req.call_vendor(&lib, &Objects) }.unwrap();
    assert_eq!(y, [12.0, 24.0, 36.0]);

    // dot: a host-mode result comes back in the reply.
    let req = CublasSdotV2Request {
        handle: 7,
        n: 3,
        x: Ptr::Device(addr(&mut x)),
        incx: 2,
        y: Ptr::Device(addr(&mut y)),
        incy: 1,
        result: Ptr::Out(4),
        mode: 0,
    };
    // SAFETY: `x` and `y` are live vectors of the lengths and strides the request gives;
    // the result goes into the reply.
    let reply = unsafe { req.call_vendor(&lib, &Objects) }.unwrap();
    assert_eq!(reply.result, Some(floats(&[12.0 + 2.0 * 24.0 + 3.0 * 36.0])));

    // A transposed GEMM with device-mode scalars, and the strided form.
    let mut a = vec![1.0f32, 2.0, 3.0, 4.0]; // 2x2, used transposed
    let mut b = vec![5.0f32, 6.0, 7.0, 8.0];
    let mut c = vec![1.0f32; 4];
    let mut scalars = vec![1.0f32, 1.0];
    let (alpha, beta) = (addr(&mut scalars), addr(&mut scalars) + 4);
    let req = CublasSgemmV2Request {
        handle: 7,
        transa: 1,
        transb: 0,
        m: 2,
        n: 2,
        k: 2,
        alpha: Ptr::Device(alpha),
        A: Ptr::Device(addr(&mut a)),
        lda: 2,
        B: Ptr::Device(addr(&mut b)),
        ldb: 2,
        beta: Ptr::Device(beta),
        C: Ptr::Device(addr(&mut c)),
        ldc: 2,
        mode: 1,
    };
    // SAFETY: `a`, `b` and `c` are live 2x2 matrices with the leading dimensions the request
    // gives, and `scalars` holds the two device-mode scalars.
    unsafe { req.call_vendor(&lib, &Objects) }.unwrap();
    // A^T = [[1,2],[3,4]], B = [[5,7],[6,8]]: A^T B = [[17,23],[39,53]], plus C.
    assert_eq!(c, [18.0, 40.0, 24.0, 54.0]);
    let mut c2 = vec![0.0f32; 8];
    let zero = floats(&[0.0]);
    let one = floats(&[1.0]);
    let req = CublasSgemmStridedBatchedRequest {
        handle: 7,
        transa: 0,
        transb: 0,
        m: 2,
        n: 2,
        k: 2,
        alpha: Ptr::In(&one),
        A: Ptr::Device(addr(&mut a)),
        lda: 2,
        strideA: 0,
        B: Ptr::Device(addr(&mut b)),
        ldb: 2,
        strideB: 0,
        beta: Ptr::In(&zero),
        C: Ptr::Device(addr(&mut c2)),
        ldc: 2,
        strideC: 4,
        batchCount: 2,
        mode: 0,
    };
    // SAFETY: the batch of two lies inside live arrays: `a` and `b` (stride 0: the same 2x2
    // matrix each time) and `c2` (two 2x2 matrices at stride 4).
    unsafe { req.call_vendor(&lib, &Objects) }.unwrap();
    // A B = [[1,3],[2,4]] [[5,7],[6,8]] = [[23,31],[34,46]], twice.
    assert_eq!(c2, [23.0, 34.0, 31.0, 46.0, 23.0, 34.0, 31.0, 46.0]);

    // A function the library lacks answers NOT_SUPPORTED, without calling anything.
    let req =
        CublasSscalV2Request { handle: 7, n: 1, alpha: Ptr::In(&one), x: Ptr::Device(addr(&mut c2)), incx: 1, mode: 0 };
    // SAFETY: `c2` is a live vector of the request's length; the stand-in library lacks the
    // entry point, so nothing is called.
    assert_eq!(unsafe { req.call_vendor(&lib, &Objects) }.unwrap_err(), CublasStatus::NOT_SUPPORTED);
}

/// A stand-in for libcurand: each function writes numbers its arguments determine, so a value
/// passed in the wrong place or with the wrong width shows.
const CURAND_STAND_IN: &str = r#"
#include <stddef.h>
#include <stdint.h>
int curandGenerateNormal(void *g, float *out, size_t n, float mean, float stddev) {
    if ((uintptr_t)g != 0x1234) return 101;
    for (size_t i = 0; i < n; ++i) out[i] = mean + stddev * (float)((int)(i % 3) - 1);
    return 0;
}
int curandGeneratePoissonMethod(void *g, unsigned *out, size_t n, double lambda, int method) {
    if ((uintptr_t)g != 0x1234) return 101;
    for (size_t i = 0; i < n; ++i) out[i] = (unsigned)lambda + (unsigned)method + (unsigned)i;
    return 0;
}
"#;

struct Generators;

impl phos_api_server::vendor::curand::Translate for Generators {
    fn object(&self, kind: &'static str, _: u64) -> Result<*mut std::ffi::c_void, phos_protocol::curand::CurandStatus> {
        assert_eq!(kind, "curand_generator");
        Ok(VENDOR_HANDLE as *mut std::ffi::c_void)
    }
}

#[test]
fn generated_curand_calls_pass_values_and_fill_host_outputs() {
    use phos_api_server::vendor::curand::{Library, VendorCall};
    use phos_protocol::curand::*;
    let dir = tempfile::tempdir().unwrap();
    // SAFETY: the stand-in has no initialisers.
    let lib = unsafe { Library::open(&build_stand_in(dir.path(), "libcurand_stand_in", CURAND_STAND_IN)) }.unwrap();
    assert_eq!(lib.found(), 2, "the stand-in's two functions are found, the others are not");

    // A device generator writes the "device" memory (this process's) in place.
    let mut out = vec![0.0f32; 4];
    let req = CurandGenerateNormalRequest {
        generator: 9,
        outputPtr: Ptr::Device(addr(&mut out)),
        n: 4,
        mean: 10.0,
        stddev: 2.0,
        on_host: 0,
    };
    // SAFETY: `out` is a live vector of the request's length.
    let reply = unsafe { req.call_vendor(&lib, &Generators) }.unwrap();
    assert_eq!(reply.outputPtr, None);
    assert_eq!(out, [8.0, 10.0, 12.0, 8.0]);

    // A host generator's numbers come back in the reply, as many bytes as the guest asked for.
    let req = CurandGeneratePoissonMethodRequest {
        generator: 9,
        outputPtr: Ptr::Out(12),
        n: 3,
        lambda: 40.0,
        method: 13,
        on_host: 1,
    };
    // SAFETY: the output is the reply's buffer of 12 bytes, three numbers.
    let reply = unsafe { req.call_vendor(&lib, &Generators) }.unwrap();
    let want: Vec<u8> = [53u32, 54, 55].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(reply.outputPtr, Some(want));

    // A function the library lacks answers cuRAND's not-supported status.
    let req = CurandGenerateUniformRequest { generator: 9, outputPtr: Ptr::Device(addr(&mut out)), num: 4, on_host: 0 };
    // SAFETY: the stand-in lacks the entry point, so nothing is called.
    assert_eq!(unsafe { req.call_vendor(&lib, &Generators) }.unwrap_err(), CurandStatus::ARCH_MISMATCH);
}
