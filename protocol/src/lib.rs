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

pub mod error;
pub mod eval;
pub mod frame;
pub mod handshake;
pub mod host_arena;
pub mod limits;
pub mod log_limit;
pub mod shm;
pub mod spec;
pub mod staging;
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

/// Decode a request, borrowing its buffers from `payload`. Trailing bytes are an error.
pub fn decode_request<'a, T: bincode::BorrowDecode<'a, ()>>(
    payload: &'a [u8],
) -> Result<T, bincode::error::DecodeError> {
    let (value, used) = bincode::borrow_decode_from_slice(payload, bincode_config())?;
    if used != payload.len() {
        return Err(bincode::error::DecodeError::OtherString(format!(
            "{} trailing bytes after the message",
            payload.len() - used
        )));
    }
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
pub fn decode<T: bincode::Decode<()>>(payload: &[u8]) -> Result<T, bincode::error::DecodeError> {
    let (value, used) = bincode::decode_from_slice(payload, bincode_config())?;
    if used != payload.len() {
        return Err(bincode::error::DecodeError::OtherString(format!(
            "{} trailing bytes after the message",
            payload.len() - used
        )));
    }
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
