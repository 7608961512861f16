//! Generates the `extern "C"` exports of the CUDA runtime from the spec (phos-codegen's
//! `emit::guest`).

fn main() {
    let api = phos_codegen::build_support::load_spec(std::path::Path::new(phos_spec::CUDART_SPEC_PATH));
    phos_codegen::build_support::write_out("cudart_guest.rs", &phos_codegen::emit::guest::emit(&api));
}
