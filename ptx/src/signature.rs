//! Kernel signatures: where each `.entry` parameter lives in the launch parameter buffer.

use std::fmt;

use crate::ast::{Function, FunctionKind, Module, Param, ScalarType};
use crate::error::ParseError;

/// Layout of one kernel's parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSignature {
    /// Symbol name as in the PTX (mangled for C++ kernels).
    pub name: String,
    /// Demangled C++ prototype such as `axpby<float>(float, float const*, float, float*, int)`,
    /// or the plain name for `extern "C"` kernels.
    pub demangled: String,
    pub params: Vec<ParamLayout>,
    /// Bytes of parameter buffer the kernel reads: the end of the last parameter.
    pub size: u64,
}

/// One parameter's place in the buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamLayout {
    pub name: String,
    /// Element type (`.b8` for aggregates passed as byte arrays).
    pub ty: ScalarType,
    /// `.v2`/`.v4` width, if declared as a vector.
    pub vector: Option<u8>,
    /// Array dimensions; empty for a scalar.
    pub dims: Vec<Option<u64>>,
    pub size: u64,
    pub align: u64,
    pub offset: u64,
}

impl ParamLayout {
    /// The parameter's PTX type as it would be declared, e.g. `.align 8 .b8 [24]` or `.u64`.
    pub fn ptx_type(&self) -> String {
        let mut s = String::new();
        if !self.dims.is_empty() {
            s.push_str(&format!(".align {} ", self.align));
        }
        if let Some(v) = self.vector {
            s.push_str(&format!(".v{v} "));
        }
        s.push_str(&self.ty.to_string());
        for d in &self.dims {
            match d {
                Some(n) => s.push_str(&format!("[{n}]")),
                None => s.push_str("[]"),
            }
        }
        s
    }
}

impl fmt::Display for KernelSignature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} ({} bytes of parameters)", self.demangled, self.size)?;
        for p in &self.params {
            writeln!(f, "  +{:<4} {:>4} B align {:<3} {} {}", p.offset, p.size, p.align, p.ptx_type(), p.name)?;
        }
        Ok(())
    }
}

/// Demangles an Itanium C++ symbol, returning the input unchanged if it is not one.
pub fn demangle(name: &str) -> String {
    cpp_demangle::Symbol::new(name)
        .ok()
        .and_then(|s| s.demangle(&cpp_demangle::DemangleOptions::default()).ok())
        .unwrap_or_else(|| name.to_string())
}

/// Lays out a kernel's parameters in order, each at the next multiple of its alignment.
pub fn signature_of(function: &Function) -> KernelSignature {
    let mut offset = 0u64;
    let params = function
        .params
        .iter()
        .map(|p: &Param| {
            let align = p.alignment().max(1);
            // Saturating: sizes are the module's word (a buffer of u64::MAX bytes never fits).
            let start = offset.checked_next_multiple_of(align).unwrap_or(u64::MAX);
            let size = p.size();
            offset = start.saturating_add(size);
            ParamLayout {
                name: p.name.clone(),
                ty: p.ty,
                vector: p.vector,
                dims: p.dims.clone(),
                size,
                align,
                offset: start,
            }
        })
        .collect();
    KernelSignature { name: function.name.clone(), demangled: demangle(&function.name), params, size: offset }
}

/// Signatures of every kernel defined or declared in the module, in source order. A kernel that
/// is both declared and defined is reported once.
pub fn signatures(module: &Module) -> Vec<KernelSignature> {
    let mut seen = std::collections::HashSet::new();
    module
        .functions()
        .filter(|f| f.kind == FunctionKind::Entry && seen.insert(f.name.as_str()))
        .map(signature_of)
        .collect()
}

/// Parses PTX text and returns its kernel signatures.
pub fn parse_signatures(ptx: &str) -> Result<Vec<KernelSignature>, ParseError> {
    Ok(signatures(&crate::parse(ptx)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = r#".version 7.8
.target sm_80
.address_size 64
.visible .entry _Z10with_mixedPKfPfi5Mixed(
	.param .u64 _Z10with_mixedPKfPfi5Mixed_param_0,
	.param .u64 _Z10with_mixedPKfPfi5Mixed_param_1,
	.param .u32 _Z10with_mixedPKfPfi5Mixed_param_2,
	.param .align 8 .b8 _Z10with_mixedPKfPfi5Mixed_param_3[24]
);
.visible .entry _Z10with_mixedPKfPfi5Mixed(
	.param .u64 _Z10with_mixedPKfPfi5Mixed_param_0,
	.param .u64 _Z10with_mixedPKfPfi5Mixed_param_1,
	.param .u32 _Z10with_mixedPKfPfi5Mixed_param_2,
	.param .align 8 .b8 _Z10with_mixedPKfPfi5Mixed_param_3[24]
)
{
	ret;
}
.func _Z6helperv()
{
	ret;
}
.entry plain_c(.param .u8 c, .param .v2 .f32 v, .param .f16 h, .param .align 16 .b8 blob[3], .param .u64 .ptr .align 16 p)
{
	ret;
}
"#;

    #[test]
    fn layout_follows_declared_alignment() {
        let sigs = parse_signatures(PTX).unwrap();
        // The prototype and the definition give one signature; `.func`s give none.
        assert_eq!(sigs.len(), 2);
        let s = &sigs[0];
        assert_eq!(s.demangled, "with_mixed(float const*, float*, int, Mixed)");
        let l: Vec<(u64, u64, u64)> = s.params.iter().map(|p| (p.offset, p.size, p.align)).collect();
        assert_eq!(l, [(0, 8, 8), (8, 8, 8), (16, 4, 4), (24, 24, 8)]);
        assert_eq!(s.size, 48);
        assert_eq!(s.params[0].ptx_type(), ".u64");
        assert_eq!(s.params[3].ptx_type(), ".align 8 .b8[24]");

        let c = &sigs[1];
        assert_eq!(c.demangled, "plain_c");
        let l: Vec<(u64, u64, u64)> = c.params.iter().map(|p| (p.offset, p.size, p.align)).collect();
        // `.ptr .align 16` describes the pointee, not the parameter.
        assert_eq!(l, [(0, 1, 1), (8, 8, 8), (16, 2, 2), (32, 3, 16), (40, 8, 8)]);
        assert_eq!(c.size, 48);
        assert_eq!(c.params[1].ptx_type(), ".v2 .f32");
        let text = c.to_string();
        assert!(text.starts_with("plain_c (48 bytes of parameters)\n"), "{text}");
    }

    #[test]
    fn demangling_falls_back_to_the_symbol() {
        assert_eq!(
            demangle("_Z5axpbyIfEvT_PKS0_S0_PS0_i"),
            "void axpby<float>(float, float const*, float, float*, int)"
        );
        assert_eq!(demangle("vector_add"), "vector_add");
        assert_eq!(demangle("_Zgarbage"), "_Zgarbage");
    }

    #[test]
    fn sizes_too_large_for_u64_saturate() {
        // `[4294967296][4294967296]` overflowed the product of the dimensions (the `ptx_exec`
        // fuzz target, on a crafted input).
        let ptx = ".version 7.8\n.target sm_80\n.address_size 64\n\
                   .visible .entry k(.param .u32 n, .param .align 8 .b8 p[4294967296][4294967296], .param .u32 m)\n{\n\tret;\n}\n";
        let sig = &parse_signatures(ptx).unwrap()[0];
        let l: Vec<(u64, u64)> = sig.params.iter().map(|p| (p.offset, p.size)).collect();
        assert_eq!(l, [(0, 4), (8, u64::MAX), (u64::MAX, 4)]);
        assert_eq!(sig.size, u64::MAX);
    }

    #[test]
    fn parse_errors_propagate() {
        let e = parse_signatures(".version 7.8\n.entry k(.param .u64 a\n").unwrap_err();
        assert_eq!(e.line, 3);
    }
}
