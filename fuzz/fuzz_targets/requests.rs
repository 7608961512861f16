//! Every remote function's request decoder, of every API, on any bytes (the function from the
//! first two: an index into `FUNCTIONS`): a request that decodes must encode back to the same
//! bytes, and the router's cost tables, which read requests before any server has checked
//! them, must take whatever arrives.
#![no_main]

use libfuzzer_sys::fuzz_target;
use phos_fuzz::Fields;
use phos_fuzz::reencode::FUNCTIONS;

fuzz_target!(init: phos_fuzz::write_seeds_if_asked(), |input: &[u8]| {
    let mut f = Fields::new(input);
    let function = FUNCTIONS[f.u16() as usize % FUNCTIONS.len()];
    let payload = f.rest();
    if let Some(Ok(again)) = phos_fuzz::reencode::reencode_request(function, payload) {
        assert_eq!(again, payload, "{function} request re-encodes differently");
    }
    let _ = phos_router::costs::charges(function, payload, &mut Vec::new());
});
