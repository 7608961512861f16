//! PTX for Phos: lexer, parser, typed syntax tree, printer, kernel signatures, and the
//! interpreter that runs kernels on the CPU ([`exec`]).
//!
//! The PTX this crate reads is what nvcc embeds in fat binaries (PTX ISA 7.x to 9.x, from
//! CUDA 11.8 through 13.x). Its users:
//!
//! * the API server's `emu` backend, which lowers every module it loads with [`exec`] and runs
//!   its kernels there (docs/emu.md), and reads launch limits (`.maxntid`, `.reqntid`), the
//!   PTX version and the target from the tree;
//! * the API server's checkpoints, which find a module's `.global` and `.const` variables in
//!   its PTX when the module has no cubin that lists them;
//! * the guest library, which only needs each kernel's parameter layout ([`parse_signatures`]).
//!
//! The printer writes a tree back as PTX that parses to the same tree and that ptxas
//! assembles (the corpus tests check both on everything nvcc produces from `tests/data`).
//! The tree keeps every construct (debug sections included), so passes can rewrite a module
//! and print the result: [`instrument`] builds the checked twins of kernels that validate a
//! concurrent checkpoint's speculation, and [`access`] is that speculation (what each kernel
//! may read and write through its parameters).
//!
//! # Usage
//!
//! ```
//! let ptx = ".version 7.8\n.target sm_80\n.address_size 64\n\
//!            .visible .entry k(.param .u64 p, .param .u32 n)\n{\n\tret;\n}\n";
//! let module = phos_ptx::parse(ptx).unwrap();
//! let sig = &phos_ptx::signatures(&module)[0];
//! assert_eq!((sig.params[1].offset, sig.size), (8, 12));
//! // Printing gives PTX that parses back to the same tree.
//! let again = phos_ptx::parse(&module.to_string()).unwrap();
//! assert!(again.eq_ignoring_lines(&module));
//! ```
//!
//! # How the tree is organised
//!
//! A [`Module`] is a list of [`Directive`]s in source order: header directives, module-scope
//! variables ([`VarDecl`]), functions ([`Function`]) and debug sections. A function body is a
//! list of [`Statement`]s, each carrying the source line it started on so that later passes can
//! report "unsupported instruction X in kernel Y at PTX line N". Statements are declarations,
//! labels, instructions, nested `{ }` blocks (which are scopes), and the few statement-level
//! directives (`.pragma`, `.loc`, call prototypes).
//!
//! Instructions are deliberately *not* an enum of known opcodes. PTX has hundreds of opcodes and
//! every ISA revision adds modifiers, so a closed enum would make the parser reject valid input
//! long before the interpreter needs to care. Instead an [`Instruction`] is the opcode word, its
//! dot-suffixes decoded into [`Modifier`]s (type, vector width, state space, or any other word,
//! kept in source order), and typed [`Operand`]s. Everything that would otherwise be re-parsed
//! downstream is decoded once: immediates are exact bit patterns, addresses are base plus
//! offset, special registers are an enum, and vector/list/pair operands are structured.
//!
//! Operand names are classified while parsing: `%`-names and names declared by `.reg` in an
//! enclosing scope become [`Operand::Reg`], known special registers become
//! [`Operand::Special`], and all other names become [`Operand::Symbol`] (labels, variables,
//! functions, parameters). A lowering pass can therefore map every register name to a dense
//! index by walking the declarations of each scope, and resolve symbols against the module and
//! the function's labels, without any string inspection.
//!
//! Debug sections (`.section .debug_*`) are kept as raw text: nothing interprets them, but the
//! `.loc` directives refer to labels inside them, so printing without them would not assemble.
//!
//! # Errors
//!
//! Parsing never panics; failures are [`ParseError`]s with a line, a column, the construct being
//! parsed (for instance "instruction `ld.global` in function `_Z3fooPf`") and what was wrong.

pub mod access;
mod ast;
pub mod conditional;
mod error;
pub mod exec;
pub mod instrument;
mod lexer;
mod parser;
mod printer;
mod signature;

pub use ast::*;
pub use error::{ParseError, ParseErrorKind};
pub use parser::parse;
pub use signature::{KernelSignature, ParamLayout, demangle, parse_signatures, signature_of, signatures};
