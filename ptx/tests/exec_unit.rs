//! Interpreter tests on hand-written PTX (no CUDA toolchain needed): instructions nvcc rarely emits, barriers with
//! thread counts, error reporting (unsupported instructions, deadlock, stack overflow, timeouts), and fuzzing of the
//! lowering and execution with mutated PTX and random launch parameters.

use std::ops::Range;

use phos_ptx::exec::{self, ExecError, GlobalMemory, Launch, Program, RunOptions};

struct Regions(Vec<Range<u64>>);

impl GlobalMemory for Regions {
    fn region(&self, addr: u64) -> Option<Range<u64>> {
        self.0.iter().find(|r| r.contains(&addr)).cloned()
    }
}

fn region(v: &[u32]) -> Range<u64> {
    v.as_ptr() as u64..v.as_ptr() as u64 + 4 * v.len() as u64
}

fn program(ptx: &str) -> Program {
    Program::new(&phos_ptx::parse(ptx).unwrap_or_else(|e| panic!("{e}")))
}

fn run(
    prog: &Program,
    kernel: &str,
    grid: u32,
    block: u32,
    smem: u32,
    out: &mut [u32],
) -> (Result<exec::Stats, ExecError>, String) {
    let params = (out.as_mut_ptr() as u64).to_le_bytes();
    let mem = Regions(vec![region(out)]);
    let launch = Launch { grid: [grid, 1, 1], block: [block, 1, 1], dynamic_shared: smem, params: &params };
    let mut text = Vec::new();
    let opts = RunOptions { workers: 2, max_warp_instructions: Some(2_000_000) };
    let r = exec::run_with(prog, kernel, &launch, &mem, &mut text, &opts);
    (r, String::from_utf8_lossy(&text).into_owned())
}

const HEADER: &str = ".version 7.8\n.target sm_80\n.address_size 64\n";

const MISC: &str = r#"
.visible .entry misc(.param .u64 out)
{
    .reg .pred %p<8>;
    .reg .b32 %r<60>;
    .reg .b64 %rd<20>;
    .shared .align 8 .b8 sbuf[64];
    .local .align 16 .b8 lbuf[32];
tbl: .branchtargets T0, T1, T2;

    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    setp.ne.u32 %p1, %r1, 0;
    @%p1 bra DONE;
    mov.u32 %r10, 0xffffffff;
    mov.u32 %r11, 1;
    add.cc.u32 %r2, %r10, %r11;
    addc.u32 %r3, 5, 6;
    st.global.u32 [%rd1], %r2;
    st.global.u32 [%rd1+4], %r3;
    sub.cc.u32 %r4, %r11, 2;
    subc.u32 %r5, 10, 3;
    st.global.u32 [%rd1+8], %r4;
    st.global.u32 [%rd1+12], %r5;
    setp.lt.s32 %p5, %r11, 2;
    setp.lt.and.s32 %p2|%p3, -1, %r11, %p5;
    selp.u32 %r6, 1, 0, %p2;
    selp.u32 %r7, 1, 0, %p3;
    st.global.u32 [%rd1+16], %r6;
    st.global.u32 [%rd1+20], %r7;
    mov.u32 %r20, 0x11111111;
    mov.u32 %r21, 0x22222222;
    mov.b64 %rd2, {%r20, %r21};
    shr.u64 %rd3, %rd2, 4;
    mov.b64 {%r22, %r23}, %rd3;
    st.global.u32 [%rd1+24], %r22;
    st.global.u32 [%rd1+28], %r23;
    cvta.shared.u64 %rd4, sbuf;
    isspacep.shared %p4, %rd4;
    selp.u32 %r24, 1, 0, %p4;
    cvta.to.shared.u64 %rd5, %rd4;
    st.shared.u32 [%rd5], 77;
    ld.u32 %r25, [%rd4];
    add.u32 %r24, %r24, %r25;
    st.global.u32 [%rd1+32], %r24;
    mov.u64 %rd6, lbuf;
    cvta.local.u64 %rd7, %rd6;
    isspacep.local %p6, %rd7;
    isspacep.global %p7, %rd1;
    and.pred %p6, %p6, %p7;
    st.v4.u32 [%rd7], {1, 2, 3, 4};
    ld.local.v2.u32 {%r26, %r27}, [lbuf+8];
    add.u32 %r26, %r26, %r27;
    @%p6 add.u32 %r26, %r26, 100;
    st.global.u32 [%rd1+36], %r26;
    mov.u64 %rd8, out;
    ld.param.u64 %rd9, [%rd8];
    setp.eq.u64 %p1, %rd9, %rd1;
    selp.u32 %r28, 1, 0, %p1;
    st.global.u32 [%rd1+40], %r28;
    mov.u32 %r29, 2;
    brx.idx %r29, tbl;
T0: mov.u32 %r30, 100;
    bra.uni JOIN;
T1: mov.u32 %r30, 200;
    bra.uni JOIN;
T2: mov.u32 %r30, 300;
JOIN:
    st.global.u32 [%rd1+44], %r30;
    mov.u32 %r31, -3;
    mad.wide.s32 %rd10, %r31, 4, 100;
    cvt.u32.u64 %r32, %rd10;
    st.global.u32 [%rd1+48], %r32;
    slct.s32.s32 %r33, 5, 7, %r31;
    st.global.u32 [%rd1+52], %r33;
    atom.add.u32 %r34, [%rd4], 5;
    ld.shared.u32 %r35, [sbuf];
    mad.lo.u32 %r34, %r34, 1000, %r35;
    st.global.u32 [%rd1+56], %r34;
    mov.u32 %r36, %dynamic_smem_size;
    st.global.u32 [%rd1+60], %r36;
    mov.u32 %r37, %total_smem_size;
    st.global.u32 [%rd1+64], %r37;
    mov.u32 %r38, %nctaid.x;
    mov.u32 %r39, %ntid.x;
    mad.lo.u32 %r38, %r38, 1000, %r39;
    st.global.u32 [%rd1+68], %r38;
    mov.u32 %r40, 0x12345678;
    prmt.b32.ecl %r41, %r40, 0, 2;
    st.global.u32 [%rd1+72], %r41;
    mov.u64 %rd11, %clock64;
    mov.u64 %rd12, %clock64;
    setp.gt.u64 %p1, %rd12, %rd11;
    selp.u32 %r42, 1, 0, %p1;
    st.global.u32 [%rd1+76], %r42;
    cvt.rn.f16x2.f32 %r43, 0f3F800000, 0f40000000;
    st.global.u32 [%rd1+80], %r43;
    mov.b32 {%rs1, %rs2}, %r43;
    cvt.f32.f16 %f1, %rs1;
    cvt.rzi.u32.f32 %r44, %f1;
    st.global.u32 [%rd1+84], %r44;
DONE:
    ret;
}
"#;

#[test]
fn misc_instructions() {
    let ptx = format!(
        "{HEADER}{}",
        MISC.replace("    .reg .b64 %rd<20>;", "    .reg .b64 %rd<20>;\n    .reg .b16 %rs<4>;\n    .reg .f32 %f<4>;")
    );
    let prog = program(&ptx);
    let mut out = vec![0u32; 32];
    let (r, _) = run(&prog, "misc", 3, 64, 128, &mut out);
    r.unwrap();
    let exp: [u32; 22] = [
        0,
        12,
        0xffff_ffff,
        6,
        1,
        0,
        0x2111_1111,
        0x0222_2222,
        78,
        107,
        1,
        300,
        88,
        7,
        77 * 1000 + 82,
        128,
        64 + 128,
        3064,
        0x1234_3434,
        1,
        0x3c00_4000,
        2,
    ];
    assert_eq!(&out[..22], &exp[..], "misc results");
    let info = prog.kernel("misc").unwrap();
    assert_eq!((info.param_size, info.static_shared, info.local_size), (8, 64, 32));
    assert!(info.error.is_none());
}

const WARPS: &str = r#"
.visible .entry warp_masks(.param .u64 out)
{
    .reg .pred %p<4>;
    .reg .b32 %r<20>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd2, %r1, 16;
    add.s64 %rd3, %rd1, %rd2;
    mov.u32 %r2, %laneid;
    mov.u32 %r3, %lanemask_lt;
    mov.u32 %r4, %warpid;
    mad.lo.u32 %r2, %r4, 100, %r2;
    st.global.v2.u32 [%rd3], {%r2, %r3};
    and.b32 %r5, %r1, 3;
    setp.eq.u32 %p1, %r5, 1;
    @!%p1 bra SKIP;
    activemask.b32 %r6;
    elect.sync %r7|%p2, %r6;
    selp.u32 %r8, 1000, 0, %p2;
    add.u32 %r7, %r7, %r8;
    redux.sync.min.s32 %r9, %r1, %r6;
    st.global.v2.u32 [%rd3+8], {%r6, %r7};
SKIP:
    bar.warp.sync -1;
    ret;
}

.visible .entry producer_consumer(.param .u64 out)
{
    .reg .pred %p<4>;
    .reg .b32 %r<20>;
    .reg .b64 %rd<8>;
    .shared .align 4 .b8 box[128];
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    shl.b32 %r2, %r1, 2;
    mov.u32 %r3, box;
    add.u32 %r3, %r3, %r2;
    setp.lt.u32 %p1, %r1, 32;
    @!%p1 bra CONSUMER;
    mul.lo.u32 %r4, %r1, 3;
    st.shared.u32 [%r3], %r4;
    bar.arrive 1, 64;
    bra.uni END;
CONSUMER:
    bar.sync 1, 64;
    ld.shared.u32 %r5, [%r3+-128];
    add.u32 %r5, %r5, 1;
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3+-128], %r5;
END:
    ret;
}

.visible .entry deadlock(.param .u64 out)
{
    .reg .pred %p<4>;
    .reg .b32 %r<4>;
    mov.u32 %r1, %tid.x;
    setp.lt.u32 %p1, %r1, 32;
    @%p1 bar.sync 0;
    @!%p1 bar.sync 1;
    ret;
}

.func (.param .b32 ret) down(.param .b32 n)
{
    .reg .b32 %r<4>;
    ld.param.b32 %r1, [n];
    add.s32 %r2, %r1, 1;
    {
    .param .b32 p0;
    st.param.b32 [p0], %r2;
    .param .b32 r0;
    call.uni (r0), down, (p0);
    ld.param.b32 %r3, [r0];
    }
    st.param.b32 [ret], %r3;
    ret;
}

.visible .entry recurse(.param .u64 out)
{
    .reg .b32 %r<4>;
    {
    .param .b32 p0;
    st.param.b32 [p0], 0;
    .param .b32 r0;
    call.uni (r0), down, (p0);
    }
    ret;
}

.visible .entry spin(.param .u64 out)
{
LOOP:
    bra.uni LOOP;
}
"#;

#[test]
fn warps_barriers_and_failures() {
    let prog = program(&format!("{HEADER}{WARPS}"));
    let mut out = vec![0u32; 64 * 4];
    run(&prog, "warp_masks", 1, 64, 0, &mut out).0.unwrap();
    for t in 0..64usize {
        let lane = t % 32;
        assert_eq!(out[t * 4], (t / 32) as u32 * 100 + lane as u32);
        assert_eq!(out[t * 4 + 1], (1u32 << lane) - 1);
        if t % 4 == 1 {
            assert_eq!(out[t * 4 + 2], 0x2222_2222, "activemask in divergent code");
            assert_eq!(out[t * 4 + 3], 1 + if lane == 1 { 1000 } else { 0 }, "elect.sync");
        }
    }
    let mut out = vec![0u32; 64];
    run(&prog, "producer_consumer", 2, 64, 0, &mut out).0.unwrap();
    for t in 0..32u32 {
        assert_eq!(out[t as usize], t * 3 + 1, "consumer sees the producer's value");
    }
    let (r, _) = run(&prog, "deadlock", 1, 64, 0, &mut out);
    let e = r.unwrap_err();
    assert!(matches!(e, ExecError::Deadlock { .. }), "{e}");
    let (r, _) = run(&prog, "recurse", 1, 32, 0, &mut out);
    let e = r.unwrap_err();
    assert!(matches!(e, ExecError::StackOverflow { .. }), "{e}");
    assert_eq!(e.cuda_error(), 719);
    let (r, _) = run(&prog, "spin", 1, 32, 0, &mut out);
    let e = r.unwrap_err();
    assert!(matches!(e, ExecError::Timeout { .. }), "{e}");
}

#[test]
fn unsupported_instructions_are_reported_before_running() {
    let ptx = format!(
        "{HEADER}
.func helper(.param .b32 x)
{{
    .reg .b32 %r<4>;
    ld.param.b32 %r1, [x];
    add.foo.s32 %r2, %r1, 1;
    ret;
}}

.visible .entry good(.param .u64 out)
{{
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [out];
    st.global.u32 [%rd1], 5;
    ret;
}}

.visible .entry bad(.param .u64 out)
{{
    .reg .b32 %r<4>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [out];
    ld.global.u32 %r1, [%rd1];
    suld.b.1d.v4.b32.trap {{%r1, %r2, %r3, %r4}}, [surf, {{%r1}}];
    ret;
}}

.visible .entry calls_helper(.param .u64 out)
{{
    {{
    .param .b32 p0;
    st.param.b32 [p0], 1;
    call.uni helper, (p0);
    }}
    ret;
}}
"
    );
    let prog = program(&ptx);
    let mut out = vec![0u32; 4];
    run(&prog, "good", 1, 1, 0, &mut out).0.unwrap();
    assert_eq!(out[0], 5);
    let (r, _) = run(&prog, "bad", 1, 1, 0, &mut out);
    match r.unwrap_err() {
        ExecError::Unsupported { kernel, instruction, line } => {
            assert_eq!(kernel, "bad");
            assert_eq!(line, 27);
            assert!(instruction.starts_with("suld.b.1d.v4.b32.trap {%r1, %r2, %r3, %r4}"), "{instruction}");
        }
        e => panic!("{e}"),
    }
    let e = run(&prog, "calls_helper", 1, 1, 0, &mut out).0.unwrap_err();
    assert_eq!(e.cuda_error(), 801);
    match e {
        ExecError::Unsupported { kernel, instruction, line } => {
            assert_eq!((kernel.as_str(), line), ("calls_helper", 9));
            assert!(instruction.contains("add.foo.s32"), "{instruction}");
        }
        e => panic!("{e}"),
    }
    assert!(prog.kernel("bad").unwrap().error.is_some());
    assert!(prog.kernel("good").unwrap().error.is_none());
    assert!(prog.kernel("helper").is_none());
}

#[test]
fn variables_and_initializers() {
    let ptx = format!(
        "{HEADER}
.global .align 4 .u32 a[3] = {{1, 2, 3}};
.global .align 8 .u64 p[2] = {{generic(a), a+8}};
.const .align 4 .f32 c = 0f3FC00000;
.global .align 1 .b8 s[] = {{104, 105, 0}};

.visible .entry k(.param .u64 out)
{{
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    .reg .f32 %f<2>;
    ld.param.u64 %rd1, [out];
    ld.global.u64 %rd2, [p+8];
    ld.u32 %r1, [%rd2];
    ld.const.f32 %f1, [c];
    cvt.rzi.u32.f32 %r2, %f1;
    mov.u64 %rd3, s;
    ld.global.u8 %r3, [%rd3+1];
    st.global.v4.u32 [%rd1], {{%r1, %r2, %r3, 0}};
    ret;
}}
"
    );
    let mut prog = program(&ptx);
    let vars = prog.variables().to_vec();
    assert_eq!(
        vars.iter().map(|v| (v.name.as_str(), v.size, v.align)).collect::<Vec<_>>(),
        vec![("a", 12, 4), ("p", 16, 8), ("c", 4, 4), ("s", 3, 1)]
    );
    let mut storage: Vec<Vec<u64>> = vars.iter().map(|v| vec![0u64; (v.size as usize).div_ceil(8)]).collect();
    let addrs: Vec<u64> = storage.iter_mut().map(|s| s.as_mut_ptr() as u64).collect();
    let init = prog.bind_variables(&addrs);
    assert_eq!(init[1][..8], addrs[0].to_le_bytes());
    assert_eq!(init[1][8..], (addrs[0] + 8).to_le_bytes());
    for (s, i) in storage.iter_mut().zip(&init) {
        // SAFETY: the storage holds at least i.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(i.as_ptr(), s.as_mut_ptr() as *mut u8, i.len()) };
    }
    let mut out = vec![0u32; 4];
    let params = (out.as_mut_ptr() as u64).to_le_bytes();
    let mut regions = vec![region(&out)];
    for (s, v) in storage.iter_mut().zip(&vars) {
        let a = s.as_mut_ptr() as u64;
        regions.push(a..a + v.size);
    }
    let launch = Launch { grid: [1, 1, 1], block: [1, 1, 1], dynamic_shared: 0, params: &params };
    exec::run(&prog, "k", &launch, &Regions(regions), &mut Vec::new(), 1).unwrap();
    assert_eq!(out, vec![3, 1, 105, 0]);
}

#[test]
fn cp_async_and_cluster_barrier() {
    let ptx = format!(
        "{HEADER}
.visible .entry k(.param .u64 out)
{{
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    .shared .align 16 .b8 s[512];
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    shl.b32 %r2, %r1, 4;
    mov.u32 %r3, s;
    add.u32 %r3, %r3, %r2;
    mul.wide.u32 %rd2, %r1, 16;
    add.s64 %rd3, %rd1, %rd2;
    cp.async.cg.shared.global [%r3], [%rd3], 16, 12;
    cp.async.commit_group;
    cp.async.wait_group 0;
    barrier.cluster.arrive;
    barrier.cluster.wait;
    xor.b32 %r4, %r2, 16;
    mov.u32 %r5, s;
    add.u32 %r5, %r5, %r4;
    ld.shared.v4.u32 {{%r6, %r7, %r1, %r2}}, [%r5];
    st.global.v4.u32 [%rd3+512], {{%r6, %r7, %r1, %r2}};
    ret;
}}
"
    );
    let prog = program(&ptx);
    let mut out: Vec<u32> = (0..256).collect();
    run(&prog, "k", 1, 32, 0, &mut out).0.unwrap();
    for t in 0..32usize {
        let src = t ^ 1;
        assert_eq!(&out[128 + t * 4..128 + t * 4 + 4], &[src as u32 * 4, src as u32 * 4 + 1, src as u32 * 4 + 2, 0]);
    }
}

/// `bmsk` and `szext` (sm_70, PTX 7.6), which CUB's radix sorts of CUDA 12 and 13 use for their
/// digit masks: per thread, position and width from the thread index, both modes.
#[test]
fn bit_masks_and_extensions() {
    let ptx = format!(
        "{HEADER}
.visible .entry k(.param .u64 out)
{{
    .reg .b32 %r<12>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    shr.u32 %r2, %r1, 3;
    mul.lo.u32 %r2, %r2, 9;
    and.b32 %r3, %r1, 7;
    mul.lo.u32 %r3, %r3, 5;
    bmsk.clamp.b32 %r4, %r2, %r3;
    bmsk.wrap.b32 %r5, %r2, %r3;
    szext.clamp.s32 %r6, 0x9abcdef0, %r3;
    szext.wrap.u32 %r7, 0x9abcdef0, %r3;
    mul.wide.u32 %rd2, %r1, 16;
    add.s64 %rd3, %rd1, %rd2;
    st.global.v4.u32 [%rd3], {{%r4, %r5, %r6, %r7}};
    ret;
}}
"
    );
    let prog = program(&ptx);
    let mut out = vec![0u32; 64 * 4];
    run(&prog, "k", 1, 64, 0, &mut out).0.unwrap();
    let mask = |pos: u32, width: u32| -> u32 {
        // Bits pos..pos+width, ending at bit 31.
        (pos..(pos + width).min(32)).fold(0, |m, i| m | 1 << i)
    };
    for t in 0..64u32 {
        let (a, b) = ((t >> 3) * 9, (t & 7) * 5);
        let clamp = if a >= 32 { 0 } else { mask(a, b.min(32)) };
        let wrap = mask(a & 31, b & 31);
        let v = 0x9abc_def0u32;
        let n = b.min(32);
        let sext = if n == 0 { 0 } else { (((v << (32 - n)) as i32) >> (32 - n)) as u32 };
        let zext = if b & 31 == 0 { 0 } else { v & (u32::MAX >> (32 - (b & 31))) };
        assert_eq!(&out[t as usize * 4..t as usize * 4 + 4], &[clamp, wrap, sext, zext], "thread {t}: a {a}, b {b}");
    }
}

// ----- fuzzing -----

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Runs every kernel of `ptx` with random launch parameters; errors are fine, panics are not.
fn run_randomly(ptx: &str, seed: &mut u64, buf: &mut [u32]) {
    let Ok(module) = phos_ptx::parse(ptx) else { return };
    let prog = Program::new(&module);
    let names: Vec<String> = module.entries().map(|f| f.name.clone()).collect();
    for name in names.iter().take(4) {
        let Some(info) = prog.kernel(name) else { continue };
        let mut params = vec![0u8; info.param_size.min(4096) as usize];
        for chunk in params.chunks_mut(8) {
            let v = match xorshift(seed) % 4 {
                0 => buf.as_mut_ptr() as u64 + (xorshift(seed) % 64) * 4,
                1 => xorshift(seed) % 100,
                2 => 0,
                _ => xorshift(seed),
            };
            let b = v.to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
        let mem = Regions(vec![region(buf)]);
        let block = [1 + (xorshift(seed) % 96) as u32, 1 + (xorshift(seed) % 2) as u32, 1];
        let launch = Launch {
            grid: [1 + (xorshift(seed) % 3) as u32, 1, 1],
            block,
            dynamic_shared: (xorshift(seed) % 512) as u32,
            params: &params,
        };
        let opts = RunOptions { workers: 1 + (xorshift(seed) % 2) as usize, max_warp_instructions: Some(20_000) };
        let r = exec::run_with(&prog, name, &launch, &mem, &mut Vec::new(), &opts);
        if std::env::var("FUZZ_TRACE").is_ok() {
            eprintln!("{name}: {:?}", r.map(|s| s.thread_instructions).map_err(|e| e.cuda_error()));
        }
    }
}

fn mutate(src: &str, seed: &mut u64) -> String {
    let mut lines: Vec<String> = src.lines().map(str::to_string).collect();
    for _ in 0..1 + xorshift(seed) % 4 {
        if lines.is_empty() {
            break;
        }
        let i = (xorshift(seed) % lines.len() as u64) as usize;
        match xorshift(seed) % 6 {
            0 => {
                lines.remove(i);
            }
            1 => {
                let j = (xorshift(seed) % lines.len() as u64) as usize;
                lines.swap(i, j);
            }
            2 => {
                let l = lines[i].clone();
                lines.insert(i, l);
            }
            3 => {
                // Replace a number.
                let l = &lines[i];
                if let Some(p) = l.find(|c: char| c.is_ascii_digit()) {
                    let n = ["0", "1", "31", "32", "64", "-1", "4096", "0xffffffff", "99999999999"]
                        [(xorshift(seed) % 9) as usize];
                    lines[i] = format!("{}{}{}", &l[..p], n, &l[p + 1..]);
                }
            }
            4 => {
                // Swap a modifier.
                let words = [
                    ".u32", ".s64", ".f32", ".f64", ".b16", ".pred", ".shared", ".global", ".local", ".v4", ".rz",
                    ".ftz", ".sat", ".wide", ".hi",
                ];
                let w = words[(xorshift(seed) % words.len() as u64) as usize];
                if let Some(p) = lines[i].find('.') {
                    let end = lines[i][p + 1..]
                        .find(|c: char| !c.is_ascii_alphanumeric())
                        .map_or(lines[i].len(), |e| p + 1 + e);
                    lines[i] = format!("{}{}{}", &lines[i][..p], w, &lines[i][end..]);
                }
            }
            _ => {
                // Replace a register with another one.
                let l = lines[i].clone();
                if let Some(p) = l.find("%r") {
                    lines[i] = format!("{}%r{}{}", &l[..p], xorshift(seed) % 70, &l[(p + 3).min(l.len())..]);
                }
            }
        }
    }
    lines.join("\n")
}

#[test]
fn fuzz_mutated_ptx_never_panics() {
    let corpus = [
        include_str!("../benches/data/bench.ptx").to_string(),
        format!("{HEADER}{MISC}")
            .replace("    .reg .b64 %rd<20>;", "    .reg .b64 %rd<20>;\n    .reg .b16 %rs<4>;\n    .reg .f32 %f<4>;"),
        format!("{HEADER}{WARPS}").replace(".visible .entry spin", ".visible .func spin"),
    ];
    let mut seed = 0x00c0_ffee_1234_5678u64;
    let mut buf = vec![0u32; 256];
    let iterations = if cfg!(debug_assertions) { 300 } else { 2000 };
    for k in 0..iterations {
        let src = &corpus[k % corpus.len()];
        let m = mutate(src, &mut seed);
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_randomly(&m, &mut seed, &mut buf)));
        if res.is_err() {
            panic!("panic on mutated PTX (iteration {k}):\n{m}");
        }
    }
}

#[test]
fn variables_are_as_large_as_declared_but_only_their_initializers_are_materialized() {
    // A gigabyte that is never initialized took a gigabyte of zeros at lowering, and dimensions
    // whose product passes 2^64 overflowed (the `ptx_exec` fuzz target, on a crafted
    // input).
    let ptx = format!(
        "{HEADER}.global .align 8 .b8 big[1073741824];\n.global .b8 huge[4294967296][4294967296];\n\
         .global .align 4 .u32 some[1000] = {{1, 2}};\n.visible .entry k()\n{{\n\tret;\n}}\n"
    );
    let mut prog = program(&ptx);
    let sizes: Vec<u64> = prog.variables().iter().map(|v| v.size).collect();
    assert_eq!(sizes, [1 << 30, u64::MAX, 4000]);
    let init = prog.bind_variables(&[0x1000, 0x2000, 0x3000]);
    let lens: Vec<usize> = init.iter().map(Vec::len).collect();
    assert_eq!(lens, [0, 0, 8], "only the initialized prefixes");
    assert_eq!(init[2], [1, 0, 0, 0, 2, 0, 0, 0]);
}
