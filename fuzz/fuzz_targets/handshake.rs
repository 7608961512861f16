//! The handshake messages, on any bytes (which one from the first byte): the router decodes
//! a guest's `Hello` before it knows who the guest is (a `LegacyHello` from a guest built
//! before there were several APIs, which it then upgrades), the server an `Attach`, the guest
//! a `Welcome`, the router a server's `UsageReport`. What decodes must encode back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use phos_fuzz::Fields;
use phos_protocol::handshake::{Attach, Hello, LegacyHello, UsageReport, Welcome};

fn round_trip<T: bincode::Decode<()> + bincode::Encode>(payload: &[u8]) -> Option<T> {
    let message = phos_protocol::decode::<T>(payload).ok()?;
    assert_eq!(phos_protocol::encode(&message), payload, "{} re-encodes differently", std::any::type_name::<T>());
    Some(message)
}

fuzz_target!(init: phos_fuzz::write_seeds_if_asked(), |input: &[u8]| {
    let mut f = Fields::new(input);
    let which = f.u8();
    let payload = f.rest();
    match which % 5 {
        0 => drop(round_trip::<Hello>(payload)),
        1 => drop(round_trip::<Attach>(payload)),
        2 => drop(round_trip::<Welcome>(payload)),
        3 => drop(round_trip::<UsageReport>(payload)),
        _ => {
            if let Some(legacy) = round_trip::<LegacyHello>(payload) {
                let _ = legacy.upgrade();
            }
        }
    }
});
