//! Tensor maps (`cuTensorMapEncodeTiled`, `...Im2col`, `...Im2colWide`): the arguments as
//! the guest sends them to the server (`phosTensorMapEncode`), the checks the driver's
//! reference documents for them, and Phos's own 128-byte encoding, which the `emu` backend
//! hands out (a GPU's driver encodes its own).

/// `CUtensorMapDataType`: UINT8 ... TFLOAT32_FTZ, and CUDA 12.8's packed 4 and 6-bit types.
pub const DATA_TYPES: u32 = 16;
/// `CU_TENSOR_MAP_INTERLEAVE_NONE`, `_16B`, `_32B`.
pub const INTERLEAVE_NONE: u32 = 0;
pub const INTERLEAVE_32B: u32 = 2;
/// `CU_TENSOR_MAP_SWIZZLE_NONE` ... `_128B`, and CUDA 12.8's 128-byte atom forms.
pub const SWIZZLE_NONE: u32 = 0;
const SWIZZLES: u32 = 7;
const L2_PROMOTIONS: u32 = 4;
const OOB_FILL_NAN: u32 = 1;
/// The size of a `CUtensorMap`.
pub const SIZE: usize = 128;
const MAGIC: u32 = 0x414D_5450; // "PTMA"
const PARAMS: usize = 192;

/// Which encode call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Tiled,
    Im2col,
    Im2colWide,
}

/// One encode call's arguments; arrays past the rank are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub kind: Kind,
    pub data_type: u32,
    pub rank: u32,
    pub address: u64,
    pub dims: [u64; 5],
    /// `rank - 1` strides, of dimensions 1 and up, in bytes.
    pub strides: [u64; 4],
    /// Tiled: the box.
    pub box_dim: [u32; 5],
    pub element_strides: [u32; 5],
    pub interleave: u32,
    pub swizzle: u32,
    pub l2_promotion: u32,
    pub oob_fill: u32,
    /// Im2col: the corners of the bounding box (`rank - 2` each); wide: width only, in [0].
    pub lower: [i32; 3],
    pub upper: [i32; 3],
    pub channels_per_pixel: u32,
    pub pixels_per_column: u32,
    /// Im2colWide: `CUtensorMapIm2ColWideMode`.
    pub mode: u32,
}

/// Size in bytes of an element of each `CUtensorMapDataType` (the packed types count 16
/// elements of 4 or 6 bits as their 8 or 16-byte units: a byte each, for the checks here).
pub fn element_size(data_type: u32) -> Option<u64> {
    Some(match data_type {
        0 => 1,
        1 | 6 | 9 => 2,
        2 | 3 | 7 | 10 | 11 | 12 => 4,
        4 | 5 | 8 => 8,
        13..=15 => 1,
        _ => return None,
    })
}

fn floating(data_type: u32) -> bool {
    matches!(data_type, 6..=12)
}

impl Params {
    /// The fixed layout the guest sends.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(PARAMS);
        let kind = match self.kind {
            Kind::Tiled => 0u32,
            Kind::Im2col => 1,
            Kind::Im2colWide => 2,
        };
        for w in [kind, self.data_type, self.rank, 0] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b.extend_from_slice(&self.address.to_le_bytes());
        for d in self.dims {
            b.extend_from_slice(&d.to_le_bytes());
        }
        for s in self.strides {
            b.extend_from_slice(&s.to_le_bytes());
        }
        for w in self.box_dim.iter().chain(&self.element_strides) {
            b.extend_from_slice(&w.to_le_bytes());
        }
        for w in [self.interleave, self.swizzle, self.l2_promotion, self.oob_fill] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        for c in self.lower.iter().chain(&self.upper) {
            b.extend_from_slice(&c.to_le_bytes());
        }
        for w in [self.channels_per_pixel, self.pixels_per_column, self.mode] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b.resize(PARAMS, 0);
        b
    }

    /// What [`encode`](Params::encode) wrote; `None` for anything else.
    pub fn decode(b: &[u8]) -> Option<Params> {
        if b.len() != PARAMS {
            return None;
        }
        let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let u64_at = |at: usize| u32_at(at) as u64 | (u32_at(at + 4) as u64) << 32;
        let kind = match u32_at(0) {
            0 => Kind::Tiled,
            1 => Kind::Im2col,
            2 => Kind::Im2colWide,
            _ => return None,
        };
        Some(Params {
            kind,
            data_type: u32_at(4),
            rank: u32_at(8),
            address: u64_at(16),
            dims: std::array::from_fn(|i| u64_at(24 + 8 * i)),
            strides: std::array::from_fn(|i| u64_at(64 + 8 * i)),
            box_dim: std::array::from_fn(|i| u32_at(96 + 4 * i)),
            element_strides: std::array::from_fn(|i| u32_at(116 + 4 * i)),
            interleave: u32_at(136),
            swizzle: u32_at(140),
            l2_promotion: u32_at(144),
            oob_fill: u32_at(148),
            lower: std::array::from_fn(|i| u32_at(152 + 4 * i) as i32),
            upper: std::array::from_fn(|i| u32_at(164 + 4 * i) as i32),
            channels_per_pixel: u32_at(176),
            pixels_per_column: u32_at(180),
            mode: u32_at(184),
        })
    }

    /// The driver reference's rules for the arguments: `Err` names the first one broken
    /// (the driver answers `CUDA_ERROR_INVALID_VALUE`).
    pub fn check(&self) -> Result<(), &'static str> {
        let rank = self.rank as usize;
        let esize = element_size(self.data_type).ok_or("tensorDataType")?;
        let min_rank = if self.kind == Kind::Tiled { 1 } else { 3 };
        if !(min_rank..=5).contains(&rank) {
            return Err("tensorRank");
        }
        if self.interleave > INTERLEAVE_32B {
            return Err("interleave");
        }
        if self.interleave != INTERLEAVE_NONE && rank < 3 {
            return Err("tensorRank with interleave");
        }
        let align = if self.interleave == INTERLEAVE_32B { 32 } else { 16 };
        if !self.address.is_multiple_of(align) {
            return Err("globalAddress alignment");
        }
        if self.dims[..rank].iter().any(|&d| d == 0 || d > 1 << 32) {
            return Err("globalDim");
        }
        let stride_align = if self.interleave == INTERLEAVE_32B { 32 } else { 16 };
        if self.strides[..rank - 1].iter().any(|&s| !s.is_multiple_of(stride_align) || s >= 1 << 40) {
            return Err("globalStrides");
        }
        if self.element_strides[..rank].iter().any(|&e| e == 0 || e > 8) {
            return Err("elementStrides");
        }
        if self.swizzle >= SWIZZLES {
            return Err("swizzle");
        }
        if self.l2_promotion >= L2_PROMOTIONS {
            return Err("l2Promotion");
        }
        if self.oob_fill > OOB_FILL_NAN || (self.oob_fill == OOB_FILL_NAN && !floating(self.data_type)) {
            return Err("oobFill");
        }
        // The bytes of the box's inner dimension (im2col: a pixel's channels).
        let inner = match self.kind {
            Kind::Tiled => {
                if self.box_dim[..rank].iter().any(|&b| b == 0 || b > 256) {
                    return Err("boxDim");
                }
                self.box_dim[0] as u64 * esize
            }
            Kind::Im2col | Kind::Im2colWide => {
                if !(1..=256).contains(&self.channels_per_pixel) {
                    return Err("channelsPerPixel");
                }
                if !(1..=1024).contains(&self.pixels_per_column) {
                    return Err("pixelsPerColumn");
                }
                let range = match rank {
                    3 => -32768..=32767,
                    4 => -128..=127,
                    _ => -16..=15,
                };
                let corners = if self.kind == Kind::Im2col { rank - 2 } else { 1 };
                if self.lower[..corners].iter().chain(&self.upper[..corners]).any(|c| !range.contains(c)) {
                    return Err("pixelBox corners");
                }
                if self.kind == Kind::Im2colWide && (self.mode > 1 || self.interleave != INTERLEAVE_NONE) {
                    return Err("mode");
                }
                self.channels_per_pixel as u64 * esize
            }
        };
        if self.interleave == INTERLEAVE_NONE {
            if !inner.is_multiple_of(16) {
                return Err("the inner box dimension in bytes");
            }
            let span = match self.swizzle {
                0 => u64::MAX,
                1 => 32,
                2 => 64,
                _ => 128,
            };
            if inner > span {
                return Err("swizzle span");
            }
        }
        Ok(())
    }

    /// Phos's own 128 bytes for these (checked) arguments: what `emu` hands out, which
    /// [`PhosMap::read`] reads back.
    pub fn phos_encoding(&self) -> [u8; SIZE] {
        let mut m = [0u8; SIZE];
        m[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        m[4] = self.kind as u8;
        m[5] = self.rank as u8;
        m[6] = self.data_type as u8;
        m[7] = self.interleave as u8;
        m[8] = self.swizzle as u8;
        m[9] = self.l2_promotion as u8;
        m[10] = self.oob_fill as u8;
        m[11] = self.mode as u8;
        m[12..14].copy_from_slice(&(self.channels_per_pixel as u16).to_le_bytes());
        m[14..16].copy_from_slice(&(self.pixels_per_column as u16).to_le_bytes());
        m[16..24].copy_from_slice(&self.address.to_le_bytes());
        for i in 0..5 {
            // Dimensions are 1 to 2^32: one less fits 32 bits.
            let d = self.dims[i].saturating_sub(1) as u32;
            m[24 + 4 * i..28 + 4 * i].copy_from_slice(&d.to_le_bytes());
        }
        for i in 0..4 {
            m[44 + 8 * i..52 + 8 * i].copy_from_slice(&self.strides[i].to_le_bytes());
        }
        for i in 0..5 {
            m[76 + 2 * i..78 + 2 * i].copy_from_slice(&(self.box_dim[i] as u16).to_le_bytes());
            m[86 + i] = self.element_strides[i] as u8;
        }
        for i in 0..3 {
            m[92 + 4 * i..96 + 4 * i].copy_from_slice(&self.lower[i].to_le_bytes());
            m[104 + 4 * i..108 + 4 * i].copy_from_slice(&self.upper[i].to_le_bytes());
        }
        m
    }
}

/// A tensor map of Phos's encoding, read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhosMap {
    pub interleave: u32,
    pub address: u64,
}

impl PhosMap {
    pub fn read(m: &[u8; SIZE]) -> Option<PhosMap> {
        if m[0..4] != MAGIC.to_le_bytes() {
            return None;
        }
        Some(PhosMap { interleave: m[7] as u32, address: u64::from_le_bytes(m[16..24].try_into().ok()?) })
    }

    /// `cuTensorMapReplaceAddress` on Phos's encoding.
    pub fn replace_address(m: &mut [u8; SIZE], address: u64) -> Result<(), &'static str> {
        let map = PhosMap::read(m).ok_or("not a tensor map")?;
        let align = if map.interleave == INTERLEAVE_32B { 32 } else { 16 };
        if !address.is_multiple_of(align) {
            return Err("globalAddress alignment");
        }
        m[16..24].copy_from_slice(&address.to_le_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiled() -> Params {
        Params {
            kind: Kind::Tiled,
            data_type: 7, // FLOAT32
            rank: 2,
            address: 0x7000_0000_0100,
            dims: [64, 32, 0, 0, 0],
            strides: [256, 0, 0, 0],
            box_dim: [32, 8, 0, 0, 0],
            element_strides: [1, 1, 0, 0, 0],
            interleave: 0,
            swizzle: 3,
            l2_promotion: 2,
            oob_fill: 0,
            lower: [0; 3],
            upper: [0; 3],
            channels_per_pixel: 0,
            pixels_per_column: 0,
            mode: 0,
        }
    }

    #[test]
    fn arguments_travel_and_are_checked_as_the_driver_documents() {
        let p = tiled();
        assert_eq!(Params::decode(&p.encode()), Some(p));
        assert_eq!(p.check(), Ok(()));
        let broken = |f: &dyn Fn(&mut Params)| {
            let mut q = tiled();
            f(&mut q);
            q.check()
        };
        assert_eq!(broken(&|q| q.rank = 0), Err("tensorRank"));
        assert_eq!(broken(&|q| q.rank = 6), Err("tensorRank"));
        assert_eq!(broken(&|q| q.address += 8), Err("globalAddress alignment"));
        assert_eq!(broken(&|q| q.strides[0] = 100), Err("globalStrides"));
        assert_eq!(broken(&|q| q.strides[0] = 1 << 40), Err("globalStrides"));
        assert_eq!(broken(&|q| q.dims[1] = 0), Err("globalDim"));
        assert_eq!(broken(&|q| q.box_dim[1] = 257), Err("boxDim"));
        assert_eq!(broken(&|q| q.element_strides[0] = 9), Err("elementStrides"));
        assert_eq!(broken(&|q| q.box_dim[0] = 3), Err("the inner box dimension in bytes"));
        assert_eq!(broken(&|q| q.swizzle = 1), Err("swizzle span"), "128 inner bytes over a 32-byte swizzle");
        assert_eq!(broken(&|q| q.interleave = 1), Err("tensorRank with interleave"));
        assert_eq!(broken(&|q| q.data_type = 99), Err("tensorDataType"));
        assert_eq!(broken(&|q| q.data_type = 3), Ok(()), "INT32 with zero fill");
        assert_eq!(
            broken(&|q| {
                q.data_type = 3;
                q.oob_fill = 1
            }),
            Err("oobFill")
        );
    }

    #[test]
    fn phos_maps_keep_their_address_and_replace_it() {
        let mut m = tiled().phos_encoding();
        assert_eq!(PhosMap::read(&m).unwrap().address, 0x7000_0000_0100);
        assert_eq!(PhosMap::replace_address(&mut m, 0x7000_0000_0208), Err("globalAddress alignment"));
        PhosMap::replace_address(&mut m, 0x7000_0000_0200).unwrap();
        assert_eq!(PhosMap::read(&m).unwrap().address, 0x7000_0000_0200);
        assert!(PhosMap::read(&[0; SIZE]).is_none());
    }
}
