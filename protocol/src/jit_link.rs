//! The inputs of a JIT link (`cuLinkCreate` ... `cuLinkComplete`) as the guest sends them to
//! the server in one call (`phosLinkRun`): the link's options, then each input with its type,
//! name, options and bytes. Little-endian, every length checked when read: the server decodes
//! what a hostile guest wrote, borrowing the bytes from the frame.

/// `"PLNK"`, then the version.
const MAGIC: u32 = 0x4B4E_4C50;
const VERSION: u32 = 1;

/// Most bytes of input one link takes (the server refuses more).
pub const MAX_INPUT_BYTES: u64 = 512 << 20;
/// Most inputs one link takes.
pub const MAX_INPUTS: usize = 4096;
/// Most options of the link or of one input.
pub const MAX_OPTIONS: usize = 64;
/// Largest log the server keeps of a link (each of the info and error logs).
pub const MAX_LOG: u32 = 1 << 20;
/// Longest input name.
pub const MAX_NAME: usize = 4096;

/// `CUjitInputType`.
pub mod input_type {
    pub const CUBIN: u32 = 0;
    pub const PTX: u32 = 1;
    pub const FATBINARY: u32 = 2;
    pub const OBJECT: u32 = 3;
    pub const LIBRARY: u32 = 4;
    pub const NVVM: u32 = 5;
}

/// `CUjit_option`s whose value is a number (not a host pointer, not an output) and that a link
/// carries to the server: register and thread limits, optimisation, target, fallback, debug
/// and line information, verbosity, cache mode, fast compile, LTO and its float modes, unused
/// variables, position-independent code, CTA and thread counts, overriding directives.
pub fn carried_option(option: i32) -> bool {
    matches!(option, 0 | 1 | 7..=16 | 20..=24 | 29..=33)
}

/// One input of a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input<'a> {
    /// `CUjitInputType`.
    pub kind: u32,
    pub name: &'a [u8],
    /// Its own options, as (option, value).
    pub options: Vec<(i32, u64)>,
    pub data: &'a [u8],
}

/// What the guest sends: the link's options and its inputs, and the log sizes it asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInputs<'a> {
    pub options: Vec<(i32, u64)>,
    /// The room of the program's info and error logs (0: none asked for).
    pub info_log: u32,
    pub error_log: u32,
    pub inputs: Vec<Input<'a>>,
}

/// Why a guest's link inputs are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkDecodeError {
    #[error("not a link request (magic or version)")]
    Header,
    #[error("the request ends inside {0}")]
    Truncated(&'static str),
    #[error("{0} exceeds Phos's limit")]
    TooLarge(&'static str),
    #[error("option {0} is not one a link carries")]
    Option(i32),
    #[error("{0} trailing bytes")]
    Trailing(usize),
}

fn put_options(out: &mut Vec<u8>, options: &[(i32, u64)]) {
    for &(o, v) in options {
        out.extend_from_slice(&o.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&v.to_le_bytes());
    }
}

impl LinkInputs<'_> {
    /// The bytes the guest sends.
    pub fn encode(&self) -> Vec<u8> {
        let data: usize = self.inputs.iter().map(|i| i.data.len() + i.name.len() + 24 + 16 * i.options.len()).sum();
        let mut out = Vec::with_capacity(24 + 16 * self.options.len() + data);
        for w in [MAGIC, VERSION, self.options.len() as u32, self.inputs.len() as u32, self.info_log, self.error_log] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        put_options(&mut out, &self.options);
        for i in &self.inputs {
            for w in [i.kind, i.options.len() as u32, i.name.len() as u32, 0] {
                out.extend_from_slice(&w.to_le_bytes());
            }
            out.extend_from_slice(&(i.data.len() as u64).to_le_bytes());
            put_options(&mut out, &i.options);
            out.extend_from_slice(i.name);
            out.extend_from_slice(i.data);
        }
        out
    }
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], LinkDecodeError> {
        if self.rest.len() < n {
            return Err(LinkDecodeError::Truncated(what));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, LinkDecodeError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, LinkDecodeError> {
        let lo = self.u32(what)? as u64;
        let hi = self.u32(what)? as u64;
        Ok(lo | hi << 32)
    }

    fn options(&mut self, count: u32) -> Result<Vec<(i32, u64)>, LinkDecodeError> {
        if count as usize > MAX_OPTIONS {
            return Err(LinkDecodeError::TooLarge("the option count"));
        }
        (0..count)
            .map(|_| {
                let o = self.u32("an option")? as i32;
                self.u32("an option")?;
                let v = self.u64("an option")?;
                if carried_option(o) { Ok((o, v)) } else { Err(LinkDecodeError::Option(o)) }
            })
            .collect()
    }
}

/// Reads what [`LinkInputs::encode`] wrote, checking every count and length against the
/// request and Phos's limits.
pub fn decode(bytes: &[u8]) -> Result<LinkInputs<'_>, LinkDecodeError> {
    let mut r = Reader { rest: bytes };
    if r.u32("the header")? != MAGIC || r.u32("the header")? != VERSION {
        return Err(LinkDecodeError::Header);
    }
    let (options, inputs) = (r.u32("the header")?, r.u32("the header")?);
    let (info_log, error_log) = (r.u32("the header")?.min(MAX_LOG), r.u32("the header")?.min(MAX_LOG));
    let options = r.options(options)?;
    if inputs as usize > MAX_INPUTS {
        return Err(LinkDecodeError::TooLarge("the input count"));
    }
    let mut list = Vec::new();
    let mut total = 0u64;
    for _ in 0..inputs {
        let kind = r.u32("an input")?;
        let (options, name_len) = (r.u32("an input")?, r.u32("an input")? as usize);
        r.u32("an input")?;
        let len = r.u64("an input")?;
        total = total.saturating_add(len);
        if total > MAX_INPUT_BYTES {
            return Err(LinkDecodeError::TooLarge("the inputs' size"));
        }
        if name_len > MAX_NAME {
            return Err(LinkDecodeError::TooLarge("an input's name"));
        }
        let options = r.options(options)?;
        let name = r.take(name_len, "an input's name")?;
        let data = r.take(len as usize, "an input's bytes")?;
        list.push(Input { kind, name, options, data });
    }
    if !r.rest.is_empty() {
        return Err(LinkDecodeError::Trailing(r.rest.len()));
    }
    Ok(LinkInputs { options, info_log, error_log, inputs: list })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_travel_and_hostile_ones_are_refused() {
        let inputs = LinkInputs {
            options: vec![(7, 3), (12, 1)],
            info_log: 1024,
            error_log: 2048,
            inputs: vec![
                Input { kind: input_type::PTX, name: b"a.ptx", options: vec![(0, 32)], data: b".version 7.0\0" },
                Input { kind: input_type::CUBIN, name: b"", options: vec![], data: b"\x7fELF" },
            ],
        };
        let bytes = inputs.encode();
        assert_eq!(decode(&bytes).unwrap(), inputs);
        // Cut anywhere: refused, never a panic or an allocation of the claimed size.
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err(), "cut at {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(decode(&longer), Err(LinkDecodeError::Trailing(1)));
        // A host pointer option (CU_JIT_INFO_LOG_BUFFER) is not carried.
        let mut pointer = inputs.clone();
        pointer.options.push((3, 0x1234));
        assert_eq!(decode(&pointer.encode()), Err(LinkDecodeError::Option(3)));
        // A length beyond the bound is refused before anything is read.
        let mut huge = bytes.clone();
        let at = 24 + 32 + 16; // the first input's data length
        huge[at..at + 8].copy_from_slice(&(MAX_INPUT_BYTES + 1).to_le_bytes());
        assert_eq!(decode(&huge), Err(LinkDecodeError::TooLarge("the inputs' size")));
    }
}
