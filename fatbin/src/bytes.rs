//! Bounds-checked little-endian reads. Every read of untrusted data in this crate goes through
//! these helpers, so an out-of-range field becomes `None` (and then a typed error) instead of a
//! panic.

/// The `N` bytes at `offset`, or `None` when they do not all lie inside `data`.
pub(crate) fn array<const N: usize>(data: &[u8], offset: usize) -> Option<[u8; N]> {
    let end = offset.checked_add(N)?;
    data.get(offset..end)?.try_into().ok()
}

pub(crate) fn u8_at(data: &[u8], offset: usize) -> Option<u8> {
    data.get(offset).copied()
}

pub(crate) fn u16_at(data: &[u8], offset: usize) -> Option<u16> {
    array(data, offset).map(u16::from_le_bytes)
}

pub(crate) fn u32_at(data: &[u8], offset: usize) -> Option<u32> {
    array(data, offset).map(u32::from_le_bytes)
}

pub(crate) fn u64_at(data: &[u8], offset: usize) -> Option<u64> {
    array(data, offset).map(u64::from_le_bytes)
}

/// `data[offset..offset + len]` with overflow-checked arithmetic on 64-bit lengths from headers.
pub(crate) fn slice(data: &[u8], offset: u64, len: u64) -> Option<&[u8]> {
    let start = usize::try_from(offset).ok()?;
    let end = usize::try_from(offset.checked_add(len)?).ok()?;
    data.get(start..end)
}

/// `bytes` without its trailing NUL padding.
pub(crate) fn trim_trailing_nuls(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    &bytes[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_bounds_checked() {
        let data = [1u8, 2, 3, 4, 5, 6, 7, 8, 9];
        assert_eq!(u16_at(&data, 0), Some(0x0201));
        assert_eq!(u32_at(&data, 5), Some(0x0908_0706));
        assert_eq!(u32_at(&data, 6), None);
        assert_eq!(u64_at(&data, 1), Some(0x0908_0706_0504_0302));
        assert_eq!(u64_at(&data, usize::MAX), None);
        assert_eq!(u8_at(&data, 9), None);
        assert_eq!(slice(&data, 8, 1), Some(&[9u8][..]));
        assert_eq!(slice(&data, 8, 2), None);
        assert_eq!(slice(&data, u64::MAX, 2), None);
    }

    #[test]
    fn trims_only_trailing_nuls() {
        assert_eq!(trim_trailing_nuls(b"\0ab\0c\0\0"), b"\0ab\0c");
        assert_eq!(trim_trailing_nuls(b"\0\0"), b"");
        assert_eq!(trim_trailing_nuls(b""), b"");
    }
}
