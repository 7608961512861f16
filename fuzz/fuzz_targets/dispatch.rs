//! The API server's generated dispatch of every API and the service behind it, on `emu`: a
//! script of calls (see `phos_fuzz::emu`) runs on a fresh session. A hostile call must get an error code;
//! one that succeeds must answer with its function's reply, encoded canonically.
#![no_main]

use libfuzzer_sys::fuzz_target;
use phos_fuzz::emu::{EmuServer, script};

fuzz_target!(init: phos_fuzz::write_seeds_if_asked(), |input: &[u8]| {
    let server = EmuServer::new();
    let mut out = Vec::new();
    for call in script(input) {
        out.clear();
        if server.call(call.function, call.device, call.payload, &mut out).is_ok() {
            let again = phos_fuzz::reencode::reencode_reply(call.function, &out)
                .expect("only remote functions succeed")
                .unwrap_or_else(|e| panic!("{}: the reply does not decode: {e}", call.function));
            assert_eq!(again, out, "{} reply re-encodes differently", call.function);
        }
    }
});
