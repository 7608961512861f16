//! Text a peer chose (a program name, a kernel name, a refusal's reason), made safe to print.

/// `s` with control characters and other unprintable ones escaped (`\n`, `\u{1b}`), for
/// logs and listings: a guest's program name must not forge a log line or a table row, nor
/// move a terminal's cursor. Backslashes are doubled, so the result reads back unambiguously.
pub fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\'' | '"' => out.push(c),
            c => out.extend(c.escape_debug()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(printable("vector_add"), "vector_add");
        assert_eq!(printable("a\nINFO forged\x1b[2J"), "a\\nINFO forged\\u{1b}[2J");
        assert_eq!(printable("tab\there \\ 'q' \"d\" é"), "tab\\there \\\\ 'q' \"d\" é");
        assert!(!printable("\r\u{7f}\u{202e}").chars().any(|c| c.is_control()));
    }
}
