//! Arithmetic for spec expressions in generated code. Everything is computed in `i128` and
//! checked, so a hostile size (`offset + count` wrapping around) is an error, not a wrap.

/// A spec expression overflowed, divided by zero or does not fit its target type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvalError;

impl std::fmt::Display for EvalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("value out of range in a spec expression")
    }
}

impl std::error::Error for EvalError {}

pub type Result<T> = std::result::Result<T, EvalError>;

pub fn add(a: i128, b: i128) -> Result<i128> {
    a.checked_add(b).ok_or(EvalError)
}
pub fn sub(a: i128, b: i128) -> Result<i128> {
    a.checked_sub(b).ok_or(EvalError)
}
pub fn mul(a: i128, b: i128) -> Result<i128> {
    a.checked_mul(b).ok_or(EvalError)
}
pub fn div(a: i128, b: i128) -> Result<i128> {
    a.checked_div(b).ok_or(EvalError)
}
pub fn rem(a: i128, b: i128) -> Result<i128> {
    a.checked_rem(b).ok_or(EvalError)
}
pub fn neg(a: i128) -> Result<i128> {
    a.checked_neg().ok_or(EvalError)
}
pub fn shl(a: i128, b: i128) -> Result<i128> {
    let s = u32::try_from(b).map_err(|_| EvalError)?;
    let r = a.checked_shl(s).ok_or(EvalError)?;
    if r >> s != a { Err(EvalError) } else { Ok(r) }
}
pub fn shr(a: i128, b: i128) -> Result<i128> {
    let s = u32::try_from(b).map_err(|_| EvalError)?;
    a.checked_shr(s).ok_or(EvalError)
}

/// Convert to a wire integer type, failing when the value does not fit.
pub fn narrow<T: TryFrom<i128>>(v: i128) -> Result<T> {
    T::try_from(v).map_err(|_| EvalError)
}

/// Bytes of `count` elements of `elem_size` bytes; negative or oversized counts fail.
pub fn byte_len(count: i128, elem_size: u64) -> Result<u64> {
    let bytes = mul(count, i128::from(elem_size))?;
    narrow::<u64>(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_is_an_error() {
        assert_eq!(add(1, 2), Ok(3));
        assert!(narrow::<u64>(add(u64::MAX as i128, 1).unwrap()).is_err());
        assert!(byte_len(-1, 4).is_err());
        assert!(byte_len(i128::MAX, 2).is_err());
        assert!(div(1, 0).is_err());
        assert!(shl(1, 200).is_err());
        assert_eq!(shl(3, 4), Ok(48));
        assert_eq!(byte_len(10, 4), Ok(40));
    }
}
