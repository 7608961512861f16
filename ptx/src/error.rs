//! Parse errors.

use thiserror::Error;

/// A syntax error, located by 1-based line and column and by the construct being parsed
/// (e.g. "instruction `ld.global` in function `_Z3fooPf`").
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("PTX line {line}, column {column}: {kind} (in {construct})")]
pub struct ParseError {
    pub line: u32,
    pub column: u32,
    pub construct: String,
    pub kind: ParseErrorKind,
}

/// What went wrong.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ParseErrorKind {
    #[error("unexpected character {0:?}")]
    UnexpectedChar(char),
    #[error("unterminated string literal")]
    UnterminatedString,
    #[error("unterminated block comment")]
    UnterminatedComment,
    #[error("invalid number literal `{0}`")]
    InvalidNumber(String),
    #[error("expected {expected}, found {found}")]
    Unexpected { expected: String, found: String },
    #[error("unknown directive `.{0}`")]
    UnknownDirective(String),
    #[error("unknown type `.{0}`")]
    UnknownType(String),
    #[error("{0}")]
    Invalid(String),
}
