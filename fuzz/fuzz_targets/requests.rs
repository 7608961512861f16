//! Every remote function's request decoder, on any bytes (the function from the first two):
//! a request that decodes must encode back to the same bytes, and the router's cost table,
//! which reads requests before any server has checked them, must take whatever arrives.
#![no_main]

use libfuzzer_sys::fuzz_target;
use phos_fuzz::Fields;
use phos_protocol::cudart::FunctionId;

fuzz_target!(init: phos_fuzz::write_seeds_if_asked(), |input: &[u8]| {
    let mut f = Fields::new(input);
    let id = FunctionId::ALL[f.u16() as usize % FunctionId::ALL.len()];
    let payload = f.rest();
    if let Some(Ok(again)) = phos_fuzz::reencode::reencode_request(id, payload) {
        assert_eq!(again, payload, "{} request re-encodes differently", id.name());
    }
    let _ = phos_router::costs::charges(id, payload, &mut Vec::new());
});
