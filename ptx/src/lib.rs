//! PTX: parser, typed AST, printer and kernel signatures.
