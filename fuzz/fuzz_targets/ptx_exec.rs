//! The PTX interpreter: a kernel of a module parsed from the input runs on small buffers
//! with an instruction budget (launch and buffers: `phos_fuzz::kernel`). Any outcome but a
//! panic, a hang or a runaway allocation is fine.
#![no_main]

use libfuzzer_sys::{Corpus, fuzz_target};
use phos_fuzz::Fields;
use phos_fuzz::kernel::LaunchConfig;

fuzz_target!(init: phos_fuzz::write_seeds_if_asked(), |input: &[u8]| -> Corpus {
    let mut f = Fields::new(input);
    let config = LaunchConfig::read(&mut f);
    let Ok(text) = std::str::from_utf8(f.rest()) else { return Corpus::Reject };
    let Ok(module) = phos_ptx::parse(text) else { return Corpus::Reject };
    let _ = phos_fuzz::kernel::run(&module, &config);
    Corpus::Keep
});
