//! Generates each API's checked dispatch and its service trait (`CudartService`, ...) from its
//! spec (phos-codegen's `emit::server`), as one module per API of `dispatch`.

fn main() {
    let apis = phos_codegen::build_support::load_specs(phos_spec::SPEC_PATHS);
    phos_codegen::build_support::write_modules("dispatch.rs", &apis, "server", phos_codegen::emit::server::emit);
}
