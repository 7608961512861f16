//! Synchronous calls sent again. A guest whose connection breaks while it waits for a
//! synchronous call's answer (a checkpoint's stop, a migration's hand-over, a VM's vsock
//! device unplugged for its move) sends the call again on a new channel, with the id it had
//! and flagged as resent. If the server had run it, running it again would do it twice (a
//! `cudaMalloc` twice leaks, a `cudaFree` twice fails, a `cublasCreate` twice leaks a
//! handle). So each channel keeps the last synchronous call it answered, with its reply
//! (the buffer it was sent from, swapped in: no copy), and a resent call whose id is kept is
//! answered with the kept reply without running again; one that is not kept never ran, and
//! runs.
//!
//! A guest thread has one synchronous call in flight at a time, and call ids are unique in
//! the guest process, so the id alone finds the call, whichever channel (whichever
//! connection of the thread) answered it. The reply is kept while the call still holds the
//! quiesce lock, so an image taken at rest has the reply of every call whose effects it
//! holds ([`phos_checkpoint::Manifest::sync_replies`]). Channels that end keep their last
//! reply a while (the guest may come back on another connection): the last
//! [`ENDED_KEPT`] of them, [`ENDED_BYTES`] at most.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use phos_checkpoint::KeptReply;
use phos_protocol::apis::Function;

/// Ended channels whose last reply is kept.
pub const ENDED_KEPT: usize = 1024;
/// Bytes of replies kept for ended channels.
pub const ENDED_BYTES: usize = 64 << 20;

/// How often a resent call looks again at a channel still running its first sending.
const POLL: Duration = Duration::from_millis(1);

/// The session's channels' kept replies.
#[derive(Default)]
pub struct SyncReplies {
    slots: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    live: Vec<Arc<ChannelReply>>,
    /// Oldest first.
    ended: VecDeque<Arc<ChannelReply>>,
    ended_bytes: usize,
}

/// One channel's last synchronous call.
#[derive(Default)]
pub struct ChannelReply {
    /// The synchronous call the channel runs now (0: none): a resent call of this id waits
    /// for it to finish and takes its reply.
    running: AtomicU64,
    kept: Mutex<KeptReply>,
}

/// What answering a resent synchronous call found.
#[derive(Debug, PartialEq, Eq)]
pub enum Resent {
    /// It ran: its status (the reply is now this channel's kept one).
    Ran(i32),
    /// It never ran (or its reply is no longer kept): run it.
    NotKept,
}

impl ChannelReply {
    /// A synchronous call starts on this channel.
    pub fn begin(&self, call_id: u64) {
        self.running.store(call_id, Ordering::Release);
    }

    /// The call that began is over (answered, kept or not).
    pub fn end(&self) {
        self.running.store(0, Ordering::Release);
    }

    /// Keep `out` as the reply to call `call_id` of `function`, answered `status`: the
    /// buffer is taken (the previous reply's comes back in its place, empty).
    pub fn keep(&self, call_id: u64, function: Function, status: i32, out: &mut Vec<u8>) {
        let mut k = self.kept.lock();
        k.call_id = call_id;
        k.api = function.api().id();
        k.function = function.id();
        k.status = status;
        std::mem::swap(&mut k.payload, out);
        out.clear();
    }

    /// Run `f` with the kept reply if it answers `call_id` (to send it).
    pub fn with_kept<T>(&self, call_id: u64, f: impl FnOnce(&KeptReply) -> T) -> Option<T> {
        let k = self.kept.lock();
        (k.call_id == call_id && call_id != 0).then(|| f(&k))
    }

    fn kept_bytes(&self) -> usize {
        self.kept.lock().payload.len()
    }
}

impl SyncReplies {
    /// A new channel's slot.
    pub fn channel(&self) -> Arc<ChannelReply> {
        let slot = Arc::new(ChannelReply::default());
        self.slots.lock().live.push(slot.clone());
        slot
    }

    /// The channel of `slot` ended: its last reply is kept among the ended channels'
    /// (the oldest of those go beyond the bounds).
    pub fn closed(&self, slot: &Arc<ChannelReply>) {
        let mut s = self.slots.lock();
        s.live.retain(|l| !Arc::ptr_eq(l, slot));
        if slot.kept.lock().call_id == 0 {
            return;
        }
        s.ended_bytes += slot.kept_bytes();
        s.ended.push_back(slot.clone());
        s.trim();
    }

    /// Answer a resent synchronous call `call_id` of `function` on the channel of `me`: if
    /// a channel of the session is still running its first sending, wait for it to end; if
    /// a channel kept its reply, that reply becomes `me`'s (so that a call sent a third
    /// time finds it too) and its status is answered.
    pub fn resent(&self, me: &ChannelReply, call_id: u64, function: Function) -> Resent {
        if call_id == 0 {
            return Resent::NotKept;
        }
        let started = Instant::now();
        let mut said = false;
        loop {
            let mut s = self.slots.lock();
            let others = || s.live.iter().chain(s.ended.iter()).filter(|o| !std::ptr::eq(o.as_ref(), me));
            if others().any(|o| o.running.load(Ordering::Acquire) == call_id) {
                drop(s);
                if !said && started.elapsed() > Duration::from_secs(1) {
                    said = true;
                    tracing::info!(call = call_id, "a resent call waits for its first sending to finish");
                }
                std::thread::sleep(POLL);
                continue;
            }
            let found = others().position(|o| o.kept.lock().call_id == call_id);
            let Some(i) = found else {
                let mine = me.kept.lock();
                // Sent a third time on the channel that took it over.
                if mine.call_id == call_id && (mine.api, mine.function) == (function.api().id(), function.id()) {
                    return Resent::Ran(mine.status);
                }
                return Resent::NotKept;
            };
            let other = others().nth(i).expect("found above").clone();
            let mut theirs = other.kept.lock();
            if (theirs.api, theirs.function) != (function.api().id(), function.id()) {
                // Another function under the same id: not a call sent again; it runs.
                return Resent::NotKept;
            }
            let taken = std::mem::take(&mut *theirs);
            drop(theirs);
            if let Some(at) = s.ended.iter().position(|e| Arc::ptr_eq(e, &other)) {
                s.ended.remove(at);
                s.ended_bytes = s.ended_bytes.saturating_sub(taken.payload.len());
            }
            let status = taken.status;
            *me.kept.lock() = taken;
            return Resent::Ran(status);
        }
    }

    /// What an image keeps: every channel's last reply (taken at rest).
    pub fn snapshot(&self) -> Vec<KeptReply> {
        let s = self.slots.lock();
        s.live.iter().chain(s.ended.iter()).map(|o| o.kept.lock().clone()).filter(|k| k.call_id != 0).collect()
    }

    /// Take an image's kept replies as this (fresh) session's, as replies of ended channels.
    pub fn load(&self, image: &[KeptReply]) {
        let mut s = self.slots.lock();
        for k in image {
            let slot = Arc::new(ChannelReply::default());
            *slot.kept.lock() = k.clone();
            s.ended_bytes += k.payload.len();
            s.ended.push_back(slot);
        }
        s.trim();
    }
}

impl Slots {
    fn trim(&mut self) {
        while self.ended.len() > ENDED_KEPT || (self.ended_bytes > ENDED_BYTES && self.ended.len() > 1) {
            let Some(old) = self.ended.pop_front() else { break };
            self.ended_bytes = self.ended_bytes.saturating_sub(old.kept_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use phos_protocol::cudart::FunctionId;

    const MALLOC: Function = Function::Cudart(FunctionId::CudaMalloc);
    const FREE: Function = Function::Cudart(FunctionId::CudaFree);

    fn answer(slot: &ChannelReply, id: u64, f: Function, status: i32, bytes: &[u8]) {
        slot.begin(id);
        let mut out = bytes.to_vec();
        slot.keep(id, f, status, &mut out);
        assert!(out.is_empty());
        slot.end();
    }

    #[test]
    fn a_resent_call_gets_the_reply_its_first_sending_had() {
        let replies = SyncReplies::default();
        let first = replies.channel();
        answer(&first, 7, MALLOC, 0, b"pointer");
        assert_eq!(first.with_kept(7, |k| k.payload.clone()), Some(b"pointer".to_vec()));
        replies.closed(&first);
        let second = replies.channel();
        assert_eq!(replies.resent(&second, 7, MALLOC), Resent::Ran(0));
        assert_eq!(second.with_kept(7, |k| k.payload.clone()), Some(b"pointer".to_vec()));
        // Sent a third time (the second connection was cut too): still answered.
        let third = replies.channel();
        assert_eq!(replies.resent(&third, 7, MALLOC), Resent::Ran(0));
        assert_eq!(replies.resent(&third, 7, MALLOC), Resent::Ran(0), "on the channel that has it");
        // A call that never ran, and one naming another function under a kept id.
        assert_eq!(replies.resent(&third, 8, MALLOC), Resent::NotKept);
        answer(&second, 9, FREE, 1, b"");
        assert_eq!(replies.resent(&third, 9, MALLOC), Resent::NotKept);
        assert_eq!(replies.resent(&third, 9, FREE), Resent::Ran(1), "an error is kept too");
    }

    #[test]
    fn a_resent_call_waits_for_its_first_sending_to_finish() {
        let replies = Arc::new(SyncReplies::default());
        let first = replies.channel();
        first.begin(11);
        let r = replies.clone();
        let resend = std::thread::spawn(move || {
            let second = r.channel();
            let answer = r.resent(&second, 11, MALLOC);
            (answer, second.with_kept(11, |k| k.payload.clone()))
        });
        std::thread::sleep(Duration::from_millis(30));
        let mut out = b"late".to_vec();
        first.keep(11, MALLOC, 0, &mut out);
        first.end();
        assert_eq!(resend.join().unwrap(), (Resent::Ran(0), Some(b"late".to_vec())));
    }

    #[test]
    fn ended_channels_keep_their_replies_within_bounds_and_images_carry_them() {
        let replies = SyncReplies::default();
        for id in 1..=(ENDED_KEPT as u64 + 5) {
            let c = replies.channel();
            answer(&c, id, MALLOC, 0, &id.to_le_bytes());
            replies.closed(&c);
        }
        let idle = replies.channel();
        replies.closed(&idle);
        let image = replies.snapshot();
        assert_eq!(image.len(), ENDED_KEPT, "the oldest went, a channel that answered nothing keeps nothing");
        assert_eq!(image[0].call_id, 6);
        let me = replies.channel();
        assert_eq!(replies.resent(&me, 3, MALLOC), Resent::NotKept);
        let big = replies.channel();
        answer(&big, 5000, MALLOC, 0, &vec![1; ENDED_BYTES]);
        replies.closed(&big);
        let other = replies.channel();
        answer(&other, 5001, MALLOC, 0, b"x");
        replies.closed(&other);
        assert_eq!(replies.resent(&me, 5000, MALLOC), Resent::NotKept, "over the bytes kept");
        assert_eq!(replies.resent(&me, 5001, MALLOC), Resent::Ran(0));

        // A restored session answers from its image.
        let restored = SyncReplies::default();
        restored.load(&replies.snapshot());
        let c = restored.channel();
        assert_eq!(restored.resent(&c, 5001, MALLOC), Resent::Ran(0));
        assert_eq!(c.with_kept(5001, |k| k.payload.clone()), Some(b"x".to_vec()));
        assert_eq!(restored.resent(&c, 2000, MALLOC), Resent::NotKept);
    }
}
