//! Where the C/R engine's time goes on the device: each step of a checkpoint or restore that
//! may hold up the session's own work (mapping the reserve, page-locking copy buffers,
//! copying aside, a launch issued while a window is armed, a replayed call) is timed, and
//! one that takes a millisecond or more is logged at debug level under the target
//! `phos::cr_timing` (`PHOS_LOG=info,phos::cr_timing=debug`). Nothing is measured unless that
//! level is on. The functions are the engine's ([`phos_checkpoint::timing`]), so that the
//! server's steps and the engine's log alike.

pub(crate) use phos_checkpoint::timing::{on, slow, timed};
