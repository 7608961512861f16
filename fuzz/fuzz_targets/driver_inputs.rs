//! The driver API's requests whose payloads Phos reads itself, on any bytes (which one from
//! the first byte): a JIT link's inputs (`phosLinkRun`, what `cuLinkComplete` sends, decoded
//! by the server from a hostile guest's bytes; what decodes must encode back and decode the
//! same) and a tensor map's arguments (`phosTensorMapEncode`: decoded, checked as the driver's
//! reference says, encoded as Phos's map, whose address is then replaced).
#![no_main]

use libfuzzer_sys::fuzz_target;
use phos_fuzz::Fields;
use phos_protocol::{jit_link, tensor_map};

fuzz_target!(init: phos_fuzz::write_seeds_if_asked(), |input: &[u8]| {
    let mut f = Fields::new(input);
    let which = f.u8();
    let payload = f.rest();
    if which % 2 == 0 {
        if let Ok(inputs) = jit_link::decode(payload) {
            let again = inputs.encode();
            assert_eq!(jit_link::decode(&again).as_ref(), Ok(&inputs), "a link request re-decodes differently");
        }
    } else if let Some(params) = tensor_map::Params::decode(payload) {
        assert_eq!(tensor_map::Params::decode(&params.encode()), Some(params), "tensor map arguments re-decode differently");
        if params.check().is_ok() {
            let mut map = params.phos_encoding();
            let _ = tensor_map::PhosMap::replace_address(&mut map, params.address.wrapping_add(16));
            let _ = tensor_map::PhosMap::read(&map);
        }
    }
});
