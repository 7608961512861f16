//! Texture and surface objects as the interpreter sees them, and CUDA's rules for sampling them.
//!
//! A kernel names a texture or surface by a 64-bit handle (`cudaTextureObject_t`, `cudaSurfaceObject_t`). The
//! backend resolves handles through [`Resources`] to descriptors defined here: a [`Texture`] is a [`Resource`] (a CUDA
//! array, a mipmapped array, linear memory or pitched 2D memory) and a [`TextureDesc`] (addressing, filtering, read
//! mode...); a [`Surface`] is a CUDA array. Texels live in memory the backend maps in this process, described by
//! [`Level`]s (a base address and pitches per mip level), and every texel access is checked against
//! [`super::GlobalMemory`] like any global access.
//!
//! Sampling follows the texture-fetching appendix of the CUDA C++ Programming Guide; see the module documentation of
//! [`super`] for the rules and for what the interpreter chose where CUDA leaves a result to the hardware.

use std::collections::HashMap;
use std::sync::Arc;

use super::float::{self, Rnd};
use super::machine::Fault;

/// The type of one channel of a texel: CUDA's channel kind (signed, unsigned, float) with its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChannelType {
    U8,
    U16,
    U32,
    S8,
    S16,
    S32,
    F16,
    F32,
}

impl ChannelType {
    /// Bytes of one channel.
    pub fn bytes(self) -> u32 {
        match self {
            ChannelType::U8 | ChannelType::S8 => 1,
            ChannelType::U16 | ChannelType::S16 | ChannelType::F16 => 2,
            ChannelType::U32 | ChannelType::S32 | ChannelType::F32 => 4,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, ChannelType::F16 | ChannelType::F32)
    }

    pub fn is_signed(self) -> bool {
        matches!(self, ChannelType::S8 | ChannelType::S16 | ChannelType::S32)
    }
}

/// A texel format: 1, 2 or 4 channels of one type (CUDA has no 3-channel arrays or textures).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChannelFormat {
    pub ty: ChannelType,
    pub channels: u8,
}

impl ChannelFormat {
    pub fn new(ty: ChannelType, channels: u8) -> Result<ChannelFormat, TextureError> {
        if !matches!(channels, 1 | 2 | 4) {
            return Err(TextureError::ChannelFormat(format!("{channels} channels (1, 2 or 4)")));
        }
        Ok(ChannelFormat { ty, channels })
    }

    /// From CUDA's `cudaChannelFormatDesc`: bits per channel `x, y, z, w` and `f` (`cudaChannelFormatKind`: 0 signed,
    /// 1 unsigned, 2 float).
    pub fn from_cuda(x: i32, y: i32, z: i32, w: i32, kind: i32) -> Result<ChannelFormat, TextureError> {
        let bad = || TextureError::ChannelFormat(format!("{{{x}, {y}, {z}, {w}}} bits of kind {kind}"));
        let bits = [x, y, z, w];
        let channels = bits.iter().take_while(|&&b| b != 0).count();
        if channels == 0 || bits[channels..].iter().any(|&b| b != 0) || bits[..channels].iter().any(|&b| b != x) {
            return Err(bad());
        }
        let ty = match (kind, x) {
            (0, 8) => ChannelType::S8,
            (0, 16) => ChannelType::S16,
            (0, 32) => ChannelType::S32,
            (1, 8) => ChannelType::U8,
            (1, 16) => ChannelType::U16,
            (1, 32) => ChannelType::U32,
            (2, 16) => ChannelType::F16,
            (2, 32) => ChannelType::F32,
            _ => return Err(bad()),
        };
        ChannelFormat::new(ty, channels as u8).map_err(|_| bad())
    }

    /// From the driver API's `CUarray_format` and channel count.
    pub fn from_driver(format: u32, channels: u32) -> Result<ChannelFormat, TextureError> {
        let ty = match format {
            0x01 => ChannelType::U8,
            0x02 => ChannelType::U16,
            0x03 => ChannelType::U32,
            0x08 => ChannelType::S8,
            0x09 => ChannelType::S16,
            0x0a => ChannelType::S32,
            0x10 => ChannelType::F16,
            0x20 => ChannelType::F32,
            _ => return Err(TextureError::ChannelFormat(format!("CUarray_format {format:#x}"))),
        };
        ChannelFormat::new(ty, u8::try_from(channels).unwrap_or(0))
    }

    /// Bytes of one texel.
    pub fn element_size(self) -> u32 {
        self.ty.bytes() * self.channels as u32
    }
}

/// What a coordinate outside the texture reads (CUDA's `cudaTextureAddressMode`, same values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AddressMode {
    #[default]
    Wrap = 0,
    Clamp = 1,
    Mirror = 2,
    Border = 3,
}

impl AddressMode {
    pub fn from_cuda(v: i32) -> Result<AddressMode, TextureError> {
        Ok(match v {
            0 => AddressMode::Wrap,
            1 => AddressMode::Clamp,
            2 => AddressMode::Mirror,
            3 => AddressMode::Border,
            _ => return Err(TextureError::Descriptor(format!("address mode {v}"))),
        })
    }
}

/// CUDA's `cudaTextureFilterMode` (same values); also the mipmap filter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FilterMode {
    #[default]
    Point = 0,
    Linear = 1,
}

impl FilterMode {
    pub fn from_cuda(v: i32) -> Result<FilterMode, TextureError> {
        match v {
            0 => Ok(FilterMode::Point),
            1 => Ok(FilterMode::Linear),
            _ => Err(TextureError::Descriptor(format!("filter mode {v}"))),
        }
    }
}

/// CUDA's `cudaTextureReadMode` (same values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ReadMode {
    /// Texels as stored: integers as integers, `f16` widened to `f32`.
    #[default]
    ElementType = 0,
    /// 8- and 16-bit integers mapped to [0, 1] (unsigned) or [-1, 1] (signed).
    NormalizedFloat = 1,
}

impl ReadMode {
    pub fn from_cuda(v: i32) -> Result<ReadMode, TextureError> {
        match v {
            0 => Ok(ReadMode::ElementType),
            1 => Ok(ReadMode::NormalizedFloat),
            _ => Err(TextureError::Descriptor(format!("read mode {v}"))),
        }
    }
}

/// How a texture is sampled: CUDA's `cudaTextureDesc`. `Default` is a zero-filled `cudaTextureDesc`.
///
/// `max_anisotropy` is kept for queries but sampling is isotropic, and `seamless_cubemap` is kept but cubemap lookups
/// do not filter across faces.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TextureDesc {
    /// Per dimension (x, y, z).
    pub address: [AddressMode; 3],
    pub filter: FilterMode,
    pub read: ReadMode,
    /// Convert 8-bit unsigned normalized R, G, B channels from sRGB to linear.
    pub srgb: bool,
    /// Returned for `Border` addressing outside the texture (its bits, for textures returning integers).
    pub border_color: [f32; 4],
    pub normalized_coords: bool,
    pub max_anisotropy: u32,
    pub mipmap_filter: FilterMode,
    pub mipmap_level_bias: f32,
    pub min_mipmap_level_clamp: f32,
    pub max_mipmap_level_clamp: f32,
    pub seamless_cubemap: bool,
}

/// One mip level (or the only level) of an image in memory. Texel `(x, y, z)` of layer `l` is at
/// `base + (l * depth + z) * slice_pitch + y * row_pitch + x * element_size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Level {
    pub base: u64,
    pub width: u32,
    /// 1 for 1D images.
    pub height: u32,
    /// 1 unless 3D.
    pub depth: u32,
    pub row_pitch: u64,
    /// Bytes between 2D slices: z slices of a 3D image, or layers (and cube faces) of a layered image.
    pub slice_pitch: u64,
}

/// The shape of a CUDA array (`cudaMalloc3DArray`'s extent and flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArrayKind {
    D1,
    D2,
    D3,
    Layered1D,
    Layered2D,
    /// Six square faces, as layers 0..6 (+x, -x, +y, -y, +z, -z).
    Cubemap,
    /// Cubemap `n` is layers `6n..6n+6`.
    LayeredCubemap,
}

/// A CUDA array or mipmapped array in memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrayDesc {
    pub format: ChannelFormat,
    pub kind: ArrayKind,
    /// Number of layers: 1 unless layered; 6 for a cubemap; 6 per cubemap of a layered cubemap.
    pub layers: u32,
    /// Level 0 first. A plain array has one.
    pub levels: Vec<Level>,
}

impl ArrayDesc {
    /// The array `cudaMalloc3DArray` (`levels` 1) or `cudaMallocMipmappedArray` makes of `extent` (width, height,
    /// depth; height 0 for 1D, depth 0 for 1D and 2D, depth counting layers for layered and cubemap arrays) and
    /// `flags` (`cudaArrayLayered` 1, `cudaArrayCubemap` 4; others do not change the layout), laid out from `base`:
    /// each level's rows, slices and layers packed one after another, levels 16-byte aligned. Returns the array and
    /// the bytes it spans. The level count is clamped to what the extent allows, as CUDA does.
    pub fn from_cuda(
        format: ChannelFormat,
        extent: [u64; 3],
        flags: u32,
        levels: u32,
        base: u64,
    ) -> Result<(ArrayDesc, u64), TextureError> {
        use ArrayKind::*;
        ChannelFormat::new(format.ty, format.channels)?;
        let bad = || TextureError::Descriptor(format!("extent {extent:?} with flags {flags:#x}"));
        let (layered, cube) = (flags & 1 != 0, flags & 4 != 0);
        let [w, h, d] = extent;
        let (kind, dims, layers) = match (layered, cube) {
            (false, false) if h == 0 && d == 0 => (D1, [w, 1, 1], 1),
            (false, false) if d == 0 => (D2, [w, h, 1], 1),
            (false, false) if h > 0 => (D3, [w, h, d], 1),
            (true, false) if h == 0 && d > 0 => (Layered1D, [w, 1, 1], d),
            (true, false) if d > 0 => (Layered2D, [w, h, 1], d),
            (false, true) if w == h && d == 6 => (Cubemap, [w, w, 1], 6),
            (true, true) if w == h && d > 0 && d % 6 == 0 => (LayeredCubemap, [w, w, 1], d),
            _ => return Err(bad()),
        };
        let fits = |x: u64| u32::try_from(x).ok().filter(|&x| x > 0);
        let (Some(dims), Some(layers)) = (dims.iter().map(|&x| fits(x)).collect::<Option<Vec<u32>>>(), fits(layers))
        else {
            return Err(bad());
        };
        let largest = dims.iter().copied().max().unwrap_or(1);
        let levels = levels.clamp(1, 32 - largest.leading_zeros());
        let esize = format.element_size() as u64;
        let mut offset = 0u64;
        let mut out = Vec::new();
        for l in 0..levels {
            let [lw, lh, ld] = [0, 1, 2].map(|k| (dims[k] >> l).max(1));
            let row = lw as u64 * esize;
            let slice = row.checked_mul(lh as u64).ok_or_else(bad)?;
            let size = slice.checked_mul(ld as u64 * layers as u64).ok_or_else(bad)?;
            out.push(Level {
                base: base.checked_add(offset).ok_or_else(bad)?,
                width: lw,
                height: lh,
                depth: ld,
                row_pitch: row,
                slice_pitch: slice,
            });
            offset = offset.checked_add(size).and_then(|o| o.checked_next_multiple_of(16)).ok_or_else(bad)?;
        }
        Ok((ArrayDesc { format, kind, layers, levels: out }, offset))
    }

    /// Checks that the levels are consistent with the shape and format (what `cudaMalloc3DArray` guarantees).
    pub fn validate(&self) -> Result<(), TextureError> {
        let bad = |m: String| Err(TextureError::Descriptor(m));
        ChannelFormat::new(self.format.ty, self.format.channels)?;
        let Some(l0) = self.levels.first() else { return bad("an array without levels".into()) };
        let esize = self.format.element_size() as u64;
        let layered = matches!(self.kind, ArrayKind::Layered1D | ArrayKind::Layered2D | ArrayKind::LayeredCubemap);
        let cube = matches!(self.kind, ArrayKind::Cubemap | ArrayKind::LayeredCubemap);
        if self.layers == 0 || (!layered && !cube && self.layers != 1) || (cube && !self.layers.is_multiple_of(6)) {
            return bad(format!("{} layers for a {:?} array", self.layers, self.kind));
        }
        if self.kind == ArrayKind::Cubemap && self.layers != 6 {
            return bad(format!("a cubemap with {} faces", self.layers));
        }
        if cube && l0.width != l0.height {
            return bad(format!("cubemap faces of {}x{} (must be square)", l0.width, l0.height));
        }
        for (i, l) in self.levels.iter().enumerate() {
            let one_d = matches!(self.kind, ArrayKind::D1 | ArrayKind::Layered1D);
            if l.width == 0 || l.height == 0 || l.depth == 0 {
                return bad(format!("level {i} has an empty extent"));
            }
            if (one_d && l.height != 1) || (self.kind != ArrayKind::D3 && l.depth != 1) {
                return bad(format!("level {i} of a {:?} array is {}x{}x{}", self.kind, l.width, l.height, l.depth));
            }
            let row = (l.width as u64).checked_mul(esize);
            let slice = (l.height as u64).checked_mul(l.row_pitch);
            if row.is_none_or(|r| l.row_pitch < r) || slice.is_none_or(|s| l.slice_pitch < s) {
                return bad(format!("level {i}: pitches {} and {} are too small", l.row_pitch, l.slice_pitch));
            }
        }
        Ok(())
    }
}

/// What a texture reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resource {
    /// A CUDA array (exactly one level).
    Array(ArrayDesc),
    /// A mipmapped array.
    Mipmapped(ArrayDesc),
    /// Linear memory, read by `tex1Dfetch`: `size` bytes at `base`.
    Linear { base: u64, format: ChannelFormat, size: u64 },
    /// Pitched 2D memory.
    Pitch2D { base: u64, format: ChannelFormat, width: u32, height: u32, pitch: u64 },
}

/// A texture object.
#[derive(Clone, Debug, PartialEq)]
pub struct Texture {
    pub resource: Resource,
    pub desc: TextureDesc,
}

impl Texture {
    /// The checks `cudaCreateTextureObject` makes on a resource and description.
    pub fn validate(&self) -> Result<(), TextureError> {
        let bad = |m: &str| Err(TextureError::Descriptor(m.to_string()));
        let format = match &self.resource {
            Resource::Array(a) => {
                a.validate()?;
                if a.levels.len() != 1 {
                    return bad("a plain array with several levels");
                }
                a.format
            }
            Resource::Mipmapped(a) => {
                a.validate()?;
                a.format
            }
            Resource::Linear { format, size, .. } => {
                ChannelFormat::new(format.ty, format.channels)?;
                if *size < format.element_size() as u64 {
                    return bad("linear memory smaller than one texel");
                }
                *format
            }
            Resource::Pitch2D { format, width, height, pitch, .. } => {
                ChannelFormat::new(format.ty, format.channels)?;
                if *width == 0 || *height == 0 || *pitch < *width as u64 * format.element_size() as u64 {
                    return bad("pitched memory with an empty extent or a pitch below its row");
                }
                *format
            }
        };
        if self.desc.read == ReadMode::NormalizedFloat && format.ty.bytes() == 4 && !format.ty.is_float() {
            return bad("normalized-float reads of 32-bit integer channels");
        }
        if self.desc.filter == FilterMode::Linear && !returns_float(format, &self.desc) {
            return bad("linear filtering of a texture that returns integers");
        }
        Ok(())
    }

    fn format(&self) -> ChannelFormat {
        match &self.resource {
            Resource::Array(a) | Resource::Mipmapped(a) => a.format,
            Resource::Linear { format, .. } | Resource::Pitch2D { format, .. } => *format,
        }
    }
}

/// A surface object: a CUDA array (its first level).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Surface {
    pub array: ArrayDesc,
}

/// A descriptor that `cudaCreateTextureObject` or `cudaMallocArray` would refuse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TextureError {
    #[error("invalid channel format: {0}")]
    ChannelFormat(String),
    #[error("invalid texture or array descriptor: {0}")]
    Descriptor(String),
}

impl TextureError {
    /// The `cudaError_t` CUDA answers.
    pub fn cuda_error(&self) -> i32 {
        match self {
            TextureError::ChannelFormat(_) => 20, // cudaErrorInvalidChannelDescriptor
            TextureError::Descriptor(_) => 1,     // cudaErrorInvalidValue
        }
    }
}

/// The texture and surface objects a launch can use, by handle.
pub trait Resources: Sync {
    fn texture(&self, handle: u64) -> Option<&Texture>;
    fn surface(&self, handle: u64) -> Option<&Surface>;
}

/// No texture or surface objects: every handle is invalid.
pub struct NoResources;

impl Resources for NoResources {
    fn texture(&self, _: u64) -> Option<&Texture> {
        None
    }
    fn surface(&self, _: u64) -> Option<&Surface> {
        None
    }
}

/// Texture and surface objects in hash maps; a backend can keep its objects in one, or build one per launch from
/// the objects it shares.
#[derive(Clone, Debug, Default)]
pub struct ResourceTable {
    pub textures: HashMap<u64, Arc<Texture>>,
    pub surfaces: HashMap<u64, Arc<Surface>>,
}

impl Resources for ResourceTable {
    fn texture(&self, handle: u64) -> Option<&Texture> {
        self.textures.get(&handle).map(|t| &**t)
    }
    fn surface(&self, handle: u64) -> Option<&Surface> {
        self.surfaces.get(&handle).map(|s| &**s)
    }
}

// ----- the interpreter's side -----

/// Texture geometry of a `tex`/`tld4`/`suld`/`sust` instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Geom {
    D1,
    D2,
    D3,
    A1d,
    A2d,
    Cube,
    ACube,
}

impl Geom {
    /// Filtered dimensions.
    fn dims(self) -> usize {
        match self {
            Geom::D1 | Geom::A1d => 1,
            Geom::D2 | Geom::A2d | Geom::Cube | Geom::ACube => 2,
            Geom::D3 => 3,
        }
    }
}

/// Reads of texel memory; the machine checks them like global loads.
pub(crate) trait TexelMemory {
    fn read(&mut self, addr: u64, size: usize) -> Result<u64, Fault>;
}

/// The level of detail a lookup asks for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Lod {
    /// Plain `tex`: level of detail 0 (plus the bias).
    Implicit,
    /// `tex.base`: the base level.
    Base,
    Level(f32),
    Grad([f32; 3], [f32; 3]),
}

/// One lane's lookup: coordinates as bit patterns (array index first for arrays).
pub(crate) struct Lookup {
    pub geom: Geom,
    pub coords: [u32; 4],
    pub int_coords: bool,
    pub lod: Lod,
    /// `tld4`: the component gathered from the 2x2 footprint.
    pub gather: Option<u8>,
}

/// Whether a texture's lookups return floats (and may be filtered).
fn returns_float(f: ChannelFormat, d: &TextureDesc) -> bool {
    f.ty.is_float() || d.read == ReadMode::NormalizedFloat
}

/// A view of one image: its format and levels, whatever resource it came from.
struct Image<'a> {
    format: ChannelFormat,
    layers: u32,
    levels: &'a [Level],
    mipmapped: bool,
}

/// Performs one lane's `tex` or `tld4`: four 32-bit results (floats or integers, as the texture returns them).
pub(crate) fn lookup(tex: &Texture, q: &Lookup, mem: &mut dyn TexelMemory) -> Result<[u32; 4], Fault> {
    let format = tex.format();
    let single;
    let image = match &tex.resource {
        Resource::Array(a) | Resource::Mipmapped(a) => Image {
            format,
            layers: a.layers,
            levels: &a.levels,
            mipmapped: matches!(tex.resource, Resource::Mipmapped(_)),
        },
        Resource::Pitch2D { base, width, height, pitch, .. } => {
            single = [Level {
                base: *base,
                width: *width,
                height: *height,
                depth: 1,
                row_pitch: *pitch,
                slice_pitch: pitch.wrapping_mul(*height as u64),
            }];
            Image { format, layers: 1, levels: &single, mipmapped: false }
        }
        Resource::Linear { base, size, .. } => {
            // tex1Dfetch: an integer index, no filtering or addressing; outside the buffer reads zero.
            let esize = format.element_size().max(1) as u64;
            let i = if q.int_coords { q.coords[0] as i32 as i64 } else { floor_i64(f32::from_bits(q.coords[0])) };
            if i < 0 || i as u64 >= size / esize {
                return Ok([0; 4]);
            }
            let raw = read_texel(mem, format, base.wrapping_add(i as u64 * esize))?;
            return Ok(decode(format, &tex.desc, raw));
        }
    };
    if image.levels.is_empty() {
        // Descriptors are validated when they are made; an empty one reads nothing rather than failing here.
        return Ok([0; 4]);
    }
    sample(&image, &tex.desc, q, mem)
}

fn floor_i64(x: f32) -> i64 {
    // NaN coordinates read as 0; infinities saturate and are then clamped or wrapped like any other coordinate.
    if x.is_nan() { 0 } else { x.floor() as i64 }
}

fn sample(img: &Image, d: &TextureDesc, q: &Lookup, mem: &mut dyn TexelMemory) -> Result<[u32; 4], Fault> {
    let c = q.coords;
    let f = |k: usize| f32::from_bits(c[k]);
    // Split the coordinates into layer and position; cubemap directions become a face and face coordinates.
    let (layer, pos, normalized): (u32, [f32; 3], bool) = match q.geom {
        Geom::D1 | Geom::D2 | Geom::D3 => (0, [f(0), f(1), f(2)], d.normalized_coords),
        Geom::A1d => (c[0], [f(1), 0.0, 0.0], d.normalized_coords),
        Geom::A2d => (c[0], [f(1), f(2), 0.0], d.normalized_coords),
        Geom::Cube | Geom::ACube => {
            let base = if q.geom == Geom::ACube { 1 } else { 0 };
            let (face, s, t) = cube_face(f(base), f(base + 1), f(base + 2));
            let cube = if q.geom == Geom::ACube { c[0].min((img.layers / 6).saturating_sub(1)) } else { 0 };
            (cube.saturating_mul(6).saturating_add(face), [s, t, 0.0], true)
        }
    };
    let layer = layer.min(img.layers.saturating_sub(1));
    if q.int_coords {
        // Integer coordinates load one texel of level 0; outside the image they read zero.
        let l = &img.levels[0];
        let ic = |k: usize| c[k] as i32 as i64;
        let p = match q.geom {
            Geom::D1 => [ic(0), 0, 0],
            Geom::D2 => [ic(0), ic(1), 0],
            Geom::D3 => [ic(0), ic(1), ic(2)],
            Geom::A1d => [ic(1), 0, 0],
            _ => [ic(1), ic(2), 0],
        };
        let dims = [l.width, l.height, l.depth];
        if (0..3).any(|k| p[k] < 0 || p[k] >= dims[k] as i64) {
            return Ok([0; 4]);
        }
        let raw = read_texel(mem, img.format, texel_addr(img, l, layer, [p[0] as u32, p[1] as u32, p[2] as u32]))?;
        return Ok(decode(img.format, d, raw));
    }
    if let Some(comp) = q.gather {
        return gather(img, d, layer, pos, normalized, comp, mem);
    }
    let float = returns_float(img.format, d);
    let (l0, l1, w1) =
        if img.mipmapped && img.levels.len() > 1 { select_levels(img, d, q, normalized) } else { (0, 0, 0) };
    let a = sample_level(img, d, q.geom, layer, l0, pos, normalized, mem)?;
    if w1 == 0 || !float || l1 == l0 {
        return Ok(a);
    }
    let b = sample_level(img, d, q.geom, layer, l1, pos, normalized, mem)?;
    Ok(std::array::from_fn(|k| {
        let (x, y) = (f32::from_bits(a[k]) as f64, f32::from_bits(b[k]) as f64);
        ((x * (256 - w1) as f64 + y * w1 as f64) / 256.0) as f32
    })
    .map(f32::to_bits))
}

/// Mip levels for a lookup and the weight (out of 256) of the second.
fn select_levels(img: &Image, d: &TextureDesc, q: &Lookup, normalized: bool) -> (usize, usize, u32) {
    let last = img.levels.len() - 1;
    let l0 = &img.levels[0];
    let mut lambda = match q.lod {
        Lod::Base => return (0, 0, 0),
        Lod::Implicit => 0.0,
        Lod::Level(l) => l,
        Lod::Grad(dx, dy) => {
            let size = [l0.width as f32, l0.height as f32, l0.depth as f32];
            let n = q.geom.dims();
            let scale = |k: usize| match q.geom {
                // Directions: a face spans two units of the minor axes.
                Geom::Cube | Geom::ACube => size[0] / 2.0,
                _ if normalized => size[k],
                _ => 1.0,
            };
            let len = |v: [f32; 3]| (0..n).map(|k| (v[k] * scale(k)) * (v[k] * scale(k))).sum::<f32>().sqrt();
            len(dx).max(len(dy)).log2()
        }
    };
    lambda += d.mipmap_level_bias;
    lambda = lambda.max(d.min_mipmap_level_clamp).min(d.max_mipmap_level_clamp);
    if lambda.is_nan() {
        lambda = 0.0;
    }
    let lambda = lambda.clamp(0.0, last as f32);
    match d.mipmap_filter {
        // The nearest level, halves rounding down.
        FilterMode::Point => {
            let l = ((lambda + 0.5).ceil() - 1.0).max(0.0) as usize;
            (l.min(last), l.min(last), 0)
        }
        FilterMode::Linear => {
            let lo = lambda.floor();
            let w = ((lambda - lo) * 256.0).round() as u32;
            let lo = lo as usize;
            (lo, (lo + 1).min(last), w)
        }
    }
}

/// Maps an integer texel coordinate to a texel index, or None for the border colour.
fn address(i: i64, n: u32, mode: AddressMode, normalized: bool) -> Option<u32> {
    let n = n.max(1) as i64;
    match mode {
        AddressMode::Border => (0..n).contains(&i).then_some(i as u32),
        // Wrap and mirror need normalized coordinates; without them CUDA clamps.
        AddressMode::Wrap if normalized => Some(i.rem_euclid(n) as u32),
        AddressMode::Mirror if normalized => {
            let m = i.rem_euclid(2 * n);
            Some(if m < n { m } else { 2 * n - 1 - m } as u32)
        }
        _ => Some(i.clamp(0, n - 1) as u32),
    }
}

/// A coordinate in texels of a level of size `n`.
fn texel_space(c: f32, n: u32, normalized: bool) -> f32 {
    let c = if c.is_nan() { 0.0 } else { c };
    if normalized { c * n as f32 } else { c }
}

/// The lower texel of a linear-filtering footprint and the weight of the upper one, in 1/256.
fn footprint(u: f32) -> (i64, u32) {
    let b = u - 0.5;
    let lo = b.floor();
    let w = if lo.is_finite() { ((b - lo) * 256.0).round() as u32 } else { 0 };
    (floor_i64(b), w)
}

#[allow(clippy::too_many_arguments)]
fn sample_level(
    img: &Image,
    d: &TextureDesc,
    geom: Geom,
    layer: u32,
    level: usize,
    pos: [f32; 3],
    normalized: bool,
    mem: &mut dyn TexelMemory,
) -> Result<[u32; 4], Fault> {
    let l = &img.levels[level];
    let sizes = [l.width, l.height, l.depth];
    let dims = geom.dims();
    let u: [f32; 3] = std::array::from_fn(|k| if k < dims { texel_space(pos[k], sizes[k], normalized) } else { 0.0 });
    let float = returns_float(img.format, d);
    if d.filter == FilterMode::Point || !float {
        let mut idx = [0u32; 3];
        for k in 0..dims {
            match address(floor_i64(u[k]), sizes[k], d.address[k], normalized) {
                Some(i) => idx[k] = i,
                None => return Ok(border(d)),
            }
        }
        let raw = read_texel(mem, img.format, texel_addr(img, l, layer, idx))?;
        return Ok(decode(img.format, d, raw));
    }
    // Linear: the 2^dims texels around the sample point, weighted by 8-bit fractions.
    let fp: [(i64, u32); 3] = std::array::from_fn(|k| if k < dims { footprint(u[k]) } else { (0, 0) });
    let mut acc = [0f64; 4];
    for corner in 0..(1usize << dims) {
        let mut weight = 1u64;
        let mut idx = [0u32; 3];
        let mut outside = false;
        for k in 0..dims {
            let upper = corner >> k & 1 == 1;
            let (lo, w) = fp[k];
            weight *= if upper { w as u64 } else { 256 - w as u64 };
            match address(lo.saturating_add(upper as i64), sizes[k], d.address[k], normalized) {
                Some(i) => idx[k] = i,
                None => outside = true,
            }
        }
        // The hardware keeps each corner's weight, the product of its per-dimension fractions, in the same
        // 8-bit fixed point, rounded to nearest (an H100 reads 15/256 where the exact 2D product is 15.19/256).
        let shift = 8 * (dims as u32 - 1);
        if shift > 0 {
            weight = (weight + (1 << (shift - 1))) >> shift;
        }
        if weight == 0 {
            continue;
        }
        let texel = if outside {
            border(d)
        } else {
            decode(img.format, d, read_texel(mem, img.format, texel_addr(img, l, layer, idx))?)
        };
        for (a, t) in acc.iter_mut().zip(texel) {
            *a += weight as f64 * f32::from_bits(t) as f64;
        }
    }
    Ok(acc.map(|a| float::f64_to_f32(a / 256.0, Rnd::Rn)))
}

/// `tld4`: component `comp` of the 2x2 footprint, counter-clockwise from the lower left: (i, j+1), (i+1, j+1),
/// (i+1, j), (i, j).
fn gather(
    img: &Image,
    d: &TextureDesc,
    layer: u32,
    pos: [f32; 3],
    normalized: bool,
    comp: u8,
    mem: &mut dyn TexelMemory,
) -> Result<[u32; 4], Fault> {
    let l = &img.levels[0];
    let (i, _) = footprint(texel_space(pos[0], l.width, normalized));
    let (j, _) = footprint(texel_space(pos[1], l.height, normalized));
    let mut out = [0u32; 4];
    for (o, (di, dj)) in out.iter_mut().zip([(0, 1), (1, 1), (1, 0), (0, 0)]) {
        let x = address(i.saturating_add(di), l.width, d.address[0], normalized);
        let y = address(j.saturating_add(dj), l.height, d.address[1], normalized);
        let texel = match (x, y) {
            (Some(x), Some(y)) => {
                decode(img.format, d, read_texel(mem, img.format, texel_addr(img, l, layer, [x, y, 0]))?)
            }
            _ => border(d),
        };
        *o = texel[comp as usize & 3];
    }
    Ok(out)
}

/// Face (0..6) and face coordinates in [0, 1] of a cubemap direction (the CUDA Programming Guide's table).
fn cube_face(x: f32, y: f32, z: f32) -> (u32, f32, f32) {
    let (ax, ay, az) = (x.abs(), y.abs(), z.abs());
    let (face, m, s, t) = if ax >= ay && ax >= az {
        if x >= 0.0 { (0, ax, -z, -y) } else { (1, ax, z, -y) }
    } else if ay >= az {
        if y >= 0.0 { (2, ay, x, z) } else { (3, ay, x, -z) }
    } else if z >= 0.0 {
        (4, az, x, -y)
    } else {
        (5, az, -x, -y)
    };
    (face, (s / m + 1.0) * 0.5, (t / m + 1.0) * 0.5)
}

fn texel_addr(img: &Image, l: &Level, layer: u32, idx: [u32; 3]) -> u64 {
    let slice = (layer as u64 * l.depth as u64 + idx[2] as u64).wrapping_mul(l.slice_pitch);
    l.base
        .wrapping_add(slice)
        .wrapping_add((idx[1] as u64).wrapping_mul(l.row_pitch))
        .wrapping_add(idx[0] as u64 * img.format.element_size() as u64)
}

/// The raw channels of the texel at `addr`.
fn read_texel(mem: &mut dyn TexelMemory, f: ChannelFormat, addr: u64) -> Result<[u32; 4], Fault> {
    let size = f.ty.bytes() as usize;
    let mut raw = [0u32; 4];
    for (k, r) in raw.iter_mut().enumerate().take(f.channels as usize) {
        *r = mem.read(addr.wrapping_add((k * size) as u64), size)? as u32;
    }
    Ok(raw)
}

/// What a texture returns for raw channels: missing channels read (0, 0, 0, 1).
fn decode(f: ChannelFormat, d: &TextureDesc, raw: [u32; 4]) -> [u32; 4] {
    let float = returns_float(f, d);
    let one = if float { 1f32.to_bits() } else { 1 };
    let normalized = d.read == ReadMode::NormalizedFloat;
    std::array::from_fn(|k| {
        if k >= f.channels as usize {
            return if k == 3 { one } else { 0 };
        }
        let v = raw[k];
        match f.ty {
            ChannelType::F32 => v,
            ChannelType::F16 => float::convert(v as u64 & 0xffff, float::F16, float::F32, Rnd::Rn) as u32,
            ChannelType::U8 if normalized => {
                let x = v as u8 as f32 / 255.0;
                if d.srgb && k < 3 { srgb_to_linear(x) } else { x }.to_bits()
            }
            ChannelType::U16 if normalized => (v as u16 as f32 / 65535.0).to_bits(),
            ChannelType::S8 if normalized => (v as i8 as f32 / 127.0).max(-1.0).to_bits(),
            ChannelType::S16 if normalized => (v as i16 as f32 / 32767.0).max(-1.0).to_bits(),
            ChannelType::S8 => v as i8 as i32 as u32,
            ChannelType::S16 => v as i16 as i32 as u32,
            ChannelType::U8 => v & 0xff,
            ChannelType::U16 => v & 0xffff,
            ChannelType::U32 | ChannelType::S32 => v,
        }
    })
}

fn srgb_to_linear(c: f32) -> f32 {
    let c = c as f64;
    (if c <= 0.04045 { c / 12.92 } else { ((c + 0.055) / 1.055).powf(2.4) }) as f32
}

/// The border colour as the texture returns it (all four components, as floats or as their bits).
fn border(d: &TextureDesc) -> [u32; 4] {
    d.border_color.map(f32::to_bits)
}

// ----- surfaces -----

/// What an out-of-range surface access does (`.trap`, `.clamp`, `.zero`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutOfRange {
    Trap,
    Clamp,
    Zero,
}

/// The address of a surface access of `size` bytes at byte offset `x` (and rows, slices, layer in `rest`), or None
/// when `.zero` drops it. Coordinates are signed except the layer.
pub(crate) fn surface_address(
    s: &Surface,
    geom: Geom,
    c: [u32; 4],
    size: u32,
    oob: OutOfRange,
) -> Result<Option<u64>, Fault> {
    let a = &s.array;
    let Some(l) = a.levels.first() else { return Ok(None) };
    let i = |k: usize| c[k] as i32 as i64;
    let (layer, x, y, z) = match geom {
        Geom::D1 => (0, i(0), 0, 0),
        Geom::D2 => (0, i(0), i(1), 0),
        Geom::D3 => (0, i(0), i(1), i(2)),
        Geom::A1d => (c[0] as i64, i(1), 0, 0),
        Geom::A2d | Geom::Cube | Geom::ACube => (c[0] as i64, i(1), i(2), 0),
    };
    // Misaligned offsets are undefined in PTX; the low bits are dropped.
    let x = x & !(size as i64 - 1);
    let row = l.width as i64 * a.format.element_size() as i64;
    let limits = [(x, row - size as i64 + 1), (y, l.height as i64), (z, l.depth as i64), (layer, a.layers as i64)];
    let inside = limits.iter().all(|&(v, n)| (0..n).contains(&v));
    if !inside && oob == OutOfRange::Clamp && limits.iter().any(|&(_, n)| n <= 0) {
        // Nothing to clamp to: the access is larger than a row (or the surface is empty).
        return Ok(None);
    }
    let [x, y, z, layer] = if inside {
        limits.map(|(v, _)| v)
    } else {
        match oob {
            OutOfRange::Trap => {
                return Err(Fault::SurfaceTrap(format!(
                    "surface access of {size} bytes at byte {x}, row {y}, slice {z}, layer {layer} is outside the \
                     {}x{}x{} surface of {} layers",
                    l.width, l.height, l.depth, a.layers
                )));
            }
            OutOfRange::Zero => return Ok(None),
            OutOfRange::Clamp => {
                let c = limits.map(|(v, n)| v.clamp(0, n - 1));
                [c[0] & !(size as i64 - 1), c[1], c[2], c[3]]
            }
        }
    };
    let slice = (layer as u64 * l.depth as u64 + z as u64).wrapping_mul(l.slice_pitch);
    Ok(Some(l.base.wrapping_add(slice).wrapping_add((y as u64).wrapping_mul(l.row_pitch)).wrapping_add(x as u64)))
}

/// `sust.p`: one channel's bits from a 32-bit source value, converted to the surface's format.
pub(crate) fn format_channel(ty: ChannelType, v: u32) -> u32 {
    match ty {
        ChannelType::F32 => v,
        ChannelType::F16 => float::convert(v as u64, float::F32, float::F16, Rnd::Rn) as u32,
        ChannelType::U8 => v.min(0xff),
        ChannelType::U16 => v.min(0xffff),
        ChannelType::U32 | ChannelType::S32 => v,
        ChannelType::S8 => (v as i32).clamp(-128, 127) as u32 & 0xff,
        ChannelType::S16 => (v as i32).clamp(-32768, 32767) as u32 & 0xffff,
    }
}

// ----- queries (txq, suq) -----

/// A `txq`/`suq` query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Query {
    Width,
    Height,
    Depth,
    ChannelDataType,
    ChannelOrder,
    NormalizedCoords,
    ArraySize,
    NumMipmapLevels,
    NumSamples,
    ForceUnnormalizedCoords,
    FilterMode,
    AddrMode(u8),
    MemoryLayout,
}

/// OpenCL's `cl_channel_type` for a format read in a mode (PTX answers in the source language's enumeration).
fn channel_data_type(f: ChannelFormat, normalized: bool) -> u32 {
    match (f.ty, normalized) {
        (ChannelType::S8, true) => 0x10D0,
        (ChannelType::S16, true) => 0x10D1,
        (ChannelType::U8, true) => 0x10D2,
        (ChannelType::U16, true) => 0x10D3,
        (ChannelType::S8, false) => 0x10D7,
        (ChannelType::S16, false) => 0x10D8,
        (ChannelType::S32, _) => 0x10D9,
        (ChannelType::U8, false) => 0x10DA,
        (ChannelType::U16, false) => 0x10DB,
        (ChannelType::U32, _) => 0x10DC,
        (ChannelType::F16, _) => 0x10DD,
        (ChannelType::F32, _) => 0x10DE,
    }
}

/// OpenCL's `cl_channel_order`: R, RG or RGBA.
fn channel_order(f: ChannelFormat) -> u32 {
    match f.channels {
        1 => 0x10B0,
        2 => 0x10B2,
        _ => 0x10B5,
    }
}

/// Extent of level `level`; beyond the last level, level 0's halved that many times (at least 1), as the sizes of
/// a full mipmap chain would be.
fn extent(levels: &[Level], level: usize) -> [u32; 3] {
    match (levels.get(level), levels.first()) {
        (Some(l), _) => [l.width, l.height, l.depth],
        (None, Some(l)) => {
            [l.width, l.height, l.depth].map(|n| n.checked_shr(level.min(32) as u32).unwrap_or(0).max(1))
        }
        (None, None) => [0; 3],
    }
}

fn array_size(a: &ArrayDesc) -> u32 {
    match a.kind {
        ArrayKind::Layered1D | ArrayKind::Layered2D => a.layers,
        ArrayKind::LayeredCubemap => a.layers / 6,
        _ => 0,
    }
}

/// Answers `txq` (with `level` for `txq.level`).
pub(crate) fn texture_query(t: &Texture, q: Query, level: Option<u32>) -> u32 {
    let f = t.format();
    let d = &t.desc;
    let level = level.unwrap_or(0) as usize;
    let one_level = |width: u32, height: u32| {
        extent(&[Level { base: 0, width, height, depth: 1, row_pitch: 0, slice_pitch: 0 }], level)
    };
    let dims = match &t.resource {
        Resource::Array(a) | Resource::Mipmapped(a) => extent(&a.levels, level),
        Resource::Linear { size, .. } => {
            one_level((size / f.element_size().max(1) as u64).min(u32::MAX as u64) as u32, 1)
        }
        Resource::Pitch2D { width, height, .. } => one_level(*width, *height),
    };
    match q {
        Query::Width => dims[0],
        Query::Height => dims[1],
        Query::Depth => dims[2],
        Query::ChannelDataType => channel_data_type(f, d.read == ReadMode::NormalizedFloat && !f.ty.is_float()),
        Query::ChannelOrder => channel_order(f),
        Query::NormalizedCoords => d.normalized_coords as u32,
        Query::ForceUnnormalizedCoords => !d.normalized_coords as u32,
        Query::ArraySize => match &t.resource {
            Resource::Array(a) | Resource::Mipmapped(a) => array_size(a),
            _ => 0,
        },
        Query::NumMipmapLevels => match &t.resource {
            Resource::Mipmapped(a) => a.levels.len() as u32,
            _ => 0,
        },
        Query::NumSamples | Query::MemoryLayout => 0,
        Query::FilterMode => d.filter as u32,
        // PTX's enumeration: wrap, mirror, clamp_ogl, clamp_to_edge, clamp_to_border.
        Query::AddrMode(k) => match d.address[k as usize % 3] {
            AddressMode::Wrap => 0,
            AddressMode::Mirror => 1,
            AddressMode::Clamp => 3,
            AddressMode::Border => 4,
        },
    }
}

/// Answers `suq`.
pub(crate) fn surface_query(s: &Surface, q: Query) -> u32 {
    let a = &s.array;
    let [w, h, d] = extent(&a.levels, 0);
    match q {
        Query::Width => w,
        Query::Height => h,
        Query::Depth => d,
        Query::ChannelDataType => channel_data_type(a.format, false),
        Query::ChannelOrder => channel_order(a.format),
        Query::ArraySize => array_size(a),
        _ => 0,
    }
}
