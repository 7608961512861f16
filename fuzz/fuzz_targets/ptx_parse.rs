//! The PTX parser on any text: it must never panic, and what it parses must print as PTX
//! that parses back to the same tree (the printer is what rewritten kernels go through).
#![no_main]

use libfuzzer_sys::{Corpus, fuzz_target};

fuzz_target!(init: phos_fuzz::write_seeds_if_asked(), |input: &[u8]| -> Corpus {
    let Ok(text) = std::str::from_utf8(input) else { return Corpus::Reject };
    let Ok(module) = phos_ptx::parse(text) else { return Corpus::Keep };
    let _ = phos_ptx::signatures(&module);
    let printed = module.to_string();
    let again = phos_ptx::parse(&printed).unwrap_or_else(|e| panic!("printed PTX does not parse: {e}\n{printed}"));
    assert!(again.eq_ignoring_lines(&module), "printed PTX parses to another tree:\n{printed}");
    Corpus::Keep
});
