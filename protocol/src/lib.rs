//! The Phos wire protocol, shared by the guest library, the router and the API server.
//!
//! A connection carries **frames**: a fixed 48-byte [`FrameHeader`] (session, call id, API and
//! function id, device, status) followed by a payload encoded with `bincode` 2. Calls and
//! replies carry the request/reply structs that `phos-codegen` generates from each API's spec
//! into a module of its own ([`cudart`] from `spec/cudart.lapis`, [`cuda`] from
//! `spec/cuda.lapis`); [`apis`] is what they share. The session handshake carries
//! [`handshake`] messages. Frames travel over a [`Transport`](transport::Transport).
//!
//! Nothing received is trusted: [`decode_request`] borrows buffers straight out of the
//! payload (no allocation sized by the peer), and the server's generated dispatch re-checks
//! every size and pointer against the spec before a call runs.

pub mod blas;
pub mod bypass;
pub mod call_profile;
pub mod dnn;
pub mod error;
pub mod eval;
pub mod fd_table;
pub mod frame;
pub mod handle_tag;
pub mod handshake;
pub mod host_arena;
pub mod jit_link;
pub mod limits;
pub mod log_limit;
pub(crate) mod ring;
pub mod shared;
pub mod shm;
pub mod spec;
pub mod staging;
pub mod tensor_map;
pub mod text;
pub mod transport;
pub mod types;

// The spec-generated module of each API (`cudart`, `cuda`: its `FunctionId`, one
// `…Request`/`…Reply` pair per remote function, its status type, errors and constants) and
// `apis`, what they share.
include!(concat!(env!("OUT_DIR"), "/apis.rs"));

/// The runtime API's status, which the runtime's guest and server code use throughout.
pub use cudart::CudaError;
pub use error::{ApiStatus, Failure, Rejection};
pub use eval::EvalError;
pub use frame::{FrameHeader, FrameKind};

use bincode::config::{Configuration, Fixint, Limit, LittleEndian};
use bincode::de::read::{BorrowReader, Reader};
use bincode::de::{Decoder, DecoderImpl};
use bincode::error::DecodeError;

/// A host pointer argument whose shape the spec chooses per call (`cudaMemcpy`'s `dst` is a
/// device address for one copy kind and host memory to fill for another).
#[derive(Debug, Clone, Copy, PartialEq, Eq, bincode::Encode, bincode::BorrowDecode)]
pub enum Ptr<'a> {
    /// A device address.
    Device(u64),
    /// Host data sent to the server.
    In(&'a [u8]),
    /// Host memory of this many bytes that the server fills (sent back in the reply).
    Out(u64),
    /// Host data sent to the server and sent back changed.
    InOut(&'a [u8]),
}

/// A request type and the reply it gets; implemented by the generated request structs.
pub trait RemoteCall: bincode::Encode {
    /// The function (its API and id: the frame header's fields).
    const FUNCTION: apis::Function;
    type Reply: bincode::Decode<()> + bincode::Encode + Default;
    /// The status type of the function's API.
    type Status: ApiStatus;
}

/// Largest payload a frame may carry unless a transport is configured otherwise.
pub const DEFAULT_MAX_PAYLOAD: u64 = 4 << 30;

type Config = Configuration<LittleEndian, Fixint, Limit<{ DEFAULT_MAX_PAYLOAD as usize }>>;

/// The one bincode configuration both ends use: fixed-width little-endian integers, and a
/// decode limit so that no length prefix can make a decoder allocate past a frame's size.
pub const fn bincode_config() -> Config {
    bincode::config::standard()
        .with_little_endian()
        .with_fixed_int_encoding()
        .with_limit::<{ DEFAULT_MAX_PAYLOAD as usize }>()
}

/// Decoding a message may allocate at most this many times its size (plus
/// [`DECODE_MEMORY_FLOOR`]). bincode charges a container's `length × size_of::<T>()` against its
/// decode limit before it allocates it, and the length is the sender's word: with the limit
/// alone (4 GiB), eight bytes claiming a long string cost 4 GiB. No message of the protocol
/// takes more than a few times its encoded size (a `Vec<String>` of empty strings, 24 bytes
/// for each 8 sent, is the worst), so the rest of the limit is claimed before decoding
/// starts.
const DECODE_MEMORY_FACTOR: usize = 4;
/// See [`DECODE_MEMORY_FACTOR`].
const DECODE_MEMORY_FLOOR: usize = 4096;

/// A decoder over `payload` that may allocate only what [`DECODE_MEMORY_FACTOR`] allows.
fn bounded_decoder(payload: &[u8]) -> Result<DecoderImpl<PayloadReader<'_>, Config, ()>, DecodeError> {
    let mut decoder = DecoderImpl::new(PayloadReader(payload), bincode_config(), ());
    let budget = payload.len().saturating_mul(DECODE_MEMORY_FACTOR).saturating_add(DECODE_MEMORY_FLOOR);
    decoder.claim_bytes_read((DEFAULT_MAX_PAYLOAD as usize).saturating_sub(budget))?;
    Ok(decoder)
}

/// The bytes of a message not decoded yet.
struct PayloadReader<'a>(&'a [u8]);

impl Reader for PayloadReader<'_> {
    fn read(&mut self, bytes: &mut [u8]) -> Result<(), DecodeError> {
        let Some((head, rest)) = self.0.split_at_checked(bytes.len()) else {
            return Err(DecodeError::UnexpectedEnd { additional: bytes.len() - self.0.len() });
        };
        bytes.copy_from_slice(head);
        self.0 = rest;
        Ok(())
    }

    fn peek_read(&mut self, n: usize) -> Option<&[u8]> {
        self.0.get(..n)
    }

    fn consume(&mut self, n: usize) {
        self.0 = self.0.get(n..).unwrap_or_default();
    }
}

impl<'a> BorrowReader<'a> for PayloadReader<'a> {
    fn take_bytes(&mut self, length: usize) -> Result<&'a [u8], DecodeError> {
        let Some((head, rest)) = self.0.split_at_checked(length) else {
            return Err(DecodeError::UnexpectedEnd { additional: length - self.0.len() });
        };
        self.0 = rest;
        Ok(head)
    }
}

/// Refuse what is left after a message.
fn no_trailing_bytes(decoder: &mut DecoderImpl<PayloadReader<'_>, Config, ()>) -> Result<(), DecodeError> {
    match decoder.reader().0.len() {
        0 => Ok(()),
        n => Err(DecodeError::OtherString(format!("{n} trailing bytes after the message"))),
    }
}

/// Decode a request, borrowing its buffers from `payload`. Trailing bytes are an error.
pub fn decode_request<'a, T: bincode::BorrowDecode<'a, ()>>(payload: &'a [u8]) -> Result<T, DecodeError> {
    let mut decoder = bounded_decoder(payload)?;
    let value = T::borrow_decode(&mut decoder)?;
    no_trailing_bytes(&mut decoder)?;
    Ok(value)
}

/// Encode a request or reply, appending to `out`.
pub fn encode_reply<T: bincode::Encode>(value: &T, out: &mut Vec<u8>) {
    // Writing into a Vec cannot fail.
    bincode::encode_into_std_write(value, out, bincode_config()).expect("encoding into a Vec");
}

/// Encode a message into a fresh buffer.
pub fn encode<T: bincode::Encode>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    encode_reply(value, &mut out);
    out
}

/// Decode an owned message (replies, handshake messages). Trailing bytes are an error.
pub fn decode<T: bincode::Decode<()>>(payload: &[u8]) -> Result<T, DecodeError> {
    let mut decoder = bounded_decoder(payload)?;
    let value = T::decode(&mut decoder)?;
    no_trailing_bytes(&mut decoder)?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudart::*;

    #[test]
    fn request_round_trip_borrows_buffers() {
        let data = vec![7u8; 1000];
        let req = CudaMemcpyRequest {
            dst: Ptr::Device(0x6000_0000_0000),
            src: Ptr::In(&data),
            count: 1000,
            kind: 1,
            direction: 1,
        };
        let bytes = encode(&req);
        let back: CudaMemcpyRequest<'_> = decode_request(&bytes).unwrap();
        assert_eq!(back.dst, req.dst);
        assert_eq!(back.count, 1000);
        match back.src {
            Ptr::In(b) => {
                assert_eq!(b, &data[..]);
                // Zero copy: the slice points into the payload.
                let range = bytes.as_ptr_range();
                assert!(range.contains(&b.as_ptr()));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reply_round_trip() {
        let reply = CudaMemGetInfoReply { free: 1 << 30, total: 80 << 30 };
        let back: CudaMemGetInfoReply = decode(&encode(&reply)).unwrap();
        assert_eq!(back, reply);
    }

    #[test]
    fn truncated_and_trailing_payloads_are_refused() {
        let req = CudaMallocRequest { size: 4096 };
        let mut bytes = encode(&req);
        assert!(decode_request::<CudaMallocRequest>(&bytes[..bytes.len() - 1]).is_err());
        bytes.push(0);
        assert!(decode_request::<CudaMallocRequest>(&bytes).is_err());
    }

    #[test]
    fn a_huge_length_prefix_does_not_allocate() {
        // A Ptr::In whose length prefix claims far more than the payload holds.
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&1u32.to_le_bytes()); // variant In
        bytes.extend_from_slice(&(u64::MAX / 2).to_le_bytes());
        bytes.extend_from_slice(&[0u8; 16]);
        assert!(decode_request::<Ptr<'_>>(&bytes).is_err());
    }

    #[test]
    fn a_length_prefix_cannot_make_a_decoder_allocate() {
        use handshake::{Attach, Hello, TransportKind};
        // An `Attach` whose tenant claims 4 GiB in a 50-byte message (found by the
        // `handshake` fuzz target): refused before anything is allocated, where the 4 GiB
        // decode limit alone let bincode allocate the string first and find it missing after.
        let attach = Attach {
            // No APIs: the tenant's length prefix sits right after the session id.
            apis: Vec::new(),
            session: 3,
            tenant: "uid:1000".into(),
            abi_major: 12,
            transport: TransportKind::Unix,
        };
        let mut bytes = encode(&attach);
        bytes[16..24].copy_from_slice(&0xfd00_0008u64.to_le_bytes());
        assert!(matches!(decode::<Attach>(&bytes), Err(bincode::error::DecodeError::LimitExceeded)));
        // A guest's `Hello` (of no APIs, so the offsets are the fields') listing a billion
        // transports.
        let hello = Hello {
            apis: Vec::new(),
            pid: 1,
            abi_major: 12,
            token: None,
            program: String::new(),
            transports: vec![TransportKind::Shm],
            tenant_token: None,
            host_arena: None,
        };
        let mut bytes = encode(&hello);
        let at = 8 + 4 + 4 + 1 + 8;
        assert_eq!(bytes[at..at + 8], 1u64.to_le_bytes());
        bytes[at..at + 8].copy_from_slice(&(1u64 << 30).to_le_bytes());
        assert!(matches!(decode::<Hello>(&bytes), Err(bincode::error::DecodeError::LimitExceeded)));
    }

    #[test]
    fn messages_larger_in_memory_than_on_the_wire_still_decode() {
        // 16 bytes in memory for each 12 sent.
        let report =
            handshake::UsageReport { held: (0..10_000).map(|i| (i, u64::from(i))).collect(), ..Default::default() };
        assert_eq!(decode::<handshake::UsageReport>(&encode(&report)).unwrap(), report);
        let reply = CudaMemcpyReply { dst: Some(vec![5; 1 << 20]) };
        assert_eq!(decode::<CudaMemcpyReply>(&encode(&reply)).unwrap(), reply);
    }

    #[test]
    fn function_ids_are_the_specs_and_named() {
        for f in FunctionId::ALL {
            assert_eq!(FunctionId::from_u32(*f as u32), Some(*f));
            assert_eq!(f.info().id, *f as u32);
        }
        assert_eq!(FunctionId::CudaMalloc.name(), "cudaMalloc");
        let max = FunctionId::ALL.iter().map(|f| *f as u32).max().unwrap();
        assert!(FunctionId::from_u32(max + 1).is_none());
        for &(id, _) in RETIRED {
            assert!(FunctionId::from_u32(id).is_none(), "retired id {id} names a function");
        }
        for f in crate::cuda::FunctionId::ALL {
            let any = apis::Function::Cuda(*f);
            assert_eq!(apis::Function::from_wire(crate::cuda::API_ID, *f as u32), Some(any));
            assert_eq!(any.api(), apis::Api::Cuda);
        }
        assert_eq!(
            apis::Function::from_wire(0, FunctionId::CudaMalloc as u32),
            Some(apis::Function::Cudart(FunctionId::CudaMalloc))
        );
        assert_eq!(apis::Function::from_wire(u16::MAX, 0), None);
    }

    /// The driver API's streams are the runtime's: one handle kind, one tag.
    #[test]
    fn apis_share_handle_kinds() {
        assert_eq!(apis::HandleKind::from_name("stream").map(|k| k.id()), Some(7));
        assert_eq!(apis::HandleKind::ALL.iter().filter(|k| k.name() == "stream").count(), 1);
    }

    #[test]
    fn error_table_matches_constants() {
        assert_eq!(CudaError::InvalidValue.0, 1);
        assert_eq!(CudaError::InvalidValue.name(), "cudaErrorInvalidValue");
        assert_eq!(CudaError::InvalidValue.text(12), "invalid argument");
        assert_eq!(CudaError(27).text(11), "read as normalized float not supported for 32-bit non float type");
        assert_eq!(CudaError(27).text(13), "read as normalized float not supported for data type");
        assert_eq!(NOT_SUPPORTED, CudaError::NotSupported);
    }
}
