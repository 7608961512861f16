//! Unit tests for the parser and printer, one construct at a time.

use super::parse;
use crate::ast::*;
use crate::error::ParseErrorKind;

/// Wraps statements into a minimal kernel.
fn kernel(body: &str) -> String {
    format!(".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 p)\n{{\n{body}\n}}\n")
}

fn body_of(m: &Module) -> &[Statement] {
    m.entries().next().expect("a kernel").body.as_deref().expect("a body")
}

fn instrs(body: &str) -> Vec<Instruction> {
    let m = parse(&kernel(body)).unwrap_or_else(|e| panic!("{e}"));
    m.entries().next().unwrap().instructions().into_iter().map(|(_, i)| i.clone()).collect()
}

fn one(body: &str) -> Instruction {
    let mut v = instrs(body);
    assert_eq!(v.len(), 1, "{body}");
    v.remove(0)
}

/// parse -> print -> parse gives the same tree, and printing is then stable.
fn assert_round_trip(src: &str) -> Module {
    let a = parse(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let printed = a.to_string();
    let b = parse(&printed).unwrap_or_else(|e| panic!("reparse: {e}\n{printed}"));
    assert!(a.eq_ignoring_lines(&b), "round trip changed the tree:\n{printed}");
    assert_eq!(b.to_string(), printed);
    a
}

fn reg(n: &str) -> Operand {
    Operand::Reg(n.to_string())
}

fn sym(n: &str) -> Operand {
    Operand::Symbol(n.to_string())
}

fn addr(base: AddressBase, offset: i64) -> Operand {
    Operand::Address(Address { base, offset })
}

fn rbase(n: &str) -> AddressBase {
    AddressBase::Reg(n.to_string())
}

#[test]
fn header_directives() {
    let m = parse(".version 7.8\n.target sm_70, debug, texmode_independent\n.address_size 64\n").unwrap();
    assert_eq!(m.version(), Some((7, 8)));
    assert_eq!(m.target().unwrap(), ["sm_70", "debug", "texmode_independent"]);
    assert_eq!(m.address_size(), Some(64));
    // Minor versions are integers, not decimal fractions.
    assert_eq!(parse(".version 8.10").unwrap().version(), Some((8, 10)));
    assert_round_trip(".version 8.10\n.target sm_90a\n.address_size 32\n");
}

#[test]
fn entry_parameters_and_linkage() {
    let src = ".visible .entry _Z1kPfi5Mixed(\n\t.param .u64 _Z1kPfi5Mixed_param_0,\n\t.param .u32 a,\n\
               \t.param .align 8 .b8 s[24],\n\t.param .u64 .ptr .global .align 16 q,\n\t.param .v2 .f32 v\n)\n{\n\tret;\n}\n";
    let m = assert_round_trip(src);
    let f = m.entries().next().unwrap();
    assert_eq!((f.kind, f.linkage, f.name.as_str()), (FunctionKind::Entry, Some(Linkage::Visible), "_Z1kPfi5Mixed"));
    assert_eq!(f.params.len(), 5);
    assert_eq!((f.params[0].ty, f.params[0].space), (ScalarType::U64, StateSpace::Param));
    assert_eq!((f.params[2].align, f.params[2].ty, &f.params[2].dims[..]), (Some(8), ScalarType::B8, &[Some(24)][..]));
    assert_eq!(f.params[3].ptr, Some(PtrAttr { space: Some(StateSpace::Global), align: Some(16) }));
    assert_eq!(f.params[3].align, None);
    assert_eq!(f.params[4].vector, Some(2));
    assert_eq!((f.params[4].size(), f.params[4].alignment()), (8, 8));
    assert_eq!(f.line, 1);
}

#[test]
fn func_return_params_prototypes_and_linkage() {
    let src = ".extern .func (.param .b32 func_retval0) vprintf\n(\n\t.param .b64 vprintf_param_0,\n\t.param .b64 vprintf_param_1\n)\n;\n\
               .weak .func (.param .align 4 .b8 func_retval0[12]) _Z5crossv()\n{\n\tret;\n}\n\
               .func __trap\n()\n;\n.func nop\n{\n\tret;\n}\n.func (.reg .b32 r) regs(.reg .b32 a)\n{\n\tadd.s32 r, a, 1;\n\tret;\n}\n";
    let m = assert_round_trip(src);
    let fs: Vec<&Function> = m.functions().collect();
    assert_eq!(fs.len(), 5);
    assert_eq!((fs[0].linkage, fs[0].body.is_none()), (Some(Linkage::Extern), true));
    assert_eq!(fs[0].return_params[0].name, "func_retval0");
    assert_eq!(fs[0].params.len(), 2);
    assert_eq!(fs[1].linkage, Some(Linkage::Weak));
    assert_eq!(fs[1].return_params[0].dims, [Some(12)]);
    assert!(fs[2].params.is_empty() && fs[2].body.is_none());
    assert!(fs[3].params.is_empty() && fs[3].body.is_some());
    // `.reg` parameters are registers inside the body even without a `%`.
    let add = fs[4].instructions()[0].1.clone();
    assert_eq!(add.operands, [reg("r"), reg("a"), Operand::Imm(Immediate::Int(1))]);
    assert_eq!(fs[4].return_params[0].space, StateSpace::Reg);
    assert_eq!(m.function("_Z5crossv").unwrap().name, "_Z5crossv");
}

#[test]
fn performance_directives() {
    let src = ".entry k()\n.maxntid 256, 1, 1\n.minnctapersm 2\n.maxnreg 64\n.reqntid 128\n.maxnctapersm 4\n\
               .pragma \"nounroll\";\n{\n\tret;\n}\n.func f() .noreturn\n{\n\ttrap;\n}\n\
               .entry c() .explicitcluster .reqnctapercluster 2, 1, 1 .maxclusterrank 8\n{\n\tret;\n}\n";
    let m = assert_round_trip(src);
    let fs: Vec<&Function> = m.functions().collect();
    assert_eq!(
        fs[0].directives,
        [
            FunctionDirective::MaxNTid(vec![256, 1, 1]),
            FunctionDirective::MinNCtaPerSm(2),
            FunctionDirective::MaxNReg(64),
            FunctionDirective::ReqNTid(vec![128]),
            FunctionDirective::MaxNCtaPerSm(4),
            FunctionDirective::Pragma(vec!["nounroll".into()]),
        ]
    );
    assert_eq!(fs[1].directives, [FunctionDirective::NoReturn]);
    assert_eq!(
        fs[2].directives,
        [
            FunctionDirective::ExplicitCluster,
            FunctionDirective::ReqNCtaPerCluster(vec![2, 1, 1]),
            FunctionDirective::MaxClusterRank(8)
        ]
    );
}

#[test]
fn register_declarations() {
    let m =
        parse(&kernel(".reg .pred %p<3>;\n.reg .f32 %f<12>;\n.reg .b32 %r1, %r2, temp;\n.reg .v4 .b32 %v;")).unwrap();
    let body = body_of(&m);
    let StatementKind::Decl(d) = &body[1].kind else { panic!() };
    assert_eq!((d.space, d.ty, d.declarators[0].range), (StateSpace::Reg, ScalarType::F32, Some(12)));
    assert_eq!(d.declarators[0].name, "%f");
    let StatementKind::Decl(d) = &body[2].kind else { panic!() };
    let names: Vec<&str> = d.declarators.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["%r1", "%r2", "temp"]);
    let StatementKind::Decl(d) = &body[3].kind else { panic!() };
    assert_eq!(d.vector, Some(4));
    assert_eq!(body[0].line, 6);
}

#[test]
fn plain_register_names_are_scoped() {
    let is = instrs(
        ".reg .b32 t;\nmov.b32 t, 1;\n{\n.reg .pred q;\nsetp.ne.u32 q, t, 0;\n@q bra L;\n}\n\
         mov.b32 t, q;\nL:\nmov.u64 %rd1, %r1;",
    );
    assert_eq!(is[0].operands[0], reg("t"));
    assert_eq!(is[1].operands[0], reg("q"));
    assert_eq!(is[2].guard, Some(Guard { negated: false, pred: "q".into() }));
    assert_eq!(is[2].operands[0], sym("L"));
    // Outside its block `q` is no longer a register.
    assert_eq!(is[3].operands[1], sym("q"));
    // `%` names are registers even when undeclared.
    assert_eq!(is[4].operands, [reg("%rd1"), reg("%r1")]);
}

#[test]
fn module_variables_with_initializers() {
    let src = ".global .align 4 .u32 d_counter = 42;\n\
               .global .align 8 .u64 d_big = -81985529216486896;\n\
               .const .align 4 .f32 c[3] = {0f3F800000, 0fBF000000, 1.5};\n\
               .const .align 4 .b32 t[2][3] = {{1, 2, 3}, {-4, -5, -6}};\n\
               .global .align 8 .u64 d_ptr = generic(d_target)+8;\n\
               .global .align 8 .u64 d_ptrs[2] = {generic(d_counter), generic(d_target)+4};\n\
               .global .align 8 .u64 fn_table[2] = {_Z5twicef, _Z6squaref};\n\
               .global .attribute(.managed) .align 4 .u32 m = 7;\n\
               .extern .shared .align 16 .b8 smem[];\n\
               .shared .align 4 .f32 s1, s2;\n\
               .visible .global .v4 .f32 vv;\n\
               .common .global .align 8 .b8 blob[16];\n\
               .global .texref tex0;\n\
               .global .align 1 .b8 $str$1[6] = {100, 111, 110, 101, 10, 0};\n";
    let m = assert_round_trip(src);
    let vars: Vec<&VarDecl> = m.variables().collect();
    assert_eq!(vars.len(), 14);
    assert_eq!(vars[0].declarators[0].init, Some(Initializer::Imm(Immediate::Int(42))));
    assert_eq!(vars[1].declarators[0].init, Some(Initializer::Imm(Immediate::Int(-81985529216486896))));
    assert_eq!(
        vars[2].declarators[0].init,
        Some(Initializer::List(vec![
            Initializer::Imm(Immediate::F32(0x3F80_0000)),
            Initializer::Imm(Immediate::F32(0xBF00_0000)),
            Initializer::Imm(Immediate::F64(1.5f64.to_bits())),
        ]))
    );
    let Some(Initializer::List(rows)) = &vars[3].declarators[0].init else { panic!() };
    assert_eq!(
        rows[1],
        Initializer::List(vec![
            Initializer::Imm(Immediate::Int(-4)),
            Initializer::Imm(Immediate::Int(-5)),
            Initializer::Imm(Immediate::Int(-6))
        ])
    );
    assert_eq!(vars[3].declarators[0].dims, [Some(2), Some(3)]);
    assert_eq!((vars[3].size_of(&vars[3].declarators[0]), vars[3].alignment()), (24, 4));
    assert_eq!((vars[10].size_of(&vars[10].declarators[0]), vars[10].alignment()), (16, 16));
    assert_eq!(
        vars[4].declarators[0].init,
        Some(Initializer::Address { name: "d_target".into(), generic: true, offset: 8 })
    );
    let Some(Initializer::List(ptrs)) = &vars[6].declarators[0].init else { panic!() };
    assert_eq!(ptrs[1], Initializer::Address { name: "_Z6squaref".into(), generic: false, offset: 0 });
    assert_eq!(vars[7].attributes, ["managed"]);
    assert_eq!(
        (vars[8].linkage, vars[8].space, &vars[8].declarators[0].dims[..]),
        (Some(Linkage::Extern), StateSpace::Shared, &[None][..])
    );
    assert_eq!(vars[9].declarators.len(), 2);
    assert_eq!((vars[10].linkage, vars[10].vector), (Some(Linkage::Visible), Some(4)));
    assert_eq!(vars[11].linkage, Some(Linkage::Common));
    assert_eq!(vars[12].ty, ScalarType::TexRef);
    assert_eq!(vars[13].declarators[0].name, "$str$1");
}

#[test]
fn local_state_space_declarations() {
    let m = assert_round_trip(&kernel(
        ".local .align 16 .b8 __local_depot0[32];\n.shared .align 4 .b8 _ZZ1kE4tile[1024];\n\
         .extern .shared .align 16 .b8 dyn[];\n.const .u32 k0 = 5;\n.param .b64 param0;",
    ));
    let spaces: Vec<StateSpace> = body_of(&m)
        .iter()
        .map(|s| match &s.kind {
            StatementKind::Decl(d) => d.space,
            _ => panic!(),
        })
        .collect();
    assert_eq!(
        spaces,
        [StateSpace::Local, StateSpace::Shared, StateSpace::Shared, StateSpace::Const, StateSpace::Param]
    );
}

#[test]
fn memory_instruction_modifiers() {
    let i = one("ld.global.nc.v4.f32 {%f1, %f2, %f3, %f4}, [%rd1+16];");
    assert_eq!(i.opcode, "ld");
    assert_eq!(
        i.modifiers,
        [
            Modifier::Space(StateSpace::Global),
            Modifier::Other("nc".into()),
            Modifier::Vector(4),
            Modifier::Type(ScalarType::F32)
        ]
    );
    assert_eq!((i.space(), i.vector(), i.has("nc")), (Some(StateSpace::Global), Some(4), true));
    assert_eq!(i.operands[0], Operand::Vector(vec![reg("%f1"), reg("%f2"), reg("%f3"), reg("%f4")]));
    assert_eq!(i.operands[1], addr(rbase("%rd1"), 16));
    assert_eq!(i.mnemonic(), "ld.global.nc.v4.f32");

    let i = one(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%r1], [%rd1], 64, [%r2], %rd2;",
    );
    assert_eq!(i.space(), Some(StateSpace::SharedCluster));
    assert!(i.has("mbarrier::complete_tx::bytes") && i.has("L2::cache_hint"));
    let i = one("st.shared.v2.u32 [%r1+-8], {%r3, %r4};");
    assert_eq!(i.operands[0], addr(rbase("%r1"), -8));
}

#[test]
fn arithmetic_and_conversion_types() {
    let i = one("cvt.rn.f32.s32 %f1, %r1;");
    assert_eq!(i.types().collect::<Vec<_>>(), [ScalarType::F32, ScalarType::S32]);
    assert!(i.has("rn"));
    let i = one("setp.lt.and.s32 %p1, %r1, %r2, !%p2;");
    assert_eq!(i.types().collect::<Vec<_>>(), [ScalarType::S32]);
    assert!(i.has("lt") && i.has("and"));
    assert_eq!(i.operands[3], Operand::Not(Box::new(reg("%p2"))));
    let i = one("setp.ne.s32 %p1|%p2, %r1, 0;");
    assert_eq!(i.operands[0], Operand::Pair(Box::new(reg("%p1")), Box::new(reg("%p2"))));
    let i = one("fma.rn.ftz.sat.f32 %f1, %f2, 0f3F800000, -1.5;");
    assert_eq!(i.operands[2], Operand::Imm(Immediate::F32(0x3F80_0000)));
    assert_eq!(i.operands[3], Operand::Imm(Immediate::F64((-1.5f64).to_bits())));
    let i = one("mov.f64 %fd1, 0d3FF0000000000000;");
    assert_eq!(i.operands[1], Operand::Imm(Immediate::F64(1f64.to_bits())));
    let i = one("add.s64 %rd1, %rd2, -9;");
    assert_eq!(i.operands[2], Operand::Imm(Immediate::Int(-9)));
    let i = one("and.b32 %r1, %r2, 0xFFFFFFFF;");
    assert_eq!(i.operands[2], Operand::Imm(Immediate::Int(0xFFFF_FFFF)));
    let i = one("cvt.rn.satfinite.e4m3x2.f32 %rs1, %f1, %f2;");
    assert_eq!(i.types().collect::<Vec<_>>(), [ScalarType::E4M3x2, ScalarType::F32]);
}

#[test]
fn atomics_reductions_and_warp_primitives() {
    let i = one("atom.global.add.u32 %r1, [%rd1], 1;");
    assert_eq!((i.opcode.as_str(), i.space(), i.has("add")), ("atom", Some(StateSpace::Global), true));
    let i = one("atom.shared.cas.b32 %r1, [%r2], %r3, %r4;");
    assert_eq!(i.operands.len(), 4);
    let i = one("red.global.add.f32 [%rd1], %f1;");
    assert_eq!(i.opcode, "red");
    let i = one("shfl.sync.down.b32 %r1|%p1, %r2, 16, 31, -1;");
    assert_eq!(i.operands[0], Operand::Pair(Box::new(reg("%r1")), Box::new(reg("%p1"))));
    assert_eq!(i.operands[4], Operand::Imm(Immediate::Int(-1)));
    let i = one("vote.sync.ballot.b32 %r1, %p1, -1;");
    assert!(i.has("ballot"));
    let i = one("activemask.b32 %r1;");
    assert_eq!(i.types().next(), Some(ScalarType::B32));
    let i = one("bar.sync 0;");
    assert_eq!((i.opcode.as_str(), i.operands[0].clone()), ("bar", Operand::Imm(Immediate::Int(0))));
    let i = one("bar.warp.sync -1;");
    assert!(i.has("warp") && i.has("sync"));
    let i = one("membar.gl;");
    assert!(i.operands.is_empty());
}

#[test]
fn tensor_core_and_async_copy() {
    let i = one(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1,%f2,%f3,%f4}, {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%f1,%f2,%f3,%f4};",
    );
    assert_eq!(i.types().count(), 4);
    assert!(i.has("m16n8k16") && i.has("row") && i.has("col"));
    let i =
        one("wmma.load.a.sync.aligned.row.m16n16k16.global.f16 {%r1, %r2, %r3, %r4, %r5, %r6, %r7, %r8}, [%rd1], %r9;");
    assert_eq!(i.space(), Some(StateSpace::Global));
    let i = one("cp.async.cg.shared.global [%r1], [%rd1], 16;");
    assert_eq!((i.opcode.as_str(), i.space()), ("cp", Some(StateSpace::Shared)));
    assert!(instrs("cp.async.commit_group;\ncp.async.wait_group 0;").len() == 2);
    let i = one("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1, %r2, %r3, %r4}, [%r5];");
    assert!(i.has("x4"));
}

#[test]
fn special_registers_and_components() {
    let i = one("mov.u32 %r1, %tid.x;");
    assert_eq!(i.operands[1], Operand::Special(SpecialReg::Tid, Some(Component::X)));
    let is = instrs(
        "mov.u32 %r1, %ctaid.y;\nmov.u32 %r2, %nctaid.z;\nmov.u32 %r3, %laneid;\nmov.u64 %rd1, %clock64;\n\
         mov.u32 %r4, %lanemask_lt;\nmov.u32 %r5, %envreg3;\nmov.u64 %rd2, %globaltimer;\nmov.f32 %f1, %v.w;",
    );
    assert_eq!(is[0].operands[1], Operand::Special(SpecialReg::CtaId, Some(Component::Y)));
    assert_eq!(is[1].operands[1], Operand::Special(SpecialReg::NCtaId, Some(Component::Z)));
    assert_eq!(is[2].operands[1], Operand::Special(SpecialReg::LaneId, None));
    assert_eq!(is[3].operands[1], Operand::Special(SpecialReg::Clock64, None));
    assert_eq!(is[4].operands[1], Operand::Special(SpecialReg::LanemaskLt, None));
    assert_eq!(is[5].operands[1], Operand::Special(SpecialReg::EnvReg(3), None));
    assert_eq!(is[6].operands[1], Operand::Special(SpecialReg::GlobalTimer, None));
    assert_eq!(is[7].operands[1], Operand::RegComponent("%v".into(), Component::W));
    for name in ["%tid", "%pm7_64", "%pm3", "%envreg31", "%reserved_smem_offset_1", "%cluster_ctarank"] {
        assert_eq!(SpecialReg::from_name(name).unwrap().to_string(), name);
    }
    assert_eq!(SpecialReg::from_name("%envreg32"), None);
    assert_eq!(SpecialReg::from_name("%pm07"), None);
}

#[test]
fn operand_forms() {
    let i = one("tex.2d.v4.f32.f32 {%f1, %f2, %f3, _}, [tex0, {%f5, %f6}];");
    assert_eq!(i.operands[0], Operand::Vector(vec![reg("%f1"), reg("%f2"), reg("%f3"), Operand::Sink]));
    assert_eq!(i.operands[1], Operand::BracketList(vec![sym("tex0"), Operand::Vector(vec![reg("%f5"), reg("%f6")])]));
    // A trailing comma makes no list (found by fuzzing: `[%rd1,]` printed back as an address).
    let e = crate::parse(&kernel("atom.global.dec.u32 %r22, [%rd1,], 100;")).unwrap_err();
    assert!(e.to_string().contains("an operand after `,`"), "{e}");
    let is = instrs(
        "ld.param.u64 %rd1, [k_param_0];\nld.const.f32 %f1, [c+4];\nld.global.u32 %r1, [1024];\nmov.u64 %rd2, $str;\nmov.b64 {%r1, %r2}, %rd3;",
    );
    assert_eq!(is[0].operands[1], addr(AddressBase::Symbol("k_param_0".into()), 0));
    assert_eq!(is[1].operands[1], addr(AddressBase::Symbol("c".into()), 4));
    assert_eq!(is[2].operands[1], addr(AddressBase::Absolute, 1024));
    assert_eq!(is[3].operands[1], sym("$str"));
    assert_eq!(is[4].operands[0], Operand::Vector(vec![reg("%r1"), reg("%r2")]));
}

#[test]
fn guards_and_labels() {
    let m = parse(&kernel("@%p1 bra $L__BB0_2;\n@!%p2 bra.uni $L__BB0_3;\n$L__BB0_2:\n$L__BB0_3: ret;")).unwrap();
    let body = body_of(&m);
    let StatementKind::Instruction(i) = &body[0].kind else { panic!() };
    assert_eq!(i.guard, Some(Guard { negated: false, pred: "%p1".into() }));
    assert_eq!(i.operands, [sym("$L__BB0_2")]);
    let StatementKind::Instruction(i) = &body[1].kind else { panic!() };
    assert_eq!(i.guard, Some(Guard { negated: true, pred: "%p2".into() }));
    assert!(i.has("uni"));
    assert_eq!(body[2].kind, StatementKind::Label("$L__BB0_2".into()));
    assert_eq!(body[3].kind, StatementKind::Label("$L__BB0_3".into()));
    assert!(matches!(body[4].kind, StatementKind::Instruction(_)));
    // The kernel wrapper puts the first body line on line 6.
    assert_eq!((body[0].line, body[3].line, body[4].line), (6, 9, 9));
    assert_round_trip(&kernel("@%p1 bra $L__BB0_2;\n@!%p2 bra.uni $L__BB0_3;\n$L__BB0_2:\n$L__BB0_3: ret;"));
}

#[test]
fn calls_blocks_and_prototypes() {
    let body = "{ // callseq 0, 0\n.reg .b32 temp_param_reg;\n.param .b64 param0;\nst.param.b64 [param0+0], %rd5;\n\
                .param .b32 retval0;\ncall.uni (retval0), \nvprintf, \n(\nparam0, \nparam1\n);\n\
                ld.param.b32 %r4, [retval0+0];\n} // callseq 0\n\
                {\n.param .b32 param0;\nprototype_7 : .callprototype (.param .b32 _) _ (.param .b32 _, .param .align 4 .b8 _[12]);\n\
                call (retval0), %rd18, (param0), prototype_7;\n}\ncall.uni __trap, ();\ncall.uni _Z3fooi, (1, %r1);\n\
                tbl: .calltargets f1, f2;\nbt: .branchtargets L1, L2;\n\
                proto: .callprototype _ () .noreturn;";
    let m = assert_round_trip(&kernel(body));
    let b = body_of(&m);
    let StatementKind::Block(inner) = &b[0].kind else { panic!() };
    let StatementKind::Instruction(call) = &inner[4].kind else { panic!() };
    assert_eq!(call.opcode, "call");
    assert_eq!(
        call.operands,
        [Operand::List(vec![sym("retval0")]), sym("vprintf"), Operand::List(vec![sym("param0"), sym("param1")])]
    );
    let StatementKind::Instruction(ld) = &inner[5].kind else { panic!() };
    assert_eq!(ld.operands[1], addr(AddressBase::Symbol("retval0".into()), 0));
    let StatementKind::Block(inner) = &b[1].kind else { panic!() };
    let StatementKind::CallPrototype(p) = &inner[1].kind else { panic!() };
    assert_eq!((p.label.as_str(), p.return_params.len(), p.params.len(), p.noreturn), ("prototype_7", 1, 2, false));
    assert_eq!(p.params[1].dims, [Some(12)]);
    let StatementKind::Instruction(icall) = &inner[2].kind else { panic!() };
    assert_eq!(icall.operands[1], reg("%rd18"));
    assert_eq!(icall.operands[3], sym("prototype_7"));
    let StatementKind::Instruction(trap) = &b[2].kind else { panic!() };
    assert_eq!(trap.operands, [sym("__trap"), Operand::List(vec![])]);
    assert_eq!(b[4].kind, StatementKind::CallTargets { label: "tbl".into(), targets: vec!["f1".into(), "f2".into()] });
    assert!(matches!(&b[5].kind, StatementKind::BranchTargets { targets, .. } if targets.len() == 2));
    assert!(matches!(&b[6].kind, StatementKind::CallPrototype(p) if p.noreturn && p.params.is_empty()));
}

#[test]
fn debug_directives_and_sections() {
    let src = ".version 7.8\n.target sm_70, debug\n.address_size 64\n\
               .file 1 \"/work/a.cu\"\n.file 2 \"/usr/include/b.h\", 1700000000, 4321\n\
               .entry k()\n{\n.loc 1 22 0\n$L__func_begin0:\n.loc 1 23 5, function_name $L__info_string0, inlined_at 1 12 10\n\
               ret;\n$L__func_end0:\n}\n\
               \t.section\t.debug_info\n\t{\n.b32 77\n.b32 .debug_abbrev\n.b64 $L__func_begin0\n.b8 95,90 // { } in a comment\n\t}\n\
               \t.section\t.debug_str\n\t{\n$L__info_string0:\n.b8 95,0\n\t}\n\t.section\t.debug_macinfo\t{\t}\n";
    let m = assert_round_trip(src);
    let files: Vec<&FileDirective> =
        m.directives.iter().filter_map(|d| if let Directive::File(f) = d { Some(f) } else { None }).collect();
    assert_eq!(files[0].path, "/work/a.cu");
    assert_eq!((files[1].timestamp, files[1].size), (Some(1_700_000_000), Some(4321)));
    let body = body_of(&m);
    assert_eq!(
        body[0].kind,
        StatementKind::Loc(Loc { file: 1, line: 22, column: 0, function_name: None, inlined_at: None })
    );
    let StatementKind::Loc(l) = &body[2].kind else { panic!() };
    assert_eq!(l.function_name, Some(("$L__info_string0".into(), 0)));
    assert_eq!(l.inlined_at, Some((1, 12, 10)));
    let sections: Vec<&Section> =
        m.directives.iter().filter_map(|d| if let Directive::Section(s) = d { Some(s) } else { None }).collect();
    assert_eq!(sections.len(), 3);
    assert_eq!(sections[0].name, ".debug_info");
    assert!(sections[0].raw.contains(".b32 .debug_abbrev") && sections[0].raw.contains("// { } in a comment"));
    assert_eq!(sections[2].raw, "\t");
}

#[test]
fn comments_are_ignored() {
    let a = parse(&kernel("// a comment\n/* block\n comment */ add.s32 %r1, %r2, 3; // trailing\n")).unwrap();
    let b = parse(&kernel("add.s32 %r1, %r2, 3;")).unwrap();
    assert!(a.eq_ignoring_lines(&b));
}

#[test]
fn pragmas_in_bodies_and_at_module_scope() {
    let m = assert_round_trip(&format!(".pragma \"nounroll\";\n{}", kernel("$L__BB0_4:\n.pragma \"nounroll\";\nret;")));
    assert_eq!(m.directives[0], Directive::Pragma(vec!["nounroll".into()]));
    assert_eq!(body_of(&m)[1].kind, StatementKind::Pragma(vec!["nounroll".into()]));
}

#[test]
fn alias_directive() {
    let m = assert_round_trip(".func a() { ret; }\n.alias b, a;\n");
    assert_eq!(m.directives[1], Directive::Alias { alias: "b".into(), target: "a".into() });
}

#[test]
fn printed_forms() {
    let m = parse(&kernel(
        "@!%p1 st.global.v2.f32 [%rd1+-8], {%f1, %f2};\nld.param.u64 %rd1, [p+0];\nmov.f32 %f1, 1.0;\nmov.u32 %r1, %tid.x;",
    ))
    .unwrap();
    let text = m.to_string();
    assert!(text.contains("@!%p1 st.global.v2.f32 \t[%rd1+-8], {%f1, %f2};"), "{text}");
    assert!(text.contains("ld.param.u64 \t%rd1, [p];"), "{text}");
    assert!(text.contains("mov.f32 \t%f1, 0d3FF0000000000000;"), "{text}");
    assert!(text.contains("mov.u32 \t%r1, %tid.x;"), "{text}");
    assert!(
        text.starts_with(
            ".version 8.0\n.target sm_80\n.address_size 64\n\n.visible .entry k(\n\t.param .u64 p\n)\n{\n"
        )
    );
}

#[test]
fn line_numbers_are_recorded() {
    let m = parse(".version 8.0\n.target sm_80\n.address_size 64\n\n.entry k()\n{\n\t.reg .b32 %r<2>;\n\n\tadd.s32 %r1, %r1, 1;\n\t{\n\t\tret;\n\t}\n}\n").unwrap();
    let f = m.entries().next().unwrap();
    assert_eq!(f.line, 5);
    let lines: Vec<u32> = f.instructions().iter().map(|(l, _)| *l).collect();
    assert_eq!(lines, [9, 11]);
    let stripped = m.without_lines();
    assert_eq!(stripped.entries().next().unwrap().line, 0);
}

// ----- errors ------------------------------------------------------------------------------

#[test]
fn unknown_directives_are_reported_with_location() {
    let e = parse(".version 8.0\n.target sm_80\n.bogus 1\n").unwrap_err();
    assert_eq!((e.line, e.column), (3, 1));
    assert_eq!(e.kind, ParseErrorKind::UnknownDirective("bogus".into()));
    assert!(e.to_string().contains("line 3, column 1: unknown directive `.bogus`"), "{e}");

    let e = parse(&kernel("  .frobnicate 3;")).unwrap_err();
    assert_eq!(e.construct, "directive `.frobnicate` in function `k`");
    assert_eq!((e.line, e.column, e.kind.clone()), (6, 3, ParseErrorKind::UnknownDirective("frobnicate".into())));
    assert!(e.construct.contains("function `k`"), "{e}");

    let e = parse(".entry k() .maxthreads 3 { ret; }").unwrap_err();
    assert_eq!(e.kind, ParseErrorKind::UnknownDirective("maxthreads".into()));
    assert!(e.construct.contains("header of function `k`"), "{e}");
}

#[test]
fn syntax_errors_name_the_instruction_and_function() {
    let e = parse(&kernel("add.s32 %r1, %r2 %r3;")).unwrap_err();
    assert_eq!((e.line, e.column), (6, 18));
    assert_eq!(e.construct, "instruction `add.s32` in function `k`");
    assert!(matches!(&e.kind, ParseErrorKind::Unexpected { found, .. } if found == "`%r3`"), "{e}");

    // Lexical errors keep their own description but gain the construct.
    let e = parse(&kernel("add.s32 %r1, %r2, #3;")).unwrap_err();
    assert_eq!((e.line, e.column, e.kind.clone()), (6, 19, ParseErrorKind::UnexpectedChar('#')));
    assert_eq!(e.construct, "instruction `add.s32` in function `k`");
    let e = parse(&kernel(".pragma \"open;")).unwrap_err();
    assert_eq!(e.kind, ParseErrorKind::UnterminatedString);

    let e = parse(&kernel("ld.global.f32 %f1, [%rd1+];")).unwrap_err();
    assert_eq!(e.construct, "instruction `ld.global.f32` in function `k`");

    let e = parse(&kernel("mov.f32 %f1, 0f3F80;")).unwrap_err();
    assert_eq!(e.kind, ParseErrorKind::InvalidNumber("0f3F80".into()));

    let e = parse(".global .u33 x;").unwrap_err();
    assert_eq!(e.kind, ParseErrorKind::UnknownType("u33".into()));
    assert_eq!(e.construct, "directive `.global`");

    let e = parse(".entry k() {\n ret;\n").unwrap_err();
    assert!(matches!(e.kind, ParseErrorKind::Unexpected { ref found, .. } if found == "end of input"), "{e}");
    assert_eq!(e.line, 3);

    let e = parse(".version 8").unwrap_err();
    assert_eq!(e.kind, ParseErrorKind::InvalidNumber("8".into()));
    let e = parse(".visible .target sm_80").unwrap_err();
    assert!(e.to_string().contains("cannot have linkage"), "{e}");
    let e = parse(&kernel("mov.u32 %r1, %tid.q;")).unwrap_err();
    assert!(e.to_string().contains("not a vector component"), "{e}");
    let e = parse(".entry k(.local .u32 a) { ret; }").unwrap_err();
    assert!(e.to_string().contains("parameter in state space"), "{e}");
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let deep = format!("{}{}", "{".repeat(100_000), "}".repeat(100_000));
    let e = parse(&kernel(&deep)).unwrap_err();
    assert!(e.to_string().contains("nesting"), "{e}");
    let e = parse(&kernel(&format!("mov.b32 %r1, {}%p1;", "!".repeat(100_000)))).unwrap_err();
    assert!(e.to_string().contains("nesting"), "{e}");
    let e = parse(&format!(".global .u32 x[1] = {}1{};", "{".repeat(100_000), "}".repeat(100_000))).unwrap_err();
    assert!(e.to_string().contains("nesting"), "{e}");
    // Moderate nesting is fine.
    assert_round_trip(&kernel(&format!("{}ret;{}", "{".repeat(50), "}".repeat(50))));
}

/// A module exercising most constructs at once; also the seed for the truncation test.
const SAMPLE: &str = r#"//
// Generated by hand for the parser tests
//

.version 7.8
.target sm_80
.address_size 64

	// .globl	_Z6kernelPKfPfi
.extern .func  (.param .b32 func_retval0) vprintf
(
	.param .b64 vprintf_param_0,
	.param .b64 vprintf_param_1
)
;
.global .align 1 .b8 $str[6] = {104, 105, 32, 37, 100, 0};
.global .align 8 .u64 d_ptr = generic(d_target)+8;
.global .align 4 .b8 d_target[16];
.const .align 4 .f32 c_coeffs[2] = {0f3F800000, 0f3F000000};
.extern .shared .align 16 .b8 dyn_smem[];

.func  (.param .b32 func_retval0) _Z7add_onei(
	.param .b32 _Z7add_onei_param_0
)
{
	.reg .b32 	%r<3>;
	ld.param.u32 	%r1, [_Z7add_onei_param_0];
	add.s32 	%r2, %r1, 1;
	st.param.b32 	[func_retval0+0], %r2;
	ret;
}

.visible .entry _Z6kernelPKfPfi(
	.param .u64 _Z6kernelPKfPfi_param_0,
	.param .u64 _Z6kernelPKfPfi_param_1,
	.param .u32 _Z6kernelPKfPfi_param_2,
	.param .align 8 .b8 _Z6kernelPKfPfi_param_3[24]
)
.maxntid 256, 1, 1
.minnctapersm 2
{
	.local .align 8 .b8 	__local_depot1[8];
	.reg .b64 	%SP;
	.reg .b64 	%SPL;
	.reg .pred 	%p<3>;
	.reg .f32 	%f<6>;
	.reg .b32 	%r<12>;
	.reg .b64 	%rd<12>;
	// demoted variable
	.shared .align 4 .b8 _ZZ6kernelE4tile[1024];

	mov.u64 	%SPL, __local_depot1;
	cvta.local.u64 	%SP, %SPL;
	ld.param.u64 	%rd1, [_Z6kernelPKfPfi_param_0];
	ld.param.v2.u32 	{%r10, %r11}, [_Z6kernelPKfPfi_param_3+16];
	mov.u32 	%r1, %ctaid.x;
	mov.u32 	%r2, %ntid.x;
	mov.u32 	%r3, %tid.x;
	mad.lo.s32 	%r4, %r1, %r2, %r3;
	setp.ge.s32 	%p1, %r4, %r5;
	@%p1 bra 	$L__BB1_2;

	cvta.to.global.u64 	%rd2, %rd1;
	mul.wide.s32 	%rd3, %r4, 4;
	add.s64 	%rd4, %rd2, %rd3;
	ld.global.nc.f32 	%f1, [%rd4];
	fma.rn.f32 	%f2, %f1, 0f3F000000, 0fBF800000;
	shfl.sync.down.b32	%r6|%p2, %r4, 16, 31, -1;
	vote.sync.ballot.b32 	%r7, %p2, -1;
	atom.global.add.u32 	%r8, [%rd4+-4], 1;
	red.shared.add.f32 	[_ZZ6kernelE4tile+4], %f2;
	bar.sync 	0;
	{
	.reg .pred p;
	setp.ne.u32 p, %r3, 0;
	selp.u32 %r9, 1, 2, p;
	}
	{ // callseq 0, 0
	.reg .b32 temp_param_reg;
	.param .b32 param0;
	st.param.b32 	[param0+0], %r9;
	.param .b32 retval0;
	call.uni (retval0), 
	_Z7add_onei, 
	(
	param0
	);
	ld.param.b32 	%r9, [retval0+0];
	} // callseq 0
	mov.u64 	%rd5, $str;
	cvta.global.u64 	%rd6, %rd5;
	add.u64 	%rd7, %SP, 0;
	{ // callseq 1, 0
	.reg .b32 temp_param_reg;
	.param .b64 param0;
	st.param.b64 	[param0+0], %rd6;
	.param .b64 param1;
	st.param.b64 	[param1+0], %rd7;
	.param .b32 retval0;
	call.uni (retval0), 
	vprintf, 
	(
	param0, 
	param1
	);
	} // callseq 1
	@!%p2 st.global.f32 	[%rd4], %f2;

$L__BB1_2:
	.pragma "nounroll";
	ret;

}
"#;

#[test]
fn sample_module_round_trips() {
    let m = assert_round_trip(SAMPLE);
    assert_eq!(m.functions().count(), 3);
    let k = m.function("_Z6kernelPKfPfi").unwrap();
    let line_of = |needle: &str| SAMPLE.lines().position(|l| l.contains(needle)).unwrap() as u32 + 1;
    let (line, last) = *k.instructions().last().unwrap();
    assert_eq!((line, last.opcode.as_str()), (line_of("$L__BB1_2:") + 2, "ret"));
    let shfl = k.instructions().into_iter().find(|(_, i)| i.opcode == "shfl").unwrap();
    assert_eq!(shfl.0, line_of("shfl.sync"));
}

/// Every prefix of a valid module either parses or fails with a located error; none panics.
#[test]
fn truncated_input_never_panics() {
    let mut errors = 0;
    for end in 0..=SAMPLE.len() {
        if !SAMPLE.is_char_boundary(end) {
            continue;
        }
        let cut = &SAMPLE[..end];
        match std::panic::catch_unwind(|| parse(cut)) {
            Ok(Ok(m)) => {
                let again = parse(&m.to_string()).expect("printed prefix parses");
                assert!(again.eq_ignoring_lines(&m));
            }
            Ok(Err(e)) => {
                errors += 1;
                assert!(e.line >= 1 && e.column >= 1);
            }
            Err(_) => panic!("panic on prefix of length {end}"),
        }
    }
    assert!(errors > 1000);
}

/// Single-character deletions and insertions everywhere in the sample never panic.
#[test]
fn edited_input_never_panics() {
    let inserts = [
        "{", "}", "(", ")", "[", "]", ",", ";", ":", "@", "!", "-", "+", "|", "<", ">", "=", ".", "%", "\"", "_", "0f",
        "é",
    ];
    let bounds: Vec<usize> = (0..=SAMPLE.len()).filter(|&i| SAMPLE.is_char_boundary(i)).collect();
    for (n, w) in bounds.windows(2).enumerate() {
        let deleted = format!("{}{}", &SAMPLE[..w[0]], &SAMPLE[w[1]..]);
        let inserted = format!("{}{}{}", &SAMPLE[..w[0]], inserts[n % inserts.len()], &SAMPLE[w[0]..]);
        for text in [deleted, inserted] {
            match std::panic::catch_unwind(|| parse(&text)) {
                Ok(Ok(m)) => {
                    let again = parse(&m.to_string()).unwrap_or_else(|e| panic!("{e}\n{text}"));
                    assert!(again.eq_ignoring_lines(&m), "{text}");
                }
                Ok(Err(_)) => {}
                Err(_) => panic!("panic on edited input:\n{text}"),
            }
        }
    }
}
