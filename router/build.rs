//! Generates the router's per-call resource table of every API from the specs (phos-codegen's
//! `emit::costs`).

fn main() {
    let apis = phos_codegen::build_support::load_specs(phos_spec::SPEC_PATHS);
    phos_codegen::build_support::write_out("costs.rs", &phos_codegen::emit::costs::emit(&apis));
}
