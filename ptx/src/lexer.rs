//! Tokenizer. PTX's lexical structure is small: identifiers (which may start with `%`, `$` or
//! `_`), dot-words (directives, types and instruction modifiers alike), numbers, strings and
//! single-character punctuation. Comments are dropped here.

use crate::error::{ParseError, ParseErrorKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokKind {
    /// `%r1`, `$L__BB0_2`, `_Z3fooi`, `ld`, `_`
    Ident,
    /// `.global`, `.f32`, `.shared::cta`, `.L2::128B` (text excludes the dot)
    Dot,
    /// Raw numeric literal text: `12`, `0x1F`, `0f3F800000`, `7.8`, `1e-3`
    Number,
    /// String contents without the quotes (escapes left as written)
    Str,
    /// One punctuation character
    Punct,
    Eof,
    /// A lexical error; the lexer holds the details.
    Error,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Token<'a> {
    pub kind: TokKind,
    pub text: &'a str,
    pub line: u32,
    pub col: u32,
    /// Byte offsets of the token in the source (including quotes/dot).
    pub start: usize,
    pub end: usize,
}

impl Token<'_> {
    pub fn is_punct(&self, c: char) -> bool {
        self.kind == TokKind::Punct && self.text.starts_with(c)
    }

    pub fn is_dot(&self, word: &str) -> bool {
        self.kind == TokKind::Dot && self.text == word
    }

    /// How the token reads in an error message.
    pub fn describe(&self) -> String {
        match self.kind {
            TokKind::Ident => format!("`{}`", self.text),
            TokKind::Dot => format!("`.{}`", self.text),
            TokKind::Number => format!("number `{}`", self.text),
            TokKind::Str => "string literal".to_string(),
            TokKind::Punct => format!("`{}`", self.text),
            TokKind::Eof => "end of input".to_string(),
            TokKind::Error => "invalid input".to_string(),
        }
    }
}

fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b'$' || b == b'%'
}

fn is_ident_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$'
}

/// On-demand tokenizer. After the end of input it keeps returning `Eof`; after a lexical error
/// it keeps returning an `Error` token, and [`Lexer::error`] says what went wrong.
pub(crate) struct Lexer<'a> {
    src: &'a str,
    i: usize,
    line: u32,
    line_start: usize,
    error: Option<(ParseError, Token<'a>)>,
}

impl<'a> Lexer<'a> {
    pub fn new(src: &'a str) -> Self {
        Lexer { src, i: 0, line: 1, line_start: 0, error: None }
    }

    pub fn error(&self) -> Option<&ParseError> {
        self.error.as_ref().map(|(e, _)| e)
    }

    fn col(&self, at: usize) -> u32 {
        u32::try_from(at - self.line_start + 1).unwrap_or(u32::MAX)
    }

    pub fn next_token(&mut self) -> Token<'a> {
        if let Some((_, t)) = self.error {
            return t;
        }
        match self.scan() {
            Ok(t) => t,
            Err((line, col, kind)) => {
                let tok = Token { kind: TokKind::Error, text: "", line, col, start: self.i, end: self.i };
                let err = ParseError { line, column: col, construct: "token".to_string(), kind };
                self.error = Some((err, tok));
                tok
            }
        }
    }

    fn scan(&mut self) -> Result<Token<'a>, (u32, u32, ParseErrorKind)> {
        let src = self.src;
        let bytes = src.as_bytes();
        let mut i = self.i;
        while i < bytes.len() {
            let b = bytes[i];
            match b {
                b'\n' => {
                    i += 1;
                    self.line += 1;
                    self.line_start = i;
                    continue;
                }
                b' ' | b'\t' | b'\r' | 0x0b | 0x0c => {
                    i += 1;
                    continue;
                }
                b'/' if bytes.get(i + 1) == Some(&b'/') => {
                    while i < bytes.len() && bytes[i] != b'\n' {
                        i += 1;
                    }
                    continue;
                }
                b'/' if bytes.get(i + 1) == Some(&b'*') => {
                    let (start_line, start_col) = (self.line, self.col(i));
                    i += 2;
                    loop {
                        if i + 1 >= bytes.len() {
                            self.i = bytes.len();
                            return Err((start_line, start_col, ParseErrorKind::UnterminatedComment));
                        }
                        if bytes[i] == b'*' && bytes[i + 1] == b'/' {
                            i += 2;
                            break;
                        }
                        if bytes[i] == b'\n' {
                            self.line += 1;
                            self.line_start = i + 1;
                        }
                        i += 1;
                    }
                    continue;
                }
                _ => break,
            }
        }
        let (line, col) = (self.line, self.col(i));
        if i >= bytes.len() {
            self.i = i;
            return Ok(Token { kind: TokKind::Eof, text: "", line, col, start: i, end: i });
        }
        let b = bytes[i];
        let start = i;
        let (kind, text_range) = if is_ident_start(b) {
            i += 1;
            while i < bytes.len() && is_ident_char(bytes[i]) {
                i += 1;
            }
            (TokKind::Ident, start..i)
        } else if b == b'.' && bytes.get(i + 1).is_some_and(|&c| is_ident_char(c)) {
            // Dot-words may start with a digit: `tex.2d`.
            i += 1;
            loop {
                while i < bytes.len() && is_ident_char(bytes[i]) {
                    i += 1;
                }
                // `::`-qualified words such as `.shared::cta` or `.L2::128B` are one modifier.
                if bytes.get(i) == Some(&b':')
                    && bytes.get(i + 1) == Some(&b':')
                    && bytes.get(i + 2).is_some_and(|&c| is_ident_char(c))
                {
                    i += 2;
                    continue;
                }
                break;
            }
            (TokKind::Dot, start + 1..i)
        } else if b.is_ascii_digit() {
            i = scan_number(bytes, i);
            (TokKind::Number, start..i)
        } else if b == b'"' {
            i += 1;
            loop {
                match bytes.get(i) {
                    None | Some(b'\n') => {
                        self.i = i.min(bytes.len());
                        return Err((line, col, ParseErrorKind::UnterminatedString));
                    }
                    Some(b'\\') => i += 2,
                    Some(b'"') => break,
                    Some(_) => i += 1,
                }
            }
            i += 1;
            (TokKind::Str, start + 1..i - 1)
        } else if b"{}()[],;:+-!@=<>|".contains(&b) {
            i += 1;
            (TokKind::Punct, start..i)
        } else {
            self.i = i;
            let c = src[i..].chars().next().unwrap_or('\u{fffd}');
            return Err((line, col, ParseErrorKind::UnexpectedChar(c)));
        };
        self.i = i;
        Ok(Token { kind, text: &src[text_range], line, col, start, end: i })
    }
}

/// Tokenizes all of `src` (for tests), ending with the `Eof` token.
#[cfg(test)]
pub(crate) fn tokenize(src: &str) -> Result<Vec<Token<'_>>, ParseError> {
    let mut lexer = Lexer::new(src);
    let mut toks = Vec::new();
    loop {
        let t = lexer.next_token();
        match t.kind {
            TokKind::Error => return Err(lexer.error().cloned().expect("error token carries an error")),
            TokKind::Eof => {
                toks.push(t);
                return Ok(toks);
            }
            _ => toks.push(t),
        }
    }
}

/// Finds the end of a numeric literal starting at `i` (a digit). Validation happens when the
/// parser converts the text, where it knows what kind of number it expects.
fn scan_number(bytes: &[u8], mut i: usize) -> usize {
    let prefixed =
        bytes[i] == b'0' && matches!(bytes.get(i + 1), Some(b'x' | b'X' | b'f' | b'F' | b'd' | b'D' | b'b' | b'B'));
    if prefixed {
        // Hex, hex-float or binary; the digits are validated by `parse_number`.
        i += 2;
        while i < bytes.len() && bytes[i].is_ascii_hexdigit() {
            i += 1;
        }
    } else {
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        // Fractional part and exponent of a decimal float.
        if bytes.get(i) == Some(&b'.') && bytes.get(i + 1).is_some_and(|c| c.is_ascii_digit()) {
            i += 1;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
        }
        if matches!(bytes.get(i), Some(b'e' | b'E')) {
            let mut j = i + 1;
            if matches!(bytes.get(j), Some(b'+' | b'-')) {
                j += 1;
            }
            if bytes.get(j).is_some_and(|c| c.is_ascii_digit()) {
                i = j;
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
            }
        }
    }
    // Integer suffix `U` and any trailing identifier characters: keep them in the token so a
    // malformed literal like `12abc` is reported as one bad number.
    while i < bytes.len() && is_ident_char(bytes[i]) {
        i += 1;
    }
    i
}

/// Decoded numeric literal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Number {
    Int(i64),
    F32(u32),
    F64(u64),
}

/// Converts literal text to a value; `None` if malformed.
pub(crate) fn parse_number(text: &str) -> Option<Number> {
    let b = text.as_bytes();
    if b.len() > 2 && b[0] == b'0' {
        let digits = &text[2..];
        match b[1] {
            b'f' | b'F' => {
                return (digits.len() == 8).then(|| u32::from_str_radix(digits, 16).ok().map(Number::F32)).flatten();
            }
            b'd' | b'D' => {
                return (digits.len() == 16).then(|| u64::from_str_radix(digits, 16).ok().map(Number::F64)).flatten();
            }
            _ => {}
        }
    }
    let unsuffixed = text.strip_suffix(['U', 'u']).unwrap_or(text);
    let int = |digits: &str, radix: u32| -> Option<Number> {
        if digits.is_empty() {
            return None;
        }
        // Values up to u64::MAX are accepted and reinterpreted as i64 bits.
        u64::from_str_radix(digits, radix).ok().map(|v| Number::Int(v as i64))
    };
    let ub = unsuffixed.as_bytes();
    if ub.len() >= 2 && ub[0] == b'0' {
        match ub[1] {
            b'x' | b'X' => return int(&unsuffixed[2..], 16),
            b'b' | b'B' => return int(&unsuffixed[2..], 2),
            _ => {}
        }
    }
    if ub.iter().all(|c| c.is_ascii_digit()) {
        // A leading zero means octal, as in C.
        return if ub.len() > 1 && ub[0] == b'0' { int(&unsuffixed[1..], 8) } else { int(unsuffixed, 10) };
    }
    // Decimal floating point: digits with a fraction and/or an exponent.
    let valid = text.bytes().all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'+' | b'-'));
    if valid {
        return text.parse::<f64>().ok().map(|v| Number::F64(v.to_bits()));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(src: &str) -> Vec<(TokKind, String)> {
        tokenize(src).unwrap().into_iter().map(|t| (t.kind, t.text.to_string())).collect()
    }

    #[test]
    fn tokens_of_an_instruction() {
        let t = kinds("@!%p1 ld.global.nc.v4.f32 {%f1, _}, [%rd1+-8]; // trailing");
        let texts: Vec<&str> = t.iter().map(|(_, s)| s.as_str()).collect();
        assert_eq!(
            texts,
            [
                "@", "!", "%p1", "ld", "global", "nc", "v4", "f32", "{", "%f1", ",", "_", "}", ",", "[", "%rd1", "+",
                "-", "8", "]", ";", ""
            ]
        );
        assert_eq!(t[4].0, TokKind::Dot);
        assert_eq!(t[18].0, TokKind::Number);
    }

    #[test]
    fn qualified_modifiers_and_special_registers() {
        let t = kinds("cp.async.bulk.shared::cluster.L2::128B %tid.x");
        let texts: Vec<&str> = t.iter().map(|(_, s)| s.as_str()).collect();
        assert_eq!(texts, ["cp", "async", "bulk", "shared::cluster", "L2::128B", "%tid", "x", ""]);
    }

    #[test]
    fn comments_and_lines() {
        let toks = tokenize("a /* x\n y */ b\n// c\n  d").unwrap();
        assert_eq!((toks[0].line, toks[0].col), (1, 1));
        assert_eq!((toks[1].text, toks[1].line, toks[1].col), ("b", 2, 7));
        assert_eq!((toks[2].text, toks[2].line, toks[2].col), ("d", 4, 3));
    }

    #[test]
    fn lexical_errors_are_located() {
        let e = tokenize("ld\n  #").unwrap_err();
        assert_eq!((e.line, e.column), (2, 3));
        assert_eq!(e.kind, ParseErrorKind::UnexpectedChar('#'));
        assert_eq!(tokenize("/* open").unwrap_err().kind, ParseErrorKind::UnterminatedComment);
        assert_eq!(tokenize("\"open").unwrap_err().kind, ParseErrorKind::UnterminatedString);
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_number("42"), Some(Number::Int(42)));
        assert_eq!(parse_number("42U"), Some(Number::Int(42)));
        assert_eq!(parse_number("0x1F"), Some(Number::Int(31)));
        assert_eq!(parse_number("0b101"), Some(Number::Int(5)));
        assert_eq!(parse_number("017"), Some(Number::Int(15)));
        assert_eq!(parse_number("0"), Some(Number::Int(0)));
        assert_eq!(parse_number("0xFFFFFFFFFFFFFFFF"), Some(Number::Int(-1)));
        assert_eq!(parse_number("0f3F800000"), Some(Number::F32(0x3F80_0000)));
        assert_eq!(parse_number("0d3FF0000000000000"), Some(Number::F64(1f64.to_bits())));
        assert_eq!(parse_number("1.5"), Some(Number::F64(1.5f64.to_bits())));
        assert_eq!(parse_number("1e-3"), Some(Number::F64(1e-3f64.to_bits())));
        assert_eq!(parse_number("0f3F80"), None);
        assert_eq!(parse_number("12abc"), None);
        assert_eq!(parse_number("09"), None);
        assert_eq!(parse_number("99999999999999999999999"), None);
        for src in ["0f3F800000", "0x10", "0b11", "1.25e+2", "7.8", "3U"] {
            let t = tokenize(src).unwrap();
            assert_eq!((t.len(), t[0].text), (2, src), "{src}");
        }
    }
}
