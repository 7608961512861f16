//! Generates the cudart wire types from the spec (see phos-codegen's `emit::wire`).

fn main() {
    let api = phos_codegen::build_support::load_spec(std::path::Path::new(phos_spec::CUDART_SPEC_PATH));
    phos_codegen::build_support::write_out("cudart_wire.rs", &phos_codegen::emit::wire::emit(&api));
}
