//! Generates the router's per-call resource table from the spec (phos-codegen's
//! `emit::costs`).

fn main() {
    let api = phos_codegen::build_support::load_spec(std::path::Path::new(phos_spec::CUDART_SPEC_PATH));
    phos_codegen::build_support::write_out("cudart_costs.rs", &phos_codegen::emit::costs::emit(&api));
}
