//! Generates each API's checked dispatch and its service trait (`CudartService`, ...) from its
//! spec (phos-codegen's `emit::server`), as one module per API of `dispatch`, and the vendor
//! library calls of the library APIs (`emit::vendor`), as `vendor`.

/// The APIs the server runs with the vendor's own library, loaded at run time (`emit::vendor`:
/// the library's entry points and the calls made with checked requests).
const VENDOR_APIS: &[&str] = &["cublas", "curand", "cusolver", "cusparse", "cublaslt", "cufft"];

fn main() {
    let apis = phos_codegen::build_support::load_specs(phos_spec::SPEC_PATHS);
    phos_codegen::build_support::write_modules("dispatch.rs", &apis, "server", phos_codegen::emit::server::emit);
    let vendor: Vec<_> = apis.into_iter().filter(|a| VENDOR_APIS.contains(&a.name.as_str())).collect();
    phos_codegen::build_support::write_modules("vendor.rs", &vendor, "vendor", phos_codegen::emit::vendor::emit);
}
