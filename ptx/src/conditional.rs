//! Conditional graph nodes' device side, as Phos carries it (docs/architecture.md,
//! "Conditional nodes"): a kernel sets a conditional node's handle with
//! `cudaGraphSetConditional(handle, value)`, a builtin of CUDA's device runtime that PTX calls as
//! an external function. Phos's handle is the device address of a 4-byte cell of the session's
//! memory, which the server reads when it replays the node, so the call becomes a store of the
//! value to that address (a generic store: the handle is a device pointer): [`lower_set_conditional`] rewrites every such call of a module, and
//! the module is loaded from the rewritten PTX (by the GPU's JIT, or run by the interpreter).

use crate::ast::{
    Address, AddressBase, Directive, FunctionKind, Instruction, Modifier, Module, Operand, ScalarType, StateSpace,
    Statement, StatementKind,
};

/// The device runtime's function that sets a conditional node's handle.
pub const SET_CONDITIONAL: &str = "cudaGraphSetConditional";

/// Why a module's calls could not be rewritten.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConditionalError {
    #[error("a call of {SET_CONDITIONAL} in `{function}` whose arguments are not stored just before it")]
    Arguments { function: String },
}

/// Whether `module` calls `cudaGraphSetConditional` anywhere.
pub fn calls_set_conditional(module: &Module) -> bool {
    module.directives.iter().any(|d| match d {
        Directive::Function(f) => f.body.as_deref().is_some_and(block_calls),
        _ => false,
    })
}

fn block_calls(body: &[Statement]) -> bool {
    body.iter().any(|s| match &s.kind {
        StatementKind::Instruction(i) => is_set_conditional(i),
        StatementKind::Block(b) => block_calls(b),
        _ => false,
    })
}

/// `call[.uni] [(rets),] cudaGraphSetConditional, (args);`
fn is_set_conditional(i: &Instruction) -> bool {
    i.opcode == "call" && i.operands.iter().any(|o| matches!(o, Operand::Symbol(s) if s == SET_CONDITIONAL))
}

/// Rewrite every call of `cudaGraphSetConditional(handle, value)` in `module` into
/// `st.u32 [handle], value` (under the call's guard), and drop the function's
/// declaration. Answers whether anything changed. nvcc passes the arguments through `.param`
/// variables stored in the same block just before the call; a call whose arguments cannot be
/// found so is refused.
pub fn lower_set_conditional(module: &mut Module) -> Result<bool, ConditionalError> {
    let mut changed = false;
    for d in &mut module.directives {
        if let Directive::Function(f) = d
            && let Some(body) = f.body.as_mut()
        {
            changed |= lower_block(body, &f.name)?;
        }
    }
    let before = module.directives.len();
    module.directives.retain(|d| {
        !matches!(d, Directive::Function(f) if f.kind == FunctionKind::Func && f.body.is_none() && f.name == SET_CONDITIONAL)
    });
    Ok(changed || module.directives.len() != before)
}

fn lower_block(body: &mut [Statement], function: &str) -> Result<bool, ConditionalError> {
    let mut changed = false;
    for at in 0..body.len() {
        let call = match &mut body[at].kind {
            StatementKind::Block(inner) => {
                changed |= lower_block(inner, function)?;
                continue;
            }
            StatementKind::Instruction(i) if is_set_conditional(i) => i.clone(),
            _ => continue,
        };
        let refused = || ConditionalError::Arguments { function: function.to_string() };
        // The argument list is the last operand; a return list (there is none) would come first.
        let Some(Operand::List(args)) = call.operands.last() else { return Err(refused()) };
        let [Operand::Symbol(handle_param), Operand::Symbol(value_param)] = args.as_slice() else {
            return Err(refused());
        };
        let handle = stored_before(&body[..at], handle_param).ok_or_else(refused)?;
        let value = stored_before(&body[..at], value_param).ok_or_else(refused)?;
        let Operand::Reg(handle) = handle else { return Err(refused()) };
        let store = Instruction {
            guard: call.guard.clone(),
            opcode: "st".to_string(),
            // A generic store: the handle is a device pointer as `cudaMalloc` answers them.
            modifiers: vec![Modifier::Type(ScalarType::U32)],
            operands: vec![Operand::Address(Address { base: AddressBase::Reg(handle), offset: 0 }), value],
        };
        body[at].kind = StatementKind::Instruction(store);
        changed = true;
    }
    Ok(changed)
}

/// The value the last `st.param` before the end of `body` stored at `[param]` (`[param+0]`).
fn stored_before(body: &[Statement], param: &str) -> Option<Operand> {
    body.iter().rev().find_map(|s| match &s.kind {
        StatementKind::Instruction(i)
            if i.opcode == "st"
                && i.modifiers.contains(&Modifier::Space(StateSpace::Param))
                && matches!(i.operands.first(), Some(Operand::Address(Address { base: AddressBase::Symbol(p), offset: 0 })) if p == param) =>
        {
            i.operands.get(1).cloned()
        }
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What nvcc 12.4 makes of `cudaGraphSetConditional(handle, n > 0)` (trimmed).
    const PTX: &str = ".version 8.4\n.target sm_70\n.address_size 64\n\
        .extern .func cudaGraphSetConditional\n(\n\t.param .b64 cudaGraphSetConditional_param_0,\n\t.param .b32 cudaGraphSetConditional_param_1\n)\n;\n\
        .visible .entry step(\n\t.param .u64 step_param_0,\n\t.param .u64 step_param_1\n)\n{\n\
        \t.reg .pred %p<2>;\n\t.reg .b32 %r<4>;\n\t.reg .b64 %rd<4>;\n\
        \tld.param.u64 %rd1, [step_param_0];\n\tld.param.u64 %rd2, [step_param_1];\n\
        \tld.global.u32 %r1, [%rd2];\n\tsetp.gt.s32 %p1, %r1, 0;\n\tselp.u32 %r2, 1, 0, %p1;\n\
        \t{ // callseq 0, 0\n\t.param .b64 param0;\n\tst.param.b64 [param0+0], %rd1;\n\t.param .b32 param1;\n\tst.param.b32 [param1+0], %r2;\n\
        \tcall.uni \n\tcudaGraphSetConditional, \n\t(\n\tparam0, \n\tparam1\n\t);\n\t} // callseq 0\n\
        \t{ // callseq 1, 0\n\t.param .b64 param0;\n\tst.param.b64 [param0+0], %rd1;\n\t.param .b32 param1;\n\tst.param.b32 [param1+0], 7;\n\
        \t@%p1 call.uni \n\tcudaGraphSetConditional, \n\t(\n\tparam0, \n\tparam1\n\t);\n\t} // callseq 1\n\
        \tret;\n}\n";

    #[test]
    fn calls_become_stores_to_the_handle() {
        let mut module = crate::parse(PTX).unwrap();
        assert!(calls_set_conditional(&module));
        assert_eq!(lower_set_conditional(&mut module), Ok(true));
        assert!(!calls_set_conditional(&module));
        let text = module.to_string();
        assert!(!text.contains(SET_CONDITIONAL), "{text}");
        assert!(text.contains("st.u32 \t[%rd1], %r2;"), "{text}");
        assert!(text.contains("@%p1 st.u32 \t[%rd1], 7;"), "{text}");
        // What it prints parses again, and has nothing left to rewrite.
        let mut again = crate::parse(&text).unwrap();
        assert_eq!(lower_set_conditional(&mut again), Ok(false));
    }

    #[test]
    fn a_call_without_its_stored_arguments_is_refused() {
        let ptx = PTX.replace(
            "\tst.param.b64 [param0+0], %rd1;\n\t.param .b32 param1;\n\tst.param.b32 [param1+0], %r2;\n",
            "\t.param .b32 param1;\n",
        );
        let mut module = crate::parse(&ptx).unwrap();
        assert_eq!(
            lower_set_conditional(&mut module),
            Err(ConditionalError::Arguments { function: "step".to_string() })
        );
    }
}
