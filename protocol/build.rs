//! Generates the wire types of every API from its spec (phos-codegen's `emit::wire`) and what
//! the APIs share (`emit::apis`: the module of each API, API ids, `Function`, handle kinds,
//! resources).

fn main() {
    let apis = phos_codegen::build_support::load_specs(phos_spec::SPEC_PATHS);
    for api in &apis {
        phos_codegen::build_support::write_out(&format!("{}_wire.rs", api.name), &phos_codegen::emit::wire::emit(api));
    }
    phos_codegen::build_support::write_out("apis.rs", &phos_codegen::emit::apis::emit(&apis));
}
