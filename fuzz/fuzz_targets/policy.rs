//! The policy loader and VM: an ELF object from the input is loaded as the router loads an
//! operator's policy, described as `phosctl policy show` does, and asked about a few calls
//! (their contexts from the input's first 8 bytes) within its instruction budget.
#![no_main]

use libfuzzer_sys::fuzz_target;
use phos_fuzz::Fields;
use phos_policy::engine::{CallContext, KernelCheck, PolicySet};

/// Instructions per run: a policy that loops forever stops here.
const BUDGET: u64 = 20_000;

fuzz_target!(init: phos_fuzz::write_seeds_if_asked(), |input: &[u8]| {
    let mut f = Fields::new(input);
    let mut seed = f.u64() | 1;
    let elf = f.rest();
    let policies = PolicySet::new(BUDGET);
    if policies.load("fuzz", "input", elf, &[], KernelCheck::Skip, &|| false).is_err() {
        return;
    }
    let _ = policies.show("fuzz");
    let mut next = || {
        // xorshift64: varied contexts from one seed.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..4 {
        let mut ctx = CallContext {
            tenant: next() % 4,
            session: next() % 8,
            function: next() % 512,
            now_ns: next() >> 20,
            share: next() % 8,
            active_tenants: next() % 4,
            active_shares: next() % 16,
            awaited: next() % 2,
            ..Default::default()
        };
        for i in 0..ctx.amount.len() {
            ctx.amount[i] = next() >> (next() % 64);
            ctx.used[i] = next() >> (next() % 64);
            ctx.quota[i] = next() >> (next() % 64);
            ctx.queued[i] = next() % 16;
        }
        let _ = policies.decide(&ctx);
        let _ = policies.map_lookup("fuzz", "counts", &[0; 8]);
    }
});
