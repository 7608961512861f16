//! What a guest reports with `phosReportBypass`: something in its process that does not go
//! through Phos. The guest library looks for it when its session opens and later
//! (docs/operations.md, "No bypass"); the router marks the session bypassed.

/// The `kind` argument of `phosReportBypass`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum BypassKind {
    /// A CUDA runtime or driver library that is not Phos's is mapped beside Phos's guest
    /// library; the detail is its path and soname.
    ForeignLibrary = 1,
    /// NVIDIA's own CUDA runtime, built into an object (a program linked with `-cudart
    /// static`, or an NVIDIA library), asked Phos's driver for its private export tables; the
    /// detail is the object's path.
    PrivateRuntime = 2,
}

impl BypassKind {
    pub fn from_i32(kind: i32) -> Option<BypassKind> {
        match kind {
            1 => Some(BypassKind::ForeignLibrary),
            2 => Some(BypassKind::PrivateRuntime),
            _ => None,
        }
    }
}

/// The longest detail a router keeps of one finding (a path and a soname); the rest is cut.
pub const MAX_DETAIL: usize = 4096 + 256;

/// The findings a router keeps per session; later ones are counted, not kept.
pub const MAX_FINDINGS: usize = 16;

/// `detail` cut to at most [`MAX_DETAIL`] bytes, at a character boundary.
pub fn bounded(detail: &str) -> &str {
    let mut end = detail.len().min(MAX_DETAIL);
    while !detail.is_char_boundary(end) {
        end -= 1;
    }
    &detail[..end]
}

/// A finding in words, for logs and `phosctl sessions`: `detail` [`bounded`] and escaped.
pub fn describe(kind: i32, detail: &str) -> String {
    let detail = crate::text::printable(bounded(detail));
    match BypassKind::from_i32(kind) {
        Some(BypassKind::ForeignLibrary) => format!("a CUDA runtime or driver that is not Phos's is mapped: {detail}"),
        Some(BypassKind::PrivateRuntime) => {
            format!("NVIDIA's own CUDA runtime, built into {detail}, asked for the driver's private interfaces")
        }
        None => format!("finding of unknown kind {kind}: {detail}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn findings_are_worded_escaped_and_bounded() {
        assert_eq!(
            describe(1, "/x/copy.so (soname libcudart.so.12)"),
            "a CUDA runtime or driver that is not Phos's is mapped: /x/copy.so (soname libcudart.so.12)"
        );
        assert!(describe(2, "/bin/app").contains("built into /bin/app"));
        assert!(describe(7, "a\nb").ends_with("unknown kind 7: a\\nb"));
        let long = "é".repeat(MAX_DETAIL);
        assert!(describe(1, &long).len() < MAX_DETAIL + 100, "cut at a character boundary");
    }
}
