//! The execution engine: blocks, warps, frames, scheduling and memory.
//!
//! See the module documentation of [`super`] for the design; this file is its implementation.

use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicI64, AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering::Relaxed,
};

use super::alu::{self, sext, trunc};
use super::float::{self, Rnd};
use super::ir::*;
use super::printf;
use super::texture;
use super::{FUNC_WINDOW, GlobalMemory, LOCAL_WINDOW, PARAM_WINDOW, Program, SHARED_WINDOW};

/// Warp-instructions a warp runs before the block scheduler moves on to the next warp.
const SLICE: u32 = 4096;
/// Deepest call stack a thread may build.
const MAX_DEPTH: usize = 1024;
/// Largest per-thread local memory (frames of all active calls).
const MAX_LOCAL: usize = 1 << 20;

const FULL: u32 = u32::MAX;

/// Why a block stopped.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Fault {
    Illegal(u64),
    Misaligned(u64),
    Trap,
    Assert(String),
    StackOverflow,
    BadCall(String),
    Deadlock,
    Timeout,
    /// A texture or surface instruction named a handle that is not an object of its kind.
    BadHandle {
        handle: u64,
        surface: bool,
    },
    /// A `.trap` surface access out of range.
    SurfaceTrap(String),
}

/// Everything a launch shares between workers.
pub(crate) struct Ctx<'a> {
    pub prog: &'a Program,
    pub kernel: u32,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub nthreads: u32,
    pub nwarps: u32,
    pub params: Vec<u8>,
    pub shared_off: Vec<u32>,
    pub shared_size: u32,
    pub dyn_smem: u32,
    pub memory: &'a dyn GlobalMemory,
    pub resources: &'a dyn super::Resources,
    pub workers: u32,
    pub abort: AtomicBool,
    /// Warp-instructions a worker may execute before the launch times out.
    pub limit: u64,
    /// Bytes of printf output the launch may still produce (the GPU's printf buffer is finite too).
    pub printf_budget: AtomicI64,
}

/// One call frame of a warp: a function's registers for all 32 lanes and the lanes' program counters.
#[derive(Default)]
struct Frame {
    func: u32,
    /// `regs[r * 32 + lane]`
    regs: Vec<u64>,
    /// Local-space address of this frame (same for every lane).
    base: u32,
    /// Lanes that entered this frame.
    members: u32,
    /// Lanes that executed `ret`.
    returned: u32,
    /// Lanes waiting at a warp-synchronous instruction for the rest of their member mask.
    sync_wait: u32,
    /// Per-lane program counters; for lanes of the current group, `pc` is authoritative instead.
    pcs: [u32; 32],
    /// The caller's call instruction (for return values).
    call_pc: u32,
    /// The group being executed: lanes at `pc`.
    pc: u32,
    group: u32,
    /// Lowest pc of runnable lanes outside the group (reaching it triggers a merge).
    next_pc: u32,
    /// The group was released from a warp-sync wait without its full member mask (avoids deadlock).
    forced: bool,
}

#[derive(Default)]
struct Warp {
    id: u32,
    valid: u32,
    exited: u32,
    tid: [[u32; 32]; 3],
    frames: Vec<Frame>,
    local: Vec<u8>,
    stride: usize,
    done: bool,
}

#[derive(Default, Clone)]
struct Barrier {
    arrived: u32,
    count: u32,
    popc: u32,
    all: bool,
    any: bool,
    /// (warp, lanes, destination, kind, frame depth)
    waiters: Vec<(u32, u32, Option<Reg>, BarKind, usize)>,
}

struct Block {
    ctaid: [u32; 3],
    shared: Vec<u8>,
    bars: Vec<Barrier>,
    bar_wait: Vec<u32>,
    /// bar.red results to deliver: (warp, frame depth, register, lanes, value)
    pending: Vec<(u32, usize, Reg, u32, u64)>,
    live: u32,
    printf: Vec<u8>,
}

enum Sched {
    Run,
    Blocked,
    Done,
}

enum Flow {
    Next,
    /// The group changed shape: lanes' pcs are stored; reschedule.
    Resched,
    Jump(u32),
    /// Yield the warp after this instruction (printf ordering).
    Yield,
}

/// Iterates over the set bits of a lane mask.
#[inline(always)]
fn lanes(mut m: u32) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if m == 0 {
            None
        } else {
            let l = m.trailing_zeros() as usize;
            m &= m - 1;
            Some(l)
        }
    })
}

type Lanes = [u64; 32];

#[inline(always)]
fn write(regs: &mut [u64], d: Reg, v: &Lanes, mask: u32) {
    let r = &mut regs[d as usize * 32..d as usize * 32 + 32];
    if mask == FULL {
        r.copy_from_slice(v);
    } else {
        for l in lanes(mask) {
            r[l] = v[l];
        }
    }
}

#[inline(always)]
fn pred_mask(regs: &[u64], p: Reg) -> u32 {
    let r = &regs[p as usize * 32..p as usize * 32 + 32];
    let mut m = 0u32;
    for (l, v) in r.iter().enumerate() {
        m |= ((*v & 1) as u32) << l;
    }
    m
}

/// Memory other than global: the block's shared memory, the warp's local memory and the kernel parameters.
struct Spaces<'b> {
    shared: &'b mut [u8],
    local: &'b mut [u8],
    stride: usize,
    params: &'b [u8],
}

#[inline(always)]
fn le_read(b: &[u8], size: usize) -> u64 {
    // Fixed-size reads compile to single moves; callers have checked the range.
    match size {
        1 => b.first().map_or(0, |&x| x as u64),
        2 => b.get(..2).map_or(0, |x| u16::from_le_bytes([x[0], x[1]]) as u64),
        4 => b.get(..4).map_or(0, |x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]) as u64),
        8 => b.get(..8).and_then(|x| <[u8; 8]>::try_from(x).ok()).map_or(0, u64::from_le_bytes),
        _ => {
            let mut x = [0u8; 8];
            let n = size.min(8).min(b.len());
            x[..n].copy_from_slice(&b[..n]);
            u64::from_le_bytes(x)
        }
    }
}

#[inline(always)]
fn le_write(b: &mut [u8], size: usize, v: u64) {
    let bytes = v.to_le_bytes();
    let n = size.min(8).min(b.len());
    match n {
        1 => b[0] = bytes[0],
        2 => b[..2].copy_from_slice(&bytes[..2]),
        4 => b[..4].copy_from_slice(&bytes[..4]),
        8 => b[..8].copy_from_slice(&bytes),
        _ => b[..n].copy_from_slice(&bytes[..n]),
    }
}

/// Splits a generic address into its space and the address within it.
#[inline(always)]
fn classify(a: u64) -> (Space, u64) {
    match a >> 56 {
        0xF1 => (Space::Shared, a - SHARED_WINDOW),
        0xF2 => (Space::Local, a - LOCAL_WINDOW),
        0xF3 => (Space::Param, a),
        _ => (Space::Global, a),
    }
}

pub(crate) struct Worker<'a> {
    ctx: &'a Ctx<'a>,
    smid: u32,
    lo: u64,
    hi: u64,
    pub instrs: u64,
    pool: Vec<Vec<u64>>,
    warps: Vec<Warp>,
    shared_buf: Vec<u8>,
    clock: u64,
}

impl<'a> Worker<'a> {
    pub fn new(ctx: &'a Ctx<'a>, smid: u32) -> Self {
        Worker {
            ctx,
            smid,
            lo: 1,
            hi: 0,
            instrs: 0,
            pool: Vec::new(),
            warps: Vec::new(),
            shared_buf: Vec::new(),
            clock: 0,
        }
    }

    fn regs(&mut self, n: u32) -> Vec<u64> {
        let len = n as usize * 32;
        match self.pool.pop() {
            Some(mut v) => {
                v.clear();
                v.resize(len, 0);
                v
            }
            None => vec![0; len],
        }
    }

    /// Runs block `linear` to completion. Returns its printf output and the fault that stopped it, if any.
    pub fn run_block(&mut self, linear: u64) -> (Vec<u8>, Option<(Fault, u32, u32)>) {
        let ctx = self.ctx;
        let [gx, gy, _] = ctx.grid.map(|x| x as u64);
        let ctaid = [(linear % gx) as u32, ((linear / gx) % gy) as u32, (linear / (gx * gy)) as u32];
        let mut shared = std::mem::take(&mut self.shared_buf);
        shared.clear();
        shared.resize(ctx.shared_size as usize, 0);
        let mut blk = Block {
            ctaid,
            shared,
            bars: vec![Barrier::default(); 17],
            bar_wait: vec![0; ctx.nwarps as usize],
            pending: Vec::new(),
            live: ctx.nthreads,
            printf: Vec::new(),
        };
        let func = &ctx.prog.funcs_ok[ctx.kernel as usize];
        let [bx, by, _] = ctx.block;
        let mut warps = std::mem::take(&mut self.warps);
        warps.resize_with(ctx.nwarps as usize, Warp::default);
        for (wi, w) in warps.iter_mut().enumerate() {
            let first = wi as u32 * 32;
            let n = (ctx.nthreads - first).min(32);
            w.id = wi as u32;
            w.valid = if n == 32 { FULL } else { (1u32 << n) - 1 };
            w.exited = 0;
            w.done = false;
            for l in 0..32u32 {
                let t = first + l;
                w.tid[0][l as usize] = t % bx;
                w.tid[1][l as usize] = (t / bx) % by;
                w.tid[2][l as usize] = t / (bx * by);
            }
            for f in w.frames.drain(..) {
                self.pool.push(f.regs);
            }
            let regs = self.regs(func.nregs);
            w.stride = (func.frame_size as usize).max(16);
            w.local.clear();
            w.local.resize(w.stride * 32, 0);
            w.frames.push(Frame {
                func: ctx.kernel,
                regs,
                base: 0,
                members: w.valid,
                pc: 0,
                group: w.valid,
                next_pc: u32::MAX,
                ..Frame::default()
            });
        }
        let mut fault = None;
        'outer: loop {
            let mut progress = false;
            let mut all_done = true;
            for wi in 0..warps.len() {
                if warps[wi].done {
                    continue;
                }
                all_done = false;
                match self.run_warp(&mut blk, &mut warps, wi) {
                    Ok(p) => progress |= p,
                    Err(e) => {
                        fault = Some(e);
                        break 'outer;
                    }
                }
                if ctx.abort.load(Relaxed) {
                    break 'outer;
                }
            }
            if all_done {
                break;
            }
            if !progress {
                let w = warps.iter().find(|w| !w.done);
                let (line, f) = w
                    .and_then(|w| w.frames.last())
                    .map(|f| (self.line_of(f.func, f.pc), f.func))
                    .unwrap_or((0, ctx.kernel));
                fault = Some((Fault::Deadlock, line, f));
                break;
            }
        }
        self.warps = warps;
        self.shared_buf = std::mem::take(&mut blk.shared);
        (blk.printf, fault)
    }

    fn line_of(&self, func: u32, pc: u32) -> u32 {
        self.ctx.prog.funcs_ok[func as usize].code.get(pc as usize).map_or(0, |i| i.line)
    }

    /// Picks the next group of lanes to run in the top frame of warp `w`.
    fn schedule(w: &mut Warp, blk_wait: u32) -> Sched {
        let exited = w.exited;
        let Some(fr) = w.frames.last_mut() else { return Sched::Done };
        let live = fr.members & !exited & !fr.returned;
        let runnable = live & !blk_wait & !fr.sync_wait;
        if runnable != 0 {
            let mut min = u32::MAX;
            for l in lanes(runnable) {
                min = min.min(fr.pcs[l]);
            }
            let mut group = 0;
            let mut next = u32::MAX;
            for l in lanes(runnable) {
                let p = fr.pcs[l];
                if p == min {
                    group |= 1 << l;
                } else {
                    next = next.min(p);
                }
            }
            fr.pc = min;
            fr.group = group;
            fr.next_pc = next;
            fr.forced = false;
            return Sched::Run;
        }
        if live == 0 {
            return Sched::Done;
        }
        if live & blk_wait != 0 {
            return Sched::Blocked;
        }
        // Only lanes waiting at warp-synchronous instructions remain: release the lowest group so the warp cannot
        // deadlock on a member mask naming lanes that will never arrive.
        let mut min = u32::MAX;
        for l in lanes(fr.sync_wait & live) {
            min = min.min(fr.pcs[l]);
        }
        let mut group = 0;
        for l in lanes(fr.sync_wait & live) {
            if fr.pcs[l] == min {
                group |= 1 << l;
            }
        }
        fr.sync_wait &= !group;
        fr.pc = min;
        fr.group = group;
        fr.next_pc = u32::MAX;
        fr.forced = true;
        let mut next = u32::MAX;
        for l in lanes(live & !group & !fr.sync_wait) {
            next = next.min(fr.pcs[l]);
        }
        fr.next_pc = next;
        Sched::Run
    }

    /// Stores the group's pc into its lanes and clears the group.
    fn park(fr: &mut Frame, lanes_mask: u32, pc: u32) {
        for l in lanes(lanes_mask) {
            fr.pcs[l] = pc;
        }
    }

    fn apply_pending(blk: &mut Block, w: &mut Warp) {
        if blk.pending.is_empty() {
            return;
        }
        let id = w.id;
        blk.pending.retain(|&(wi, depth, d, m, v)| {
            if wi != id {
                return true;
            }
            if let Some(fr) = w.frames.get_mut(depth) {
                let base = d as usize * 32;
                for l in lanes(m) {
                    if let Some(r) = fr.regs.get_mut(base + l) {
                        *r = v;
                    }
                }
            }
            false
        });
    }

    /// Runs one warp for up to a slice. Returns whether it executed anything.
    fn run_warp(&mut self, blk: &mut Block, warps: &mut [Warp], wi: usize) -> Result<bool, (Fault, u32, u32)> {
        let prog = self.ctx.prog;
        let w = &mut warps[wi];
        Self::apply_pending(blk, w);
        // The watchdog is checked on every visit too: a warp looping around a barrier never uses up a whole slice.
        if self.clock > self.ctx.limit {
            let (func, pc) = w.frames.last().map_or((self.ctx.kernel, 0), |f| (f.func, f.pc));
            return Err((Fault::Timeout, self.line_of(func, pc), func));
        }
        let mut budget = SLICE;
        let mut progressed = false;
        loop {
            let depth = w.frames.len();
            if depth == 0 {
                w.done = true;
                return Ok(progressed);
            }
            let need_sched = w.frames[depth - 1].group == 0;
            if need_sched {
                match Self::schedule(w, blk.bar_wait[wi]) {
                    Sched::Run => {}
                    Sched::Blocked => return Ok(progressed),
                    Sched::Done => {
                        self.pop_frame(w).map_err(|f| (f, 0, 0))?;
                        continue;
                    }
                }
            }
            if budget == 0 {
                if self.clock > self.ctx.limit {
                    let f = &w.frames[w.frames.len() - 1];
                    return Err((Fault::Timeout, self.line_of(f.func, f.pc), f.func));
                }
                return Ok(progressed);
            }
            let fi = w.frames.len() - 1;
            let (func_idx, pc) = (w.frames[fi].func, w.frames[fi].pc);
            let func = &prog.funcs_ok[func_idx as usize];
            let Some(inst) = func.code.get(pc as usize) else {
                return Err((Fault::Illegal(pc as u64), 0, func_idx));
            };
            budget -= 1;
            progressed = true;
            let group = w.frames[fi].group;
            self.instrs += group.count_ones() as u64;
            self.clock += 1;
            let mut act = group;
            if let Some((p, neg)) = inst.guard {
                let m = pred_mask(&w.frames[fi].regs, p);
                act &= if neg { !m } else { m };
            }
            let flow = self.exec(blk, w, wi, inst, act).map_err(|f| (f, inst.line, func_idx))?;
            let Some(fr) = w.frames.get_mut(fi) else { continue };
            match flow {
                Flow::Next => {
                    fr.pc += 1;
                    if fr.pc >= fr.next_pc {
                        let (g, p) = (fr.group, fr.pc);
                        Self::park(fr, g, p);
                        fr.group = 0;
                    }
                }
                Flow::Jump(t) => {
                    fr.pc = t;
                    if t >= fr.next_pc {
                        let g = fr.group;
                        Self::park(fr, g, t);
                        fr.group = 0;
                    }
                }
                Flow::Resched => fr.group = 0,
                Flow::Yield => {
                    fr.pc += 1;
                    let (g, p) = (fr.group, fr.pc);
                    Self::park(fr, g, p);
                    fr.group = 0;
                    return Ok(true);
                }
            }
        }
    }

    /// Pops a finished callee frame, copying return values to the caller.
    fn pop_frame(&mut self, w: &mut Warp) -> Result<(), Fault> {
        let Some(callee) = w.frames.pop() else { return Ok(()) };
        let Some(caller) = w.frames.last_mut() else {
            w.done = true;
            self.pool.push(callee.regs);
            return Ok(());
        };
        let prog = self.ctx.prog;
        let back = callee.members & !w.exited;
        let cfunc = &prog.funcs_ok[callee.func as usize];
        if back != 0
            && let Some(Inst { op: Op::Call(call), .. }) =
                prog.funcs_ok[caller.func as usize].code.get(callee.call_pc as usize)
        {
            for (slot, loc) in call.rets.iter().zip(&cfunc.rets) {
                for l in lanes(back) {
                    let v = read_loc(&callee, &w.local, w.stride, *loc, l);
                    match (slot, loc) {
                        (Slot::Frame(off, size), ParamLoc::Frame(_, lsize)) => {
                            let n = (*size).min(*lsize) as usize;
                            let src = l * w.stride + callee.base as usize + loc_off(loc);
                            let dst = l * w.stride + caller.base as usize + *off as usize;
                            w.local.copy_within(src..src + n, dst);
                        }
                        (Slot::Frame(off, size), ParamLoc::Reg(_)) => {
                            let dst = l * w.stride + caller.base as usize + *off as usize;
                            let n = (*size as usize).min(8);
                            le_write(&mut w.local[dst..], n, v);
                        }
                        (Slot::Value(Src::Reg(r)), _) => caller.regs[*r as usize * 32 + l] = v,
                        _ => {}
                    }
                }
            }
        }
        caller.group = 0;
        self.pool.push(callee.regs);
        Ok(())
    }

    // ----- operands -----

    #[inline(always)]
    fn rd(&self, w: &Warp, fr: &Frame, blk: &Block, s: Src, out: &mut Lanes) {
        match s {
            Src::Reg(r) => out.copy_from_slice(&fr.regs[r as usize * 32..r as usize * 32 + 32]),
            Src::Imm(v) => *out = [v; 32],
            Src::Special(sp) => self.special(w, blk, sp, out),
            Src::Var(i) => *out = [self.ctx.prog.var_addrs.get(i as usize).copied().unwrap_or(0); 32],
            Src::Shared(i) => *out = [self.ctx.shared_off.get(i as usize).copied().unwrap_or(0) as u64; 32],
            Src::Frame(off) => *out = [fr.base as u64 + off as u64; 32],
        }
    }

    #[inline(always)]
    fn rd1(&self, w: &Warp, fr: &Frame, blk: &Block, s: Src, lane: usize) -> u64 {
        match s {
            Src::Reg(r) => fr.regs[r as usize * 32 + lane],
            Src::Imm(v) => v,
            _ => {
                let mut o = [0; 32];
                self.rd(w, fr, blk, s, &mut o);
                o[lane]
            }
        }
    }

    fn special(&self, w: &Warp, blk: &Block, sp: Special, out: &mut Lanes) {
        let c = self.ctx;
        let all = |v: u64| [v; 32];
        *out = match sp {
            Special::Tid(k) => std::array::from_fn(|l| w.tid[k as usize][l] as u64),
            Special::NTid(k) => all(c.block[k as usize] as u64),
            Special::CtaId(k) => all(blk.ctaid[k as usize] as u64),
            Special::NCtaId(k) => all(c.grid[k as usize] as u64),
            Special::LaneId => std::array::from_fn(|l| l as u64),
            Special::WarpId => all(w.id as u64),
            Special::NWarpId => all(64),
            Special::SmId => all(self.smid as u64),
            Special::NSmId => all(c.workers as u64),
            Special::GridId => all(1),
            Special::LanemaskEq => std::array::from_fn(|l| 1u64 << l),
            Special::LanemaskLe => std::array::from_fn(|l| ((2u64 << l) - 1) & 0xffff_ffff),
            Special::LanemaskLt => std::array::from_fn(|l| (1u64 << l) - 1),
            Special::LanemaskGe => std::array::from_fn(|l| !((1u64 << l) - 1) & 0xffff_ffff),
            Special::LanemaskGt => std::array::from_fn(|l| !((2u64 << l) - 1) & 0xffff_ffff),
            Special::Clock => all(self.clock & 0xffff_ffff),
            Special::ClockHi => all(self.clock >> 32),
            Special::Clock64 => all(self.clock),
            Special::GlobalTimer | Special::GlobalTimerLo | Special::GlobalTimerHi => {
                let ns = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                all(match sp {
                    Special::GlobalTimerLo => ns & 0xffff_ffff,
                    Special::GlobalTimerHi => ns >> 32,
                    _ => ns,
                })
            }
            Special::DynamicSmem => all(c.dyn_smem as u64),
            Special::TotalSmem => all(c.shared_size as u64),
            Special::Zero => all(0),
            Special::One => all(1),
        };
    }

    // ----- memory -----

    #[inline(always)]
    fn global_check(&mut self, a: u64, size: u64) -> Result<(), Fault> {
        if a & (size - 1) != 0 {
            return Err(Fault::Misaligned(a));
        }
        let end = a.checked_add(size).ok_or(Fault::Illegal(a))?;
        if a >= self.lo && end <= self.hi {
            return Ok(());
        }
        match self.ctx.memory.region(a) {
            Some(r) if r.start <= a && end <= r.end => {
                self.lo = r.start;
                self.hi = r.end;
                Ok(())
            }
            _ => Err(Fault::Illegal(a)),
        }
    }

    /// Loads `size` bytes (1, 2, 4 or 8, naturally aligned) from `a` in `space` for `lane`.
    #[inline(always)]
    fn load(
        &mut self,
        sp: &mut Spaces,
        space: Space,
        a: u64,
        size: usize,
        align: u64,
        lane: usize,
    ) -> Result<u64, Fault> {
        let (space, a) = if space == Space::Generic { classify(a) } else { (space, a) };
        match space {
            Space::Global | Space::Const | Space::Generic => {
                self.global_check(a, align)?;
                if a.checked_add(size as u64).is_none() {
                    return Err(Fault::Illegal(a));
                }
                // SAFETY: the range lies in a region the backend guarantees is mapped, and is naturally aligned.
                #[expect(clippy::multiple_unsafe_ops_per_block, reason = "one arm runs: the same load at each width")]
                unsafe {
                    Ok(match size {
                        1 => AtomicU8::from_ptr(a as *mut u8).load(Relaxed) as u64,
                        2 => AtomicU16::from_ptr(a as *mut u16).load(Relaxed) as u64,
                        4 => AtomicU32::from_ptr(a as *mut u32).load(Relaxed) as u64,
                        _ => AtomicU64::from_ptr(a as *mut u64).load(Relaxed),
                    })
                }
            }
            Space::Shared => {
                let i = check_range(a, size, align, sp.shared.len(), SHARED_WINDOW)?;
                Ok(le_read(&sp.shared[i..], size))
            }
            Space::Local => {
                let i = check_range(a, size, align, sp.stride, LOCAL_WINDOW)?;
                Ok(le_read(&sp.local[lane * sp.stride + i..], size))
            }
            Space::Param => {
                if a >= PARAM_WINDOW {
                    let i = check_range(a - PARAM_WINDOW, size, align.min(size as u64), sp.params.len(), PARAM_WINDOW)?;
                    Ok(le_read(&sp.params[i..], size))
                } else {
                    let i = check_range(a, size, align, sp.stride, LOCAL_WINDOW)?;
                    Ok(le_read(&sp.local[lane * sp.stride + i..], size))
                }
            }
        }
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn store(
        &mut self,
        sp: &mut Spaces,
        space: Space,
        a: u64,
        size: usize,
        align: u64,
        lane: usize,
        v: u64,
    ) -> Result<(), Fault> {
        let (space, a) = if space == Space::Generic { classify(a) } else { (space, a) };
        match space {
            Space::Global | Space::Const | Space::Generic => {
                self.global_check(a, align)?;
                // SAFETY: as in `load`.
                #[expect(clippy::multiple_unsafe_ops_per_block, reason = "one arm runs: the same store at each width")]
                unsafe {
                    match size {
                        1 => AtomicU8::from_ptr(a as *mut u8).store(v as u8, Relaxed),
                        2 => AtomicU16::from_ptr(a as *mut u16).store(v as u16, Relaxed),
                        4 => AtomicU32::from_ptr(a as *mut u32).store(v as u32, Relaxed),
                        _ => AtomicU64::from_ptr(a as *mut u64).store(v, Relaxed),
                    }
                }
                Ok(())
            }
            Space::Shared => {
                let i = check_range(a, size, align, sp.shared.len(), SHARED_WINDOW)?;
                le_write(&mut sp.shared[i..], size, v);
                Ok(())
            }
            Space::Local => {
                let i = check_range(a, size, align, sp.stride, LOCAL_WINDOW)?;
                le_write(&mut sp.local[lane * sp.stride + i..], size, v);
                Ok(())
            }
            Space::Param => {
                if a >= PARAM_WINDOW {
                    // Kernel parameters are read-only.
                    return Err(Fault::Illegal(a));
                }
                let i = check_range(a, size, align, sp.stride, LOCAL_WINDOW)?;
                le_write(&mut sp.local[lane * sp.stride + i..], size, v);
                Ok(())
            }
        }
    }

    /// Executes one instruction for lanes `act` of the top frame's group.
    fn exec(&mut self, blk: &mut Block, w: &mut Warp, wi: usize, inst: &Inst, act: u32) -> Result<Flow, Fault> {
        let fi = w.frames.len() - 1;
        macro_rules! fr {
            () => {
                w.frames[fi]
            };
        }
        macro_rules! rd {
            ($s:expr) => {{
                let mut o = [0u64; 32];
                self.rd(w, &w.frames[fi], blk, $s, &mut o);
                o
            }};
        }
        macro_rules! map1 {
            ($d:expr, $a:expr, |$x:ident| $e:expr) => {{
                let mut xs = rd!($a);
                for $x in xs.iter_mut() {
                    *$x = $e;
                }
                write(&mut fr!().regs, $d, &xs, act);
            }};
        }
        macro_rules! map2 {
            ($d:expr, $a:expr, $b:expr, |$x:ident, $y:ident| $e:expr) => {{
                let mut xs = rd!($a);
                let ys = rd!($b);
                for (xr, $y) in xs.iter_mut().zip(ys.iter().copied()) {
                    let $x = *xr;
                    *xr = $e;
                }
                write(&mut fr!().regs, $d, &xs, act);
            }};
        }
        macro_rules! map3 {
            ($d:expr, $a:expr, $b:expr, $c:expr, |$x:ident, $y:ident, $z:ident| $e:expr) => {{
                let mut xs = rd!($a);
                let ys = rd!($b);
                let zs = rd!($c);
                for l in 0..32 {
                    let ($x, $y, $z) = (xs[l], ys[l], zs[l]);
                    xs[l] = $e;
                }
                write(&mut fr!().regs, $d, &xs, act);
            }};
        }
        if act == 0 && !matches!(inst.op, Op::Bra { .. } | Op::Brx { .. }) {
            return Ok(Flow::Next);
        }
        match &inst.op {
            Op::Nop => {}
            &Op::Mov { d, a, bits } => {
                if bits >= 64 {
                    let xs = rd!(a);
                    write(&mut fr!().regs, d, &xs, act);
                } else {
                    map1!(d, a, |x| trunc(*x, bits))
                }
            }
            Op::Pack { d, srcs, elem_bits } => {
                let mut acc = [0u64; 32];
                for (k, s) in srcs.iter().enumerate() {
                    let xs = rd!(*s);
                    for l in 0..32 {
                        acc[l] |= trunc(xs[l], *elem_bits) << (k as u32 * *elem_bits as u32).min(63);
                    }
                }
                write(&mut fr!().regs, *d, &acc, act);
            }
            Op::Unpack { ds, a, elem_bits } => {
                let xs = rd!(*a);
                for (k, d) in ds.iter().enumerate() {
                    if let Some(d) = d {
                        let sh = (k as u32 * *elem_bits as u32).min(63);
                        let ys: Lanes = std::array::from_fn(|l| trunc(xs[l] >> sh, *elem_bits));
                        write(&mut fr!().regs, *d, &ys, act);
                    }
                }
            }
            &Op::IBin { op, ty, d, a, b } => match (op, ty.bits, ty.signed) {
                (IBin::Add, 32, _) => map2!(d, a, b, |x, y| (x as u32).wrapping_add(y as u32) as u64),
                (IBin::Add, 64, _) => map2!(d, a, b, |x, y| x.wrapping_add(y)),
                (IBin::Sub, 32, _) => map2!(d, a, b, |x, y| (x as u32).wrapping_sub(y as u32) as u64),
                (IBin::MulLo, 32, _) => map2!(d, a, b, |x, y| (x as u32).wrapping_mul(y as u32) as u64),
                (IBin::MulWide, 32, true) => map2!(d, a, b, |x, y| ((x as i32 as i64) * (y as i32 as i64)) as u64),
                (IBin::MulWide, 32, false) => map2!(d, a, b, |x, y| (x as u32 as u64) * (y as u32 as u64)),
                (IBin::Shl, 32, _) => {
                    map2!(d, a, b, |x, y| if y as u32 >= 32 { 0 } else { ((x as u32) << y as u32) as u64 })
                }
                (IBin::And, 32, _) => map2!(d, a, b, |x, y| (x & y) & 0xffff_ffff),
                (IBin::And, 1, _) => map2!(d, a, b, |x, y| x & y & 1),
                (IBin::Or, 1, _) => map2!(d, a, b, |x, y| (x | y) & 1),
                _ => map2!(d, a, b, |x, y| alu::ibin(op, ty, x, y)),
            },
            &Op::Carry { sub, cin, cout, bits, d, a, b, cc } => {
                let xs = rd!(a);
                let ys = rd!(b);
                let cs = rd!(Src::Reg(cc));
                let mut r = [0u64; 32];
                let mut c = cs;
                for l in 0..32 {
                    let (v, co) = alu::carry(sub, cin, bits, xs[l], ys[l], cs[l]);
                    r[l] = v;
                    c[l] = co;
                }
                write(&mut fr!().regs, d, &r, act);
                if cout {
                    write(&mut fr!().regs, cc, &c, act);
                }
            }
            &Op::Mad { mode, ty, cin, cout, d, a, b, c, cc } => {
                let (xs, ys, zs) = (rd!(a), rd!(b), rd!(c));
                if !cin && !cout && mode == MadMode::Lo && ty.bits == 32 {
                    let r: Lanes = std::array::from_fn(|l| {
                        (xs[l] as u32).wrapping_mul(ys[l] as u32).wrapping_add(zs[l] as u32) as u64
                    });
                    write(&mut fr!().regs, d, &r, act);
                } else {
                    let cs = rd!(Src::Reg(cc));
                    let mut r = [0u64; 32];
                    let mut co = cs;
                    for l in 0..32 {
                        let (v, o) = alu::mad(mode, ty, xs[l], ys[l], zs[l], if cin { cs[l] } else { 0 });
                        r[l] = v;
                        co[l] = o;
                    }
                    write(&mut fr!().regs, d, &r, act);
                    if cout {
                        write(&mut fr!().regs, cc, &co, act);
                    }
                }
            }
            &Op::IUn { op, ty, d, a } => map1!(d, a, |x| alu::iun(op, ty, *x)),
            &Op::Bfe { ty, d, a, b, c } => map3!(d, a, b, c, |x, y, z| alu::bfe(ty, x, y, z)),
            &Op::Bfi { bits, d, a, b, c, e } => {
                let (xs, ys, zs, es) = (rd!(a), rd!(b), rd!(c), rd!(e));
                let r: Lanes = std::array::from_fn(|l| alu::bfi(bits, xs[l], ys[l], zs[l], es[l]));
                write(&mut fr!().regs, d, &r, act);
            }
            &Op::Prmt { mode, d, a, b, c } => map3!(d, a, b, c, |x, y, z| alu::prmt(mode, x, y, z)),
            &Op::Shf { left, clamp, d, a, b, c } => map3!(d, a, b, c, |x, y, z| alu::shf(left, clamp, x, y, z)),
            &Op::Bmsk { clamp, d, a, b } => map2!(d, a, b, |x, y| alu::bmsk(clamp, x, y)),
            &Op::Szext { clamp, signed, d, a, b } => map2!(d, a, b, |x, y| alu::szext(clamp, signed, x, y)),
            &Op::Lop3 { d, a, b, c, lut } => map3!(d, a, b, c, |x, y, z| alu::lop3(x, y, z, lut)),
            &Op::Sad { ty, d, a, b, c } => map3!(d, a, b, c, |x, y, z| alu::sad(ty, x, y, z)),
            &Op::Dp { kind, a_signed, b_signed, d, a, b, c } => {
                map3!(d, a, b, c, |x, y, z| alu::dp(kind, a_signed, b_signed, x, y, z))
            }
            &Op::Selp { bits, d, a, b, p } => map3!(d, a, b, p, |x, y, z| trunc(if z & 1 != 0 { x } else { y }, bits)),
            &Op::Slct { bits, float, ftz, d, a, b, c } => map3!(d, a, b, c, |x, y, z| {
                let take_a = if float { alu::f32_in(z, ftz) >= 0.0 } else { sext(z, 32) >= 0 };
                trunc(if take_a { x } else { y }, bits)
            }),
            &Op::Setp { cmp, ty, d, d2, a, b, comb } => {
                let (xs, ys) = (rd!(a), rd!(b));
                let mut r = [0u64; 32];
                if let (CmpTy::Int(t), Cmp::Lt | Cmp::Ge | Cmp::Eq | Cmp::Ne) = (ty, cmp) {
                    if t.bits == 32 {
                        for l in 0..32 {
                            let (x, y) = (xs[l] as u32, ys[l] as u32);
                            r[l] = match (cmp, t.signed) {
                                (Cmp::Eq, _) => x == y,
                                (Cmp::Ne, _) => x != y,
                                (Cmp::Lt, true) => (x as i32) < (y as i32),
                                (Cmp::Lt, false) => x < y,
                                (_, true) => (x as i32) >= (y as i32),
                                (_, false) => x >= y,
                            } as u64;
                        }
                    } else {
                        r = std::array::from_fn(|l| alu::compare(cmp, ty, xs[l], ys[l]) as u64);
                    }
                } else {
                    r = std::array::from_fn(|l| alu::compare(cmp, ty, xs[l], ys[l]) as u64);
                }
                let mut r2: Lanes = std::array::from_fn(|l| r[l] ^ 1);
                if let Some(cb) = comb {
                    let ps = rd!(cb.pred);
                    for l in 0..32 {
                        let p = (ps[l] & 1) ^ cb.negate as u64;
                        let f = |v: u64| match cb.op {
                            BoolOp::And => v & p,
                            BoolOp::Or => v | p,
                            BoolOp::Xor => v ^ p,
                        };
                        r[l] = f(r[l]);
                        r2[l] = f(r2[l]);
                    }
                }
                if let Some(d) = d {
                    write(&mut fr!().regs, d, &r, act);
                }
                if let Some(d2) = d2 {
                    write(&mut fr!().regs, d2, &r2, act);
                }
            }
            &Op::Set { cmp, ty, dfloat, d, a, b, comb } => {
                let (xs, ys) = (rd!(a), rd!(b));
                let ps = comb.map(|c| rd!(c.pred));
                let r: Lanes = std::array::from_fn(|l| {
                    let mut v = alu::compare(cmp, ty, xs[l], ys[l]);
                    if let (Some(cb), Some(ps)) = (comb, &ps) {
                        let p = (ps[l] & 1 != 0) ^ cb.negate;
                        v = match cb.op {
                            BoolOp::And => v & p,
                            BoolOp::Or => v | p,
                            BoolOp::Xor => v ^ p,
                        };
                    }
                    if dfloat {
                        if v { 1.0f32.to_bits() as u64 } else { 0 }
                    } else if v {
                        0xffff_ffff
                    } else {
                        0
                    }
                });
                write(&mut fr!().regs, d, &r, act);
            }
            &Op::FBin { op, ty, m, d, a, b } => match (op, ty, m.rnd, m.ftz, m.sat) {
                (FBin::Add, FTy::F32, Rnd::Rn, false, false) => {
                    map2!(d, a, b, |x, y| canon32(f32::from_bits(x as u32) + f32::from_bits(y as u32)))
                }
                (FBin::Mul, FTy::F32, Rnd::Rn, false, false) => {
                    map2!(d, a, b, |x, y| canon32(f32::from_bits(x as u32) * f32::from_bits(y as u32)))
                }
                (FBin::Sub, FTy::F32, Rnd::Rn, false, false) => {
                    map2!(d, a, b, |x, y| canon32(f32::from_bits(x as u32) - f32::from_bits(y as u32)))
                }
                (FBin::Add, FTy::F64, Rnd::Rn, _, false) => {
                    map2!(d, a, b, |x, y| canon64(f64::from_bits(x) + f64::from_bits(y), &[x, y]))
                }
                (FBin::Mul, FTy::F64, Rnd::Rn, _, false) => {
                    map2!(d, a, b, |x, y| canon64(f64::from_bits(x) * f64::from_bits(y), &[x, y]))
                }
                _ => map2!(d, a, b, |x, y| alu::fbin(op, ty, m, x, y)),
            },
            &Op::Fma { ty, m, d, a, b, c } => match (ty, m.rnd, m.ftz, m.sat) {
                (FTy::F32, Rnd::Rn, false, false) => map3!(d, a, b, c, |x, y, z| canon32(
                    f32::from_bits(x as u32).mul_add(f32::from_bits(y as u32), f32::from_bits(z as u32))
                )),
                (FTy::F64, Rnd::Rn, _, false) => map3!(d, a, b, c, |x, y, z| canon64(
                    f64::from_bits(x).mul_add(f64::from_bits(y), f64::from_bits(z)),
                    &[x, y, z]
                )),
                _ => map3!(d, a, b, c, |x, y, z| alu::ffma(ty, m, x, y, z)),
            },
            &Op::FUn { op, ty, m, d, a } => map1!(d, a, |x| alu::fun(op, ty, m, *x)),
            &Op::Testp { op, f64, d, a } => map1!(d, a, |x| alu::testp(op, f64, *x) as u64),
            &Op::Copysign { f64, d, a, b } => map2!(d, a, b, |x, y| {
                if f64 { (y & !(1 << 63)) | (x & (1 << 63)) } else { (y & 0x7fff_ffff) | (x & 0x8000_0000) }
            }),
            &Op::Cvt { to, from, rnd, sat, ftz, relu, d, a } => match (to, from) {
                (CvtTy::Int(t), CvtTy::Int(f)) if !sat && t.bits == 64 && f.bits == 32 => {
                    if f.signed {
                        map1!(d, a, |x| *x as u32 as i32 as i64 as u64)
                    } else {
                        map1!(d, a, |x| *x & 0xffff_ffff)
                    }
                }
                _ => map1!(d, a, |x| alu::cvt(to, from, rnd, sat, ftz, relu, *x)),
            },
            &Op::CvtPack { to, rnd, relu, sat, d, a, b } => {
                map2!(d, a, b, |x, y| alu::cvt_pack(to, rnd, relu, sat, x, y))
            }
            &Op::Cvta { to_generic, space, bits, d, a } => map1!(d, a, |x| trunc(cvta(to_generic, space, *x), bits)),
            &Op::Isspacep { space, d, a } => map1!(d, a, |x| {
                let (s, _) = classify(*x);
                (match space {
                    Space::Global | Space::Const | Space::Generic => s == Space::Global,
                    other => s == other,
                }) as u64
            }),
            Op::Ld { space, bits, signed, ds, addr } => self.ld(blk, w, fi, *space, *bits, *signed, ds, *addr, act)?,
            Op::St { space, bits, srcs, addr } => self.st(blk, w, fi, *space, *bits, srcs, *addr, act)?,
            Op::Atom { space, op, ty, d, addr, b, c } => {
                self.atom(blk, w, fi, *space, *op, *ty, *d, *addr, *b, *c, act)?
            }
            &Op::Bra { target } => {
                let fr = &mut fr!();
                if act == fr.group {
                    return Ok(Flow::Jump(target));
                }
                if act == 0 {
                    return Ok(Flow::Next);
                }
                let (g, pc) = (fr.group, fr.pc);
                Self::park(fr, act, target);
                Self::park(fr, g & !act, pc + 1);
                return Ok(Flow::Resched);
            }
            Op::Brx { a, targets } => {
                let xs = rd!(*a);
                let fr = &mut fr!();
                let (g, pc) = (fr.group, fr.pc);
                Self::park(fr, g & !act, pc + 1);
                for l in lanes(act) {
                    let t = targets.get(xs[l] as usize).copied().ok_or(Fault::Illegal(xs[l]))?;
                    fr.pcs[l] = t;
                }
                return Ok(Flow::Resched);
            }
            Op::Call(call) => return self.call(blk, w, call, act),
            &Op::CpAsync { dst, src, size, src_size } => {
                let (mut ds, mut ss, mut ns) = ([0u64; 32], [0u64; 32], [size as u64; 32]);
                let fr = &w.frames[fi];
                self.rd(w, fr, blk, dst.base, &mut ds);
                self.rd(w, fr, blk, src.base, &mut ss);
                if let Some(n) = src_size {
                    self.rd(w, fr, blk, n, &mut ns);
                }
                let size = size as usize;
                for l in lanes(act) {
                    let d = ds[l].wrapping_add(dst.offset as u64);
                    let s = ss[l].wrapping_add(src.offset as u64);
                    let valid = (ns[l] as usize).min(size);
                    let i = check_range(d, size, size as u64, blk.shared.len(), SHARED_WINDOW)?;
                    for k in 0..size {
                        let b = if k < valid {
                            let a = s.wrapping_add(k as u64);
                            self.global_check(a, 1)?;
                            // SAFETY: checked inside a mapped region.
                            unsafe { global_load(a, 1) }
                        } else {
                            0
                        };
                        blk.shared[i + k] = b as u8;
                    }
                }
            }
            Op::Builtin { which, args, ret } => return self.builtin(blk, w, *which, args, *ret, act),
            Op::Ret | Op::Exit => {
                let top = w.frames.len() == 1;
                let fr = &mut fr!();
                let (g, pc) = (fr.group, fr.pc);
                Self::park(fr, g & !act, pc + 1);
                if matches!(inst.op, Op::Exit) || top {
                    w.exited |= act;
                    blk.live -= (act & w.valid).count_ones();
                    for id in 0..blk.bars.len() {
                        bar_check(blk, id);
                    }
                } else {
                    fr.returned |= act;
                }
                return Ok(Flow::Resched);
            }
            Op::Trap => return Err(Fault::Trap),
            &Op::Bar { kind, id, count, d, pred, .. } => {
                let fr = &w.frames[fi];
                let first = act.trailing_zeros() as usize;
                let id = self.rd1(w, fr, blk, id, first);
                // Named barriers 0..15, plus the cluster barrier.
                let id = if id == super::lower::CLUSTER_BARRIER { 16 } else { (id & 15) as usize };
                let count = count.map(|c| self.rd1(w, fr, blk, c, first) as u32);
                let ps = pred.map(|(p, neg)| {
                    let v = rd!(p);
                    (v, neg)
                });
                let n = act.count_ones();
                let b = &mut blk.bars[id];
                if let Some(c) = count {
                    b.count = c;
                }
                if b.arrived == 0 {
                    b.all = true;
                    b.any = false;
                    b.popc = 0;
                }
                b.arrived += n;
                if let Some((v, neg)) = &ps {
                    for l in lanes(act) {
                        let p = (v[l] & 1 != 0) ^ neg;
                        b.popc += p as u32;
                        b.all &= p;
                        b.any |= p;
                    }
                }
                let depth = w.frames.len() - 1;
                if kind != BarKind::Arrive {
                    b.waiters.push((wi as u32, act, d, kind, depth));
                    blk.bar_wait[wi] |= act;
                }
                bar_check(blk, id);
                Self::apply_pending(blk, w);
                let fr = &mut fr!();
                let (g, pc) = (fr.group, fr.pc);
                Self::park(fr, g, pc + 1);
                return Ok(Flow::Resched);
            }
            &Op::WarpSync { mask } => {
                let m = self.rd1(w, &w.frames[fi], blk, mask, act.trailing_zeros() as usize) as u32;
                if self.sync_gather(w, fi, act, m).is_none() {
                    return Ok(Flow::Resched);
                }
            }
            &Op::Shfl { mode, d, p, a, b, c, mask } => {
                let parts = match mask {
                    Some(mk) => {
                        let m = self.rd1(w, &w.frames[fi], blk, mk, act.trailing_zeros() as usize) as u32;
                        match self.sync_gather(w, fi, act, m) {
                            Some(x) => x,
                            None => return Ok(Flow::Resched),
                        }
                    }
                    None => act,
                };
                let (xs, bs, cs) = (rd!(a), rd!(b), rd!(c));
                let mut r = [0u64; 32];
                let mut pv = [0u64; 32];
                for l in lanes(parts) {
                    let lane = l as u32;
                    let bv = bs[l] as u32 & 31;
                    let cv = cs[l] as u32;
                    let clamp = cv & 31;
                    let seg = (cv >> 8) & 31;
                    let max_lane = (lane & seg) | (clamp & !seg);
                    let min_lane = lane & seg;
                    let (j, ok) = match mode {
                        ShflMode::Up => {
                            let j = lane as i32 - bv as i32;
                            (j, j >= max_lane as i32)
                        }
                        ShflMode::Down => {
                            let j = (lane + bv) as i32;
                            (j, j <= max_lane as i32)
                        }
                        ShflMode::Bfly => {
                            let j = (lane ^ bv) as i32;
                            (j, j <= max_lane as i32)
                        }
                        ShflMode::Idx => {
                            let j = (min_lane | (bv & !seg)) as i32;
                            (j, j <= max_lane as i32)
                        }
                    };
                    let src = if ok && (0..32).contains(&j) { j as usize } else { l };
                    r[l] = trunc(xs[src], 32);
                    pv[l] = ok as u64;
                }
                if let Some(d) = d {
                    write(&mut fr!().regs, d, &r, parts);
                }
                if let Some(p) = p {
                    write(&mut fr!().regs, p, &pv, parts);
                }
                self.merge_parts(w, fi, parts);
            }
            &Op::Vote { mode, d, a, negate, mask } => {
                let parts = match mask {
                    Some(mk) => {
                        let m = self.rd1(w, &w.frames[fi], blk, mk, act.trailing_zeros() as usize) as u32;
                        match self.sync_gather(w, fi, act, m) {
                            Some(x) => x,
                            None => return Ok(Flow::Resched),
                        }
                    }
                    None => act,
                };
                let xs = rd!(a);
                let mut ballot = 0u32;
                for l in lanes(parts) {
                    if (xs[l] & 1 != 0) ^ negate {
                        ballot |= 1 << l;
                    }
                }
                let v = match mode {
                    VoteMode::All => (ballot == parts) as u64,
                    VoteMode::Any => (ballot != 0) as u64,
                    VoteMode::Uni => (ballot == 0 || ballot == parts) as u64,
                    VoteMode::Ballot => ballot as u64,
                };
                write(&mut fr!().regs, d, &[v; 32], parts);
                self.merge_parts(w, fi, parts);
            }
            &Op::Match { all, bits, d, p, a, mask } => {
                let m = self.rd1(w, &w.frames[fi], blk, mask, act.trailing_zeros() as usize) as u32;
                let Some(parts) = self.sync_gather(w, fi, act, m) else { return Ok(Flow::Resched) };
                let xs = rd!(a);
                let mut r = [0u64; 32];
                let mut pv = [0u64; 32];
                let first = xs[parts.trailing_zeros() as usize & 31];
                let same = lanes(parts).all(|l| trunc(xs[l], bits) == trunc(first, bits));
                for l in lanes(parts) {
                    if all {
                        r[l] = if same { parts as u64 } else { 0 };
                        pv[l] = same as u64;
                    } else {
                        let mut mm = 0u32;
                        for k in lanes(parts) {
                            if trunc(xs[k], bits) == trunc(xs[l], bits) {
                                mm |= 1 << k;
                            }
                        }
                        r[l] = mm as u64;
                    }
                }
                if let Some(d) = d {
                    write(&mut fr!().regs, d, &r, parts);
                }
                if let Some(p) = p {
                    write(&mut fr!().regs, p, &pv, parts);
                }
                self.merge_parts(w, fi, parts);
            }
            &Op::Redux { op, ty, d, a, mask } => {
                let m = self.rd1(w, &w.frames[fi], blk, mask, act.trailing_zeros() as usize) as u32;
                let Some(parts) = self.sync_gather(w, fi, act, m) else { return Ok(Flow::Resched) };
                let xs = rd!(a);
                let mut it = lanes(parts);
                let mut acc = it.next().map_or(0, |l| trunc(xs[l], 32));
                for l in it {
                    acc = alu::ibin(op, ty, acc, xs[l]);
                }
                write(&mut fr!().regs, d, &[alu::out_int(acc, ty); 32], parts);
                self.merge_parts(w, fi, parts);
            }
            &Op::Activemask { d } => {
                let g = fr!().group as u64;
                write(&mut fr!().regs, d, &[g; 32], act);
            }
            Op::Tex(t) => self.tex(blk, w, fi, t, act)?,
            Op::Surf(s) => self.surf(blk, w, fi, s, act)?,
            &Op::Query { surface, query, d, handle, level } => {
                let fr = &w.frames[fi];
                let (mut hs, mut ls) = ([0u64; 32], [0u64; 32]);
                self.rd(w, fr, blk, handle, &mut hs);
                if let Some(level) = level {
                    self.rd(w, fr, blk, level, &mut ls);
                }
                let res = self.ctx.resources;
                let mut r = [0u64; 32];
                for l in lanes(act) {
                    let h = hs[l];
                    let bad = Fault::BadHandle { handle: h, surface };
                    r[l] = if surface {
                        texture::surface_query(res.surface(h).ok_or(bad)?, query)
                    } else {
                        texture::texture_query(res.texture(h).ok_or(bad)?, query, level.map(|_| ls[l] as u32))
                    } as u64;
                }
                write(&mut fr!().regs, d, &r, act);
            }
            &Op::Elect { d, p, mask } => {
                let m = self.rd1(w, &w.frames[fi], blk, mask, act.trailing_zeros() as usize) as u32;
                let Some(parts) = self.sync_gather(w, fi, act, m) else { return Ok(Flow::Resched) };
                let leader = (parts & m).trailing_zeros().min(31);
                if let Some(d) = d {
                    write(&mut fr!().regs, d, &[leader as u64; 32], parts);
                }
                if let Some(p) = p {
                    let pv: Lanes = std::array::from_fn(|l| (l as u32 == leader && parts & m != 0) as u64);
                    write(&mut fr!().regs, p, &pv, parts);
                }
                self.merge_parts(w, fi, parts);
            }
        }
        Ok(Flow::Next)
    }

    /// `tex` and `tld4`: one lookup per active lane.
    fn tex(&mut self, blk: &Block, w: &mut Warp, fi: usize, t: &TexInst, act: u32) -> Result<(), Fault> {
        let fr = &w.frames[fi];
        let mut hs = [0u64; 32];
        self.rd(w, fr, blk, t.handle, &mut hs);
        let mut cs = [[0u64; 32]; 4];
        for (c, s) in cs.iter_mut().zip(&t.coords) {
            self.rd(w, fr, blk, *s, c);
        }
        // Level operand, or the x and y derivatives of up to three coordinates.
        let mut ls = [[0u64; 32]; 6];
        match &t.lod {
            LodSrc::Level(s) => self.rd(w, fr, blk, *s, &mut ls[0]),
            LodSrc::Grad(dx, dy) => {
                for (k, s) in dx.iter().take(3).enumerate() {
                    self.rd(w, fr, blk, *s, &mut ls[k]);
                }
                for (k, s) in dy.iter().take(3).enumerate() {
                    self.rd(w, fr, blk, *s, &mut ls[3 + k]);
                }
            }
            LodSrc::Implicit | LodSrc::Base => {}
        }
        let res = self.ctx.resources;
        let mut cached: Option<(u64, &texture::Texture)> = None;
        let mut out = [[0u64; 32]; 4];
        for l in lanes(act) {
            let h = hs[l];
            let tex = match cached {
                Some((ch, tex)) if ch == h => tex,
                _ => {
                    let tex = res.texture(h).ok_or(Fault::BadHandle { handle: h, surface: false })?;
                    cached = Some((h, tex));
                    tex
                }
            };
            let f = |k: usize| f32::from_bits(ls[k][l] as u32);
            let lod = match &t.lod {
                LodSrc::Implicit => texture::Lod::Implicit,
                LodSrc::Base => texture::Lod::Base,
                LodSrc::Level(_) => texture::Lod::Level(f(0)),
                LodSrc::Grad(..) => texture::Lod::Grad([f(0), f(1), f(2)], [f(3), f(4), f(5)]),
            };
            let q = texture::Lookup {
                geom: t.geom,
                coords: std::array::from_fn(|k| cs[k][l] as u32),
                int_coords: t.int_coords,
                lod,
                gather: t.gather,
            };
            let r = texture::lookup(tex, &q, &mut GlobalTexels(self))?;
            for (o, v) in out.iter_mut().zip(r) {
                o[l] = v as u64;
            }
        }
        let fr = &mut w.frames[fi];
        for (d, o) in t.ds.iter().zip(&out) {
            if let Some(d) = d {
                write(&mut fr.regs, *d, o, act);
            }
        }
        if let Some(p) = t.pred {
            // Every texel is resident.
            write(&mut fr.regs, p, &[1; 32], act);
        }
        Ok(())
    }

    /// `suld.b`, `sust.b`, `sust.p`.
    fn surf(&mut self, blk: &Block, w: &mut Warp, fi: usize, s: &SurfInst, act: u32) -> Result<(), Fault> {
        let fr = &w.frames[fi];
        let mut hs = [0u64; 32];
        self.rd(w, fr, blk, s.handle, &mut hs);
        let mut cs = [[0u64; 32]; 4];
        for (c, src) in cs.iter_mut().zip(&s.coords) {
            self.rd(w, fr, blk, *src, c);
        }
        let mut vals = [[0u64; 32]; 4];
        for (v, src) in vals.iter_mut().zip(&s.srcs) {
            self.rd(w, fr, blk, *src, v);
        }
        let res = self.ctx.resources;
        let esz = s.bits as usize / 8;
        let n = s.ds.len().max(s.srcs.len()).min(4);
        let mut out = [[0u64; 32]; 4];
        for l in lanes(act) {
            let h = hs[l];
            let surf = res.surface(h).ok_or(Fault::BadHandle { handle: h, surface: true })?;
            let mut c: [u32; 4] = std::array::from_fn(|k| cs[k][l] as u32);
            if s.formatted {
                // sust.p: the x coordinate counts elements, and the access is one element of the surface's format.
                let format = surf.array.format;
                let x = match s.geom {
                    texture::Geom::A1d | texture::Geom::A2d => 1,
                    _ => 0,
                };
                c[x] = c[x].wrapping_mul(format.element_size());
                let Some(a) = texture::surface_address(surf, s.geom, c, format.element_size(), s.oob)? else {
                    continue;
                };
                let size = format.ty.bytes() as usize;
                for (k, val) in vals.iter().enumerate().take(format.channels as usize) {
                    // Channels the source does not cover are unpredictable in PTX; they are written as zero.
                    let v = if k < n { texture::format_channel(format.ty, val[l] as u32) } else { 0 };
                    let at = a.wrapping_add((k * size) as u64);
                    self.global_check(at, size as u64)?;
                    // SAFETY: inside a mapped region and naturally aligned (checked above).
                    unsafe { global_store(at, size, v as u64) };
                }
                continue;
            }
            let Some(a) = texture::surface_address(surf, s.geom, c, (esz * n) as u32, s.oob)? else { continue };
            for k in 0..n {
                let at = a.wrapping_add((k * esz) as u64);
                self.global_check(at, esz as u64)?;
                if s.store {
                    // SAFETY: inside a mapped region and naturally aligned (checked above).
                    unsafe { global_store(at, esz, vals[k][l]) };
                } else {
                    // SAFETY: as above.
                    out[k][l] = unsafe { global_load(at, esz) };
                }
            }
        }
        let fr = &mut w.frames[fi];
        for (d, o) in s.ds.iter().zip(&out) {
            if let Some(d) = d {
                write(&mut fr.regs, *d, o, act);
            }
        }
        Ok(())
    }

    /// For a warp-synchronous instruction: returns the participating lanes once every non-exited lane of `mask` is
    /// here, or parks the active lanes to wait for the others (None).
    fn sync_gather(&mut self, w: &mut Warp, fi: usize, act: u32, mask: u32) -> Option<u32> {
        let exited = w.exited;
        let fr = &mut w.frames[fi];
        if fr.forced {
            // Released without its full mask (see `schedule`): this one instruction runs with the lanes present.
            fr.forced = false;
            return Some(act);
        }
        let pc = fr.pc;
        let mut waiting_here = 0u32;
        for l in lanes(fr.sync_wait) {
            if fr.pcs[l] == pc {
                waiting_here |= 1 << l;
            }
        }
        let have = act | waiting_here;
        let needed = mask & fr.members & !exited & !fr.returned;
        if needed & !have == 0 {
            fr.sync_wait &= !waiting_here;
            return Some(have);
        }
        let g = fr.group;
        Self::park(fr, act, pc);
        fr.sync_wait |= act;
        Self::park(fr, g & !act, pc + 1);
        None
    }

    /// Lanes that joined from a sync wait continue with the group.
    fn merge_parts(&mut self, w: &mut Warp, fi: usize, parts: u32) {
        let fr = &mut w.frames[fi];
        fr.group |= parts;
    }

    #[allow(clippy::too_many_arguments)]
    fn ld(
        &mut self,
        blk: &mut Block,
        w: &mut Warp,
        fi: usize,
        space: Space,
        bits: u8,
        signed: bool,
        ds: &[Option<Reg>],
        addr: Addr,
        act: u32,
    ) -> Result<(), Fault> {
        let mut base = [0u64; 32];
        self.rd(w, &w.frames[fi], blk, addr.base, &mut base);
        let esz = (bits / 8) as usize;
        let n = ds.len().min(8);
        if n == 1 && matches!(space, Space::Shared | Space::Global | Space::Const) {
            // Fast paths for the common scalar loads.
            let mut v = [0u64; 32];
            let off = addr.offset as u64;
            if space == Space::Shared {
                let sh = &blk.shared;
                for l in lanes(act) {
                    let i = check_range(base[l].wrapping_add(off), esz, esz as u64, sh.len(), SHARED_WINDOW)?;
                    v[l] = le_read(&sh[i..], esz);
                }
            } else {
                for l in lanes(act) {
                    let a = base[l].wrapping_add(off);
                    self.global_check(a, esz as u64)?;
                    // SAFETY: inside a mapped region and naturally aligned (checked above).
                    v[l] = unsafe { global_load(a, esz) };
                }
            }
            if signed {
                for x in v.iter_mut() {
                    *x = sext(*x, bits) as u64;
                }
            }
            if let Some(d) = ds[0] {
                write(&mut w.frames[fi].regs, d, &v, act);
            }
            return Ok(());
        }
        let align = ((esz * n) as u64).next_power_of_two();
        let mut vals = [[0u64; 32]; 8];
        let mut sp =
            Spaces { shared: &mut blk.shared, local: &mut w.local, stride: w.stride, params: &self.ctx.params };
        for l in lanes(act) {
            let a = base[l].wrapping_add(addr.offset as u64);
            for (k, val) in vals.iter_mut().enumerate().take(n) {
                let x = self.load(
                    &mut sp,
                    space,
                    a.wrapping_add((k * esz) as u64),
                    esz,
                    if k == 0 { align } else { esz as u64 },
                    l,
                )?;
                val[l] = if signed { sext(x, bits) as u64 } else { x };
            }
        }
        let fr = &mut w.frames[fi];
        for (k, d) in ds.iter().enumerate().take(n) {
            if let Some(d) = d {
                write(&mut fr.regs, *d, &vals[k], act);
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn st(
        &mut self,
        blk: &mut Block,
        w: &mut Warp,
        fi: usize,
        space: Space,
        bits: u8,
        srcs: &[Src],
        addr: Addr,
        act: u32,
    ) -> Result<(), Fault> {
        let mut base = [0u64; 32];
        self.rd(w, &w.frames[fi], blk, addr.base, &mut base);
        let esz = (bits / 8) as usize;
        let n = srcs.len().min(8);
        if n == 1 && matches!(space, Space::Shared | Space::Global) {
            let mut v = [0u64; 32];
            self.rd(w, &w.frames[fi], blk, srcs[0], &mut v);
            let off = addr.offset as u64;
            if space == Space::Shared {
                let len = blk.shared.len();
                for l in lanes(act) {
                    let i = check_range(base[l].wrapping_add(off), esz, esz as u64, len, SHARED_WINDOW)?;
                    le_write(&mut blk.shared[i..], esz, v[l]);
                }
            } else {
                for l in lanes(act) {
                    let a = base[l].wrapping_add(off);
                    self.global_check(a, esz as u64)?;
                    // SAFETY: inside a mapped region and naturally aligned (checked above).
                    unsafe { global_store(a, esz, v[l]) };
                }
            }
            return Ok(());
        }
        let align = ((esz * n) as u64).next_power_of_two();
        let mut vals = [[0u64; 32]; 8];
        for (k, s) in srcs.iter().enumerate().take(n) {
            self.rd(w, &w.frames[fi], blk, *s, &mut vals[k]);
        }
        let mut sp =
            Spaces { shared: &mut blk.shared, local: &mut w.local, stride: w.stride, params: &self.ctx.params };
        for l in lanes(act) {
            let a = base[l].wrapping_add(addr.offset as u64);
            // Check the whole vector's alignment before writing any of it.
            if a & (align - 1) != 0 {
                return Err(Fault::Misaligned(a));
            }
            for (k, val) in vals.iter().enumerate().take(n) {
                self.store(&mut sp, space, a.wrapping_add((k * esz) as u64), esz, esz as u64, l, val[l])?;
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn atom(
        &mut self,
        blk: &mut Block,
        w: &mut Warp,
        fi: usize,
        space: Space,
        op: AtomOp,
        ty: AtomTy,
        d: Option<Reg>,
        addr: Addr,
        b: Src,
        c: Src,
        act: u32,
    ) -> Result<(), Fault> {
        let mut base = [0u64; 32];
        let mut bs = [0u64; 32];
        let mut cs = [0u64; 32];
        {
            let fr = &w.frames[fi];
            self.rd(w, fr, blk, addr.base, &mut base);
            self.rd(w, fr, blk, b, &mut bs);
            self.rd(w, fr, blk, c, &mut cs);
        }
        let size: usize = match ty {
            AtomTy::Int(t) => (t.bits / 8) as usize,
            AtomTy::F32 | AtomTy::F16x2 | AtomTy::BF16x2 => 4,
            AtomTy::F64 => 8,
            AtomTy::F16 | AtomTy::BF16 => 2,
        };
        let mut olds = [0u64; 32];
        for l in lanes(act) {
            let a0 = base[l].wrapping_add(addr.offset as u64);
            let (sp, a) = if space == Space::Generic { classify(a0) } else { (space, a0) };
            let (bv, cv) = (bs[l], cs[l]);
            let old = match sp {
                Space::Global | Space::Const | Space::Generic => {
                    self.global_check(a, size as u64)?;
                    // SAFETY: checked to be inside a mapped region and naturally aligned.
                    unsafe { global_atomic(a, size, op, ty, bv, cv) }
                }
                Space::Shared | Space::Local | Space::Param => {
                    let (buf, idx) = match sp {
                        Space::Shared => {
                            let i = check_range(a, size, size as u64, blk.shared.len(), SHARED_WINDOW)?;
                            (&mut blk.shared[..], i)
                        }
                        _ => {
                            let i = check_range(a, size, size as u64, w.stride, LOCAL_WINDOW)?;
                            (&mut w.local[..], l * w.stride + i)
                        }
                    };
                    let old = le_read(&buf[idx..], size);
                    if let Some(new) = atom_apply(op, ty, old, bv, cv) {
                        le_write(&mut buf[idx..], size, new);
                    }
                    old
                }
            };
            olds[l] = match ty {
                AtomTy::Int(t) => alu::out_int(old, t),
                _ => old,
            };
        }
        if let Some(d) = d {
            write(&mut w.frames[fi].regs, d, &olds, act);
        }
        Ok(())
    }

    fn call(&mut self, blk: &mut Block, w: &mut Warp, call: &Call, act: u32) -> Result<Flow, Fault> {
        let prog = self.ctx.prog;
        let fi = w.frames.len() - 1;
        let (pc, group) = (w.frames[fi].pc, w.frames[fi].group);
        // Pick the callee; for indirect calls, the lanes sharing the first lane's target go now, the rest later.
        let (callee, lanes_now) = match call.func {
            Some(f) => (f, act),
            None => {
                let mut ts = [0u64; 32];
                self.rd(w, &w.frames[fi], blk, call.target, &mut ts);
                let first = ts[act.trailing_zeros() as usize];
                let mut same = 0u32;
                for l in lanes(act) {
                    if ts[l] == first {
                        same |= 1 << l;
                    }
                }
                let idx = first.wrapping_sub(FUNC_WINDOW);
                if first < FUNC_WINDOW || idx >= prog.funcs_ok.len() as u64 || !prog.func_ok(idx as u32) {
                    return Err(Fault::Illegal(first));
                }
                (idx as u32, same)
            }
        };
        if w.frames.len() >= MAX_DEPTH {
            return Err(Fault::StackOverflow);
        }
        let cf = &prog.funcs_ok[callee as usize];
        if cf.params.len() != call.args.len() || cf.rets.len() < call.rets.len() {
            return Err(Fault::BadCall(format!("call to `{}` with the wrong number of arguments", cf.name)));
        }
        let caller_fn = &prog.funcs_ok[w.frames[fi].func as usize];
        let align = cf.frame_align.max(16) as usize;
        let base = (w.frames[fi].base as usize + caller_fn.frame_size as usize).div_ceil(align) * align;
        let need = base + cf.frame_size as usize;
        if need > w.stride {
            if need > MAX_LOCAL {
                return Err(Fault::StackOverflow);
            }
            let ns = (need.max(w.stride * 2)).min(MAX_LOCAL).div_ceil(16) * 16;
            let mut nl = vec![0u8; ns * 32];
            for l in 0..32 {
                nl[l * ns..l * ns + w.stride].copy_from_slice(&w.local[l * w.stride..(l + 1) * w.stride]);
            }
            w.local = nl;
            w.stride = ns;
        }
        let mut regs = self.regs(cf.nregs);
        // Arguments.
        for (slot, loc) in call.args.iter().zip(&cf.params) {
            let mut vals = [0u64; 32];
            if let Slot::Value(s) = slot {
                self.rd(w, &w.frames[fi], blk, *s, &mut vals);
            }
            let cbase = w.frames[fi].base as usize;
            for l in lanes(lanes_now) {
                match (slot, loc) {
                    (Slot::Frame(off, size), ParamLoc::Frame(poff, psize)) => {
                        let n = (*size).min(*psize) as usize;
                        let src = l * w.stride + cbase + *off as usize;
                        let dst = l * w.stride + base + *poff as usize;
                        w.local.copy_within(src..src + n, dst);
                    }
                    (Slot::Frame(off, size), ParamLoc::Reg(r)) => {
                        let src = l * w.stride + cbase + *off as usize;
                        regs[*r as usize * 32 + l] = le_read(&w.local[src..], (*size as usize).min(8));
                    }
                    (Slot::Value(_), ParamLoc::Frame(poff, psize)) => {
                        let dst = l * w.stride + base + *poff as usize;
                        le_write(&mut w.local[dst..], (*psize as usize).min(8), vals[l]);
                    }
                    (Slot::Value(_), ParamLoc::Reg(r)) => regs[*r as usize * 32 + l] = vals[l],
                }
            }
        }
        let fr = &mut w.frames[fi];
        Self::park(fr, group & !lanes_now & !act, pc + 1);
        Self::park(fr, act & !lanes_now, pc);
        Self::park(fr, lanes_now, pc + 1);
        fr.group = 0;
        w.frames.push(Frame {
            func: callee,
            regs,
            base: base as u32,
            members: lanes_now,
            call_pc: pc,
            pc: 0,
            group: lanes_now,
            next_pc: u32::MAX,
            ..Frame::default()
        });
        Ok(Flow::Resched)
    }

    fn builtin(
        &mut self,
        blk: &mut Block,
        w: &mut Warp,
        which: Builtin,
        args: &[Slot],
        ret: Option<Slot>,
        act: u32,
    ) -> Result<Flow, Fault> {
        let fi = w.frames.len() - 1;
        let base = w.frames[fi].base as usize;
        // Argument values per lane, read up front.
        let mut argv = vec![[0u64; 32]; args.len()];
        for (k, slot) in args.iter().enumerate() {
            match slot {
                Slot::Frame(off, size) => {
                    for l in lanes(act) {
                        argv[k][l] = le_read(&w.local[l * w.stride + base + *off as usize..], (*size as usize).min(8));
                    }
                }
                Slot::Value(s) => self.rd(w, &w.frames[fi], blk, *s, &mut argv[k]),
            }
        }
        let arg = |k: usize, l: usize| argv.get(k).map_or(0, |a| a[l]);
        let mut rets = [0u64; 32];
        for l in lanes(act) {
            match which {
                Builtin::Vprintf => {
                    let (fmt, argp) = (arg(0, l), arg(1, l));
                    let mut mem =
                        PrintfMem { worker: self, shared: &blk.shared, local: &w.local, stride: w.stride, lane: l };
                    let start = blk.printf.len();
                    let r = printf::format(&mut mem, fmt, argp, &mut blk.printf)?;
                    let n = (blk.printf.len() - start) as i64;
                    if self.ctx.printf_budget.fetch_sub(n, Relaxed) < n {
                        // Over the launch's printf budget: the output is dropped, as when the GPU's buffer fills.
                        blk.printf.truncate(start);
                    }
                    rets[l] = r as u32 as u64;
                }
                Builtin::AssertFail => {
                    let (msg, file, line, func) = (arg(0, l), arg(1, l), arg(2, l), arg(3, l));
                    let mut mem =
                        PrintfMem { worker: self, shared: &blk.shared, local: &w.local, stride: w.stride, lane: l };
                    let s = |m: &mut PrintfMem, a: u64| {
                        String::from_utf8_lossy(&printf::read_cstr(m, a, 4096)).into_owned()
                    };
                    let (msg, file, func) = (s(&mut mem, msg), s(&mut mem, file), s(&mut mem, func));
                    let c = blk.ctaid;
                    let text = format!(
                        "{file}:{}: {func}: block: [{},{},{}], thread: [{},{},{}] Assertion `{msg}` failed.\n",
                        line as u32, c[0], c[1], c[2], w.tid[0][l], w.tid[1][l], w.tid[2][l]
                    );
                    blk.printf.extend_from_slice(text.as_bytes());
                    return Err(Fault::Assert(msg));
                }
            }
        }
        if let Some(slot) = ret {
            match slot {
                Slot::Frame(off, size) => {
                    for l in lanes(act) {
                        let i = l * w.stride + base + off as usize;
                        le_write(&mut w.local[i..], (size as usize).min(4), rets[l]);
                    }
                }
                Slot::Value(Src::Reg(r)) => write(&mut w.frames[fi].regs, r, &rets, act),
                _ => {}
            }
        }
        Ok(if which == Builtin::Vprintf { Flow::Yield } else { Flow::Next })
    }
}

fn loc_off(loc: &ParamLoc) -> usize {
    match loc {
        ParamLoc::Frame(o, _) => *o as usize,
        ParamLoc::Reg(_) => 0,
    }
}

fn read_loc(fr: &Frame, local: &[u8], stride: usize, loc: ParamLoc, l: usize) -> u64 {
    match loc {
        ParamLoc::Frame(off, size) => {
            le_read(&local[l * stride + fr.base as usize + off as usize..], (size as usize).min(8))
        }
        ParamLoc::Reg(r) => fr.regs[r as usize * 32 + l],
    }
}

/// Texel reads for texture lookups: global loads, checked like any other.
struct GlobalTexels<'w, 'a>(&'w mut Worker<'a>);

impl texture::TexelMemory for GlobalTexels<'_, '_> {
    fn read(&mut self, addr: u64, size: usize) -> Result<u64, Fault> {
        self.0.global_check(addr, size as u64)?;
        // SAFETY: inside a mapped region and naturally aligned (checked above).
        Ok(unsafe { global_load(addr, size) })
    }
}

/// Device memory access for printf: generic addresses of any space, for one lane.
pub(crate) struct PrintfMem<'w, 'a> {
    worker: &'w mut Worker<'a>,
    shared: &'w [u8],
    local: &'w [u8],
    stride: usize,
    lane: usize,
}

impl printf::Memory for PrintfMem<'_, '_> {
    fn read(&mut self, addr: u64, size: usize) -> Result<u64, Fault> {
        let (space, a) = classify(addr);
        match space {
            Space::Shared => {
                let i = check_range(a, size, 1, self.shared.len(), SHARED_WINDOW)?;
                Ok(le_read(&self.shared[i..], size))
            }
            Space::Local => {
                let i = check_range(a, size, 1, self.stride, LOCAL_WINDOW)?;
                Ok(le_read(&self.local[self.lane * self.stride + i..], size))
            }
            Space::Param => {
                let p = &self.worker.ctx.params;
                let i = check_range(a - PARAM_WINDOW, size, 1, p.len(), PARAM_WINDOW)?;
                Ok(le_read(&p[i..], size))
            }
            _ => {
                // Byte by byte: printf arguments need not be naturally aligned in every corner case.
                let mut v = 0u64;
                for k in 0..size {
                    let b = a.wrapping_add(k as u64);
                    self.worker.global_check(b, 1)?;
                    // SAFETY: checked inside a mapped region.
                    let x = unsafe { AtomicU8::from_ptr(b as *mut u8).load(Relaxed) };
                    v |= (x as u64) << (8 * k);
                }
                Ok(v)
            }
        }
    }
}

/// Checks an access of `size` bytes at `a` against a buffer of `len` bytes; returns the index.
#[inline(always)]
fn check_range(a: u64, size: usize, align: u64, len: usize, window: u64) -> Result<usize, Fault> {
    if a & (align.max(1) - 1) != 0 {
        return Err(Fault::Misaligned(a.wrapping_add(window)));
    }
    match a.checked_add(size as u64) {
        Some(end) if end <= len as u64 => Ok(a as usize),
        _ => Err(Fault::Illegal(a.wrapping_add(window))),
    }
}

fn cvta(to_generic: bool, space: Space, x: u64) -> u64 {
    match (to_generic, space) {
        (_, Space::Global | Space::Const | Space::Generic) => x,
        (true, Space::Shared) => x.wrapping_add(SHARED_WINDOW),
        (true, Space::Local) => x.wrapping_add(LOCAL_WINDOW),
        (true, Space::Param) => {
            if x >= PARAM_WINDOW {
                x
            } else {
                x.wrapping_add(LOCAL_WINDOW)
            }
        }
        (false, Space::Shared) => x.wrapping_sub(SHARED_WINDOW),
        (false, Space::Local) => x.wrapping_sub(LOCAL_WINDOW),
        (false, Space::Param) => {
            if x >> 56 == LOCAL_WINDOW >> 56 {
                x - LOCAL_WINDOW
            } else {
                x
            }
        }
    }
}

#[inline(always)]
fn canon32(x: f32) -> u64 {
    if x.is_nan() { float::NAN32 as u64 } else { x.to_bits() as u64 }
}

#[inline(always)]
fn canon64(x: f64, ins: &[u64]) -> u64 {
    if x.is_nan() { float::nan64(ins) } else { x.to_bits() }
}

/// The new value an atomic stores, given the old one (None: store nothing, as for a failed CAS).
fn atom_apply(op: AtomOp, ty: AtomTy, old: u64, b: u64, c: u64) -> Option<u64> {
    Some(match ty {
        AtomTy::Int(t) => {
            let bits = t.bits;
            match op {
                AtomOp::Add => trunc(old.wrapping_add(b), bits),
                AtomOp::And => old & b,
                AtomOp::Or => old | b,
                AtomOp::Xor => old ^ b,
                AtomOp::Exch => trunc(b, bits),
                AtomOp::Min => alu::ibin(IBin::Min, t, old, b),
                AtomOp::Max => alu::ibin(IBin::Max, t, old, b),
                AtomOp::Inc => {
                    let (o, bb) = (trunc(old, bits), trunc(b, bits));
                    if o >= bb { 0 } else { o + 1 }
                }
                AtomOp::Dec => {
                    let (o, bb) = (trunc(old, bits), trunc(b, bits));
                    if o == 0 || o > bb { bb } else { o - 1 }
                }
                AtomOp::Cas => {
                    if trunc(old, bits) == trunc(b, bits) {
                        trunc(c, bits)
                    } else {
                        return None;
                    }
                }
            }
        }
        AtomTy::F32 => {
            let m = FMode { rnd: Rnd::Rn, ftz: false, sat: false };
            match op {
                AtomOp::Add => alu::fbin(FBin::Add, FTy::F32, m, old, b),
                AtomOp::Min => alu::fbin(FBin::Min, FTy::F32, m, old, b),
                AtomOp::Max => alu::fbin(FBin::Max, FTy::F32, m, old, b),
                _ => b & 0xffff_ffff,
            }
        }
        AtomTy::F64 => {
            let m = FMode { rnd: Rnd::Rn, ftz: false, sat: false };
            match op {
                AtomOp::Add => alu::fbin(FBin::Add, FTy::F64, m, old, b),
                AtomOp::Min => alu::fbin(FBin::Min, FTy::F64, m, old, b),
                AtomOp::Max => alu::fbin(FBin::Max, FTy::F64, m, old, b),
                _ => b,
            }
        }
        AtomTy::F16x2 | AtomTy::BF16x2 | AtomTy::F16 | AtomTy::BF16 => {
            let fty = match ty {
                AtomTy::F16x2 => FTy::F16x2,
                AtomTy::BF16x2 => FTy::BF16x2,
                AtomTy::F16 => FTy::F16,
                _ => FTy::BF16,
            };
            let m = FMode { rnd: Rnd::Rn, ftz: false, sat: false };
            match op {
                AtomOp::Add => alu::fbin(FBin::Add, fty, m, old, b),
                AtomOp::Min => alu::fbin(FBin::Min, fty, m, old, b),
                AtomOp::Max => alu::fbin(FBin::Max, fty, m, old, b),
                _ => b,
            }
        }
    })
}

/// Loads `size` bytes (1, 2, 4 or 8) at host address `a` with a relaxed atomic load.
///
/// # Safety
/// `a` must be valid for reads of `size` bytes and aligned to `size`.
#[inline(always)]
unsafe fn global_load(a: u64, size: usize) -> u64 {
    // SAFETY: the caller's: `a` is valid for `size` bytes and aligned.
    #[expect(clippy::multiple_unsafe_ops_per_block, reason = "one arm runs: the same load at each width")]
    unsafe {
        match size {
            1 => AtomicU8::from_ptr(a as *mut u8).load(Relaxed) as u64,
            2 => AtomicU16::from_ptr(a as *mut u16).load(Relaxed) as u64,
            4 => AtomicU32::from_ptr(a as *mut u32).load(Relaxed) as u64,
            _ => AtomicU64::from_ptr(a as *mut u64).load(Relaxed),
        }
    }
}

/// Stores `size` bytes (1, 2, 4 or 8) at host address `a` with a relaxed atomic store.
///
/// # Safety
/// `a` must be valid for writes of `size` bytes and aligned to `size`.
#[inline(always)]
unsafe fn global_store(a: u64, size: usize, v: u64) {
    // SAFETY: the caller's: `a` is valid for `size` bytes and aligned.
    #[expect(clippy::multiple_unsafe_ops_per_block, reason = "one arm runs: the same store at each width")]
    unsafe {
        match size {
            1 => AtomicU8::from_ptr(a as *mut u8).store(v as u8, Relaxed),
            2 => AtomicU16::from_ptr(a as *mut u16).store(v as u16, Relaxed),
            4 => AtomicU32::from_ptr(a as *mut u32).store(v as u32, Relaxed),
            _ => AtomicU64::from_ptr(a as *mut u64).store(v, Relaxed),
        }
    }
}

/// Performs an atomic on host memory at `a`. Returns the old value.
///
/// # Safety
/// `a` must be valid for reads and writes of `size` bytes and aligned to `size`.
unsafe fn global_atomic(a: u64, size: usize, op: AtomOp, ty: AtomTy, b: u64, c: u64) -> u64 {
    let sc = std::sync::atomic::Ordering::SeqCst;
    // SAFETY: the caller's: `a` is valid for `size` bytes and aligned.
    #[expect(clippy::multiple_unsafe_ops_per_block, reason = "one arm runs: one atomic per width and operation")]
    unsafe {
        match (size, op, ty) {
            (4, AtomOp::Add, AtomTy::Int(_)) => AtomicU32::from_ptr(a as *mut u32).fetch_add(b as u32, sc) as u64,
            (8, AtomOp::Add, AtomTy::Int(_)) => AtomicU64::from_ptr(a as *mut u64).fetch_add(b, sc),
            (4, AtomOp::And, _) => AtomicU32::from_ptr(a as *mut u32).fetch_and(b as u32, sc) as u64,
            (8, AtomOp::And, _) => AtomicU64::from_ptr(a as *mut u64).fetch_and(b, sc),
            (4, AtomOp::Or, _) => AtomicU32::from_ptr(a as *mut u32).fetch_or(b as u32, sc) as u64,
            (8, AtomOp::Or, _) => AtomicU64::from_ptr(a as *mut u64).fetch_or(b, sc),
            (4, AtomOp::Xor, _) => AtomicU32::from_ptr(a as *mut u32).fetch_xor(b as u32, sc) as u64,
            (8, AtomOp::Xor, _) => AtomicU64::from_ptr(a as *mut u64).fetch_xor(b, sc),
            (4, AtomOp::Exch, _) => AtomicU32::from_ptr(a as *mut u32).swap(b as u32, sc) as u64,
            (8, AtomOp::Exch, _) => AtomicU64::from_ptr(a as *mut u64).swap(b, sc),
            (4, AtomOp::Min, AtomTy::Int(t)) if t.signed => {
                AtomicI32::from_ptr(a as *mut i32).fetch_min(b as i32, sc) as u32 as u64
            }
            (4, AtomOp::Max, AtomTy::Int(t)) if t.signed => {
                AtomicI32::from_ptr(a as *mut i32).fetch_max(b as i32, sc) as u32 as u64
            }
            (4, AtomOp::Min, AtomTy::Int(_)) => AtomicU32::from_ptr(a as *mut u32).fetch_min(b as u32, sc) as u64,
            (4, AtomOp::Max, AtomTy::Int(_)) => AtomicU32::from_ptr(a as *mut u32).fetch_max(b as u32, sc) as u64,
            (8, AtomOp::Min, AtomTy::Int(t)) if t.signed => {
                AtomicI64::from_ptr(a as *mut i64).fetch_min(b as i64, sc) as u64
            }
            (8, AtomOp::Max, AtomTy::Int(t)) if t.signed => {
                AtomicI64::from_ptr(a as *mut i64).fetch_max(b as i64, sc) as u64
            }
            (8, AtomOp::Min, AtomTy::Int(_)) => AtomicU64::from_ptr(a as *mut u64).fetch_min(b, sc),
            (8, AtomOp::Max, AtomTy::Int(_)) => AtomicU64::from_ptr(a as *mut u64).fetch_max(b, sc),
            (4, AtomOp::Cas, _) => {
                let x = AtomicU32::from_ptr(a as *mut u32);
                match x.compare_exchange(b as u32, c as u32, sc, sc) {
                    Ok(v) | Err(v) => v as u64,
                }
            }
            (8, AtomOp::Cas, _) => {
                let x = AtomicU64::from_ptr(a as *mut u64);
                match x.compare_exchange(b, c, sc, sc) {
                    Ok(v) | Err(v) => v,
                }
            }
            (4, _, _) => {
                let x = AtomicU32::from_ptr(a as *mut u32);
                let mut old = x.load(sc);
                loop {
                    let Some(new) = atom_apply(op, ty, old as u64, b, c) else { return old as u64 };
                    match x.compare_exchange_weak(old, new as u32, sc, sc) {
                        Ok(_) => return old as u64,
                        Err(v) => old = v,
                    }
                }
            }
            (8, _, _) => {
                let x = AtomicU64::from_ptr(a as *mut u64);
                let mut old = x.load(sc);
                loop {
                    let Some(new) = atom_apply(op, ty, old, b, c) else { return old };
                    match x.compare_exchange_weak(old, new, sc, sc) {
                        Ok(_) => return old,
                        Err(v) => old = v,
                    }
                }
            }
            _ => {
                // 16-bit: operate on the aligned 32-bit word containing it.
                let wa = a & !3;
                let sh = ((a & 2) * 8) as u32;
                let x = AtomicU32::from_ptr(wa as *mut u32);
                let mut word = x.load(sc);
                loop {
                    let old = ((word >> sh) & 0xffff) as u64;
                    let Some(new) = atom_apply(op, ty, old, b, c) else { return old };
                    let nw = (word & !(0xffff << sh)) | (((new as u32) & 0xffff) << sh);
                    match x.compare_exchange_weak(word, nw, sc, sc) {
                        Ok(_) => return old,
                        Err(v) => word = v,
                    }
                }
            }
        }
    }
}

/// Releases barrier `id` if enough threads arrived.
fn bar_check(blk: &mut Block, id: usize) {
    let b = &mut blk.bars[id];
    if b.arrived == 0 {
        return;
    }
    let expected = if b.count > 0 { b.count.min(blk.live) } else { blk.live };
    if b.arrived < expected {
        return;
    }
    for (w, m, d, kind, depth) in b.waiters.drain(..) {
        blk.bar_wait[w as usize] &= !m;
        if let Some(d) = d {
            let v = match kind {
                BarKind::RedPopc => b.popc as u64,
                BarKind::RedAnd => b.all as u64,
                BarKind::RedOr => b.any as u64,
                _ => 0,
            };
            blk.pending.push((w, depth, d, m, v));
        }
    }
    b.arrived = 0;
    b.count = 0;
}
