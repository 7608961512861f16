//! Diagnostics that point at the spec line they are about.

use std::fmt;

use crate::ast::Span;

/// One problem found in a spec, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub span: Span,
    pub message: String,
}

impl Diagnostic {
    pub fn new(span: Span, message: impl Into<String>) -> Self {
        Diagnostic { span, message: message.into() }
    }
}

/// Every problem found in one spec file, rendered against its source.
#[derive(Debug, Clone)]
pub struct SpecError {
    pub path: String,
    pub source: String,
    pub diagnostics: Vec<Diagnostic>,
}

/// 1-based line and column of a byte offset.
pub fn line_col(source: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(source.len());
    let before = &source[..offset];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map_or(offset, |nl| offset - nl - 1) + 1;
    (line, col)
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.diagnostics {
            let (line, col) = line_col(&self.source, d.span.start);
            writeln!(f, "{}:{}:{}: error: {}", self.path, line, col, d.message)?;
            if let Some(text) = self.source.lines().nth(line - 1) {
                writeln!(f, "  {line:>4} | {text}")?;
                let width = d.span.end.saturating_sub(d.span.start).clamp(1, text.len().saturating_sub(col - 1).max(1));
                writeln!(f, "       | {}{}", " ".repeat(col - 1), "^".repeat(width))?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for SpecError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column() {
        let s = "ab\ncd\nef";
        assert_eq!(line_col(s, 0), (1, 1));
        assert_eq!(line_col(s, 4), (2, 2));
        assert_eq!(line_col(s, 6), (3, 1));
    }

    #[test]
    fn renders_caret_under_the_span() {
        let e = SpecError {
            path: "x.lapis".into(),
            source: "api x;\nint f(int a) { bogus; }\n".into(),
            diagnostics: vec![Diagnostic::new(Span::new(22, 27), "unknown descriptor `bogus`")],
        };
        let text = e.to_string();
        assert!(text.starts_with("x.lapis:2:16: error: unknown descriptor `bogus`"), "{text}");
        assert!(text.contains("^^^^^"), "{text}");
    }
}
