//! Generates the server's checked dispatch and the `CudartService` trait from the spec
//! (phos-codegen's `emit::server`).

fn main() {
    let api = phos_codegen::build_support::load_spec(std::path::Path::new(phos_spec::CUDART_SPEC_PATH));
    phos_codegen::build_support::write_out("cudart_server.rs", &phos_codegen::emit::server::emit(&api));
}
