//! CUDA arrays, texture objects and surface objects: the checks and translations between the
//! runtime API's calls (`phosArrayCreate`, `phosMemcpy*Array*`, `phosTextureCreate`, ...) and
//! the session's [`ArrayRegistry`](crate::registry::arrays::ArrayRegistry) and backend.

use phos_protocol::limits::LimitKind;
use phos_protocol::types::{ChannelFormatDesc, TextureDescWire};
use phos_protocol::{CudaError, Ptr};
use phos_ptx::exec::{AddressMode, FilterMode, ReadMode, Resource, Texture, TextureDesc, TextureError};

use super::{CallCx, Session};
use crate::backend::{ArraySide, TextureSource};
use crate::registry::arrays::{
    RESOURCE_ARRAY, RESOURCE_LINEAR, RESOURCE_MIPMAPPED, RESOURCE_PITCH_2D, Shape, TextureRecord,
};

/// Rows of pitched memory a texture reads start this many bytes apart at least
/// (`cudaDevAttrTexturePitchAlignment` of every GPU since Volta).
const TEXTURE_PITCH_ALIGNMENT: u64 = 32;

/// The interpreter's texture description of the wire's (CUDA's values are checked here).
pub(crate) fn texture_desc(w: &TextureDescWire) -> Result<TextureDesc, TextureError> {
    let address = [
        AddressMode::from_cuda(w.address_mode[0])?,
        AddressMode::from_cuda(w.address_mode[1])?,
        AddressMode::from_cuda(w.address_mode[2])?,
    ];
    Ok(TextureDesc {
        address,
        filter: FilterMode::from_cuda(w.filter_mode)?,
        read: ReadMode::from_cuda(w.read_mode)?,
        srgb: w.srgb != 0,
        border_color: w.border_color,
        normalized_coords: w.normalized_coords != 0,
        max_anisotropy: w.max_anisotropy,
        mipmap_filter: FilterMode::from_cuda(w.mipmap_filter_mode)?,
        mipmap_level_bias: w.mipmap_level_bias,
        min_mipmap_level_clamp: w.min_mipmap_level_clamp,
        max_mipmap_level_clamp: w.max_mipmap_level_clamp,
        seamless_cubemap: w.seamless_cubemap != 0,
    })
}

impl Session {
    /// A copy box that does not fit its array: logged (rate-limited), `cudaErrorInvalidValue`.
    fn outside_array(&self, corner: [u64; 3], extent: [u64; 3], shape: &Shape) -> CudaError {
        crate::guest_warn!(
            self.id,
            "a copy of {extent:?} bytes x rows x slices at {corner:?} does not fit a CUDA array of {:?} (flags {:#x})",
            shape.extent,
            shape.flags
        );
        CudaError::InvalidValue
    }

    /// A texture description or resource `cudaCreateTextureObject` refuses: logged, `error`.
    fn texture_refused(&self, why: &str, error: CudaError) -> CudaError {
        crate::guest_warn!(self.id, "cudaCreateTextureObject: refused: {why}");
        error
    }

    /// `error` of a call that took `value` for a texture or surface object of the session's;
    /// when it is not one (`cudaErrorInvalidValue` from the registry), logged (rate-limited).
    pub(super) fn unless_object(&self, error: CudaError, function: &str, value: u64) -> CudaError {
        if error == CudaError::InvalidValue {
            crate::guest_warn!(self.id, "{function}: {value:#x} is no object of the session's");
        }
        error
    }

    /// A new array or mipmapped array; refused when the bytes the router accounted are not
    /// its layout's.
    pub(super) fn create_array(
        &self,
        cx: &CallCx,
        desc: ChannelFormatDesc,
        extent: [u64; 3],
        flags: u32,
        levels: Option<u32>,
        accounted: u64,
    ) -> Result<u64, CudaError> {
        if flags & 0x40 != 0 || flags & 0x80 != 0 {
            crate::guest_warn!(self.id, "sparse and deferred-mapping CUDA arrays are not carried (flags {flags:#x})");
            return Err(CudaError::NotSupported);
        }
        let shape = Shape::new(desc, extent, flags, levels)?;
        if shape.bytes != accounted {
            crate::guest_warn!(
                self.id,
                "a CUDA array of {extent:?} (flags {flags:#x}, levels {levels:?}) takes {} bytes, not the {accounted} its request accounted",
                shape.bytes
            );
            return Err(CudaError::InvalidValue);
        }
        self.with_new_handle(cx, LimitKind::Allocations, |new| {
            self.objects.arrays.create(self.backend(), cx.device, shape, levels, new)
        })
    }

    /// The stream of an array copy (`None`: synchronous). A copy with an array in a capturing
    /// stream is not recorded: the capture is invalidated, as for other copies Phos cannot
    /// capture.
    fn array_copy_stream(&self, stream: u64, ordered: bool) -> Result<Option<crate::backend::StreamRef>, CudaError> {
        if !ordered {
            return Ok(None);
        }
        let s = self.objects.streams.resolve(stream)?;
        if let Some(mut captures) = self.objects.graphs.captures.active()
            && captures.of_stream(stream).is_some()
        {
            return Err(captures.refuse(stream).unwrap_or(CudaError::StreamCaptureUnsupported));
        }
        Ok(Some(s))
    }

    /// A copy into an array from the host (packed rows) or from device memory.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn copy_to_array(
        &self,
        array: u64,
        corner: [u64; 3],
        src: &Ptr<'_>,
        spitch: u64,
        sslice: u64,
        extent: [u64; 3],
        stream: u64,
        ordered: bool,
    ) -> Result<(), CudaError> {
        let a = self.objects.arrays.array(array)?;
        if !a.shape.holds(corner, extent) {
            return Err(self.outside_array(corner, extent, &a.shape));
        }
        let src = match *src {
            Ptr::In(bytes) => ArraySide::Host(bytes),
            Ptr::Device(addr) => ArraySide::Device { addr, pitch: spitch, slice: sslice },
            _ => return Err(CudaError::InvalidMemcpyDirection),
        };
        let stream = self.array_copy_stream(stream, ordered)?;
        let [x, y, z] = corner;
        self.backend().array_copy(ArraySide::Array { raw: a.raw, x, y, z }, src, extent, stream)
    }

    /// A copy out of an array to the host (packed rows, returned) or to device memory.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn copy_from_array(
        &self,
        dst: &Ptr<'_>,
        dpitch: u64,
        dslice: u64,
        array: u64,
        corner: [u64; 3],
        extent: [u64; 3],
        stream: u64,
        ordered: bool,
    ) -> Result<Option<Vec<u8>>, CudaError> {
        let a = self.objects.arrays.array(array)?;
        if !a.shape.holds(corner, extent) {
            return Err(self.outside_array(corner, extent, &a.shape));
        }
        let stream = self.array_copy_stream(stream, ordered)?;
        let [x, y, z] = corner;
        let src = ArraySide::Array { raw: a.raw, x, y, z };
        match *dst {
            Ptr::Out(len) => {
                let mut out = super::cudart::reply_buffer(len)?;
                self.backend().array_copy(ArraySide::HostOut(&mut out), src, extent, stream)?;
                Ok(Some(out))
            }
            Ptr::Device(addr) => {
                let dst = ArraySide::Device { addr, pitch: dpitch, slice: dslice };
                self.backend().array_copy(dst, src, extent, stream).map(|_| None)
            }
            _ => Err(CudaError::InvalidMemcpyDirection),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn copy_array_to_array(
        &self,
        dst: u64,
        dst_corner: [u64; 3],
        src: u64,
        src_corner: [u64; 3],
        extent: [u64; 3],
        stream: u64,
        ordered: bool,
    ) -> Result<(), CudaError> {
        let (d, s) = (self.objects.arrays.array(dst)?, self.objects.arrays.array(src)?);
        if !d.shape.holds(dst_corner, extent) {
            return Err(self.outside_array(dst_corner, extent, &d.shape));
        }
        if !s.shape.holds(src_corner, extent) {
            return Err(self.outside_array(src_corner, extent, &s.shape));
        }
        // CUDA copies bytes between arrays of one element size.
        if d.shape.format.element_size() != s.shape.format.element_size() {
            crate::guest_warn!(self.id, "a copy between CUDA arrays of different element sizes");
            return Err(CudaError::InvalidValue);
        }
        let stream = self.array_copy_stream(stream, ordered)?;
        let ([dx, dy, dz], [sx, sy, sz]) = (dst_corner, src_corner);
        self.backend().array_copy(
            ArraySide::Array { raw: d.raw, x: dx, y: dy, z: dz },
            ArraySide::Array { raw: s.raw, x: sx, y: sy, z: sz },
            extent,
            stream,
        )
    }

    /// A texture object of `record`'s resource and description, checked as
    /// `cudaCreateTextureObject` checks them (the interpreter's rules, the same for both
    /// backends); the backend's value of it.
    pub(super) fn create_texture(&self, cx: &CallCx, record: TextureRecord) -> Result<u64, CudaError> {
        let desc = texture_desc(&record.tex_desc)
            .map_err(|e| self.texture_refused(&e.to_string(), CudaError::InvalidValue))?;
        if let Some(v) = &record.view
            && (v.format != 0 || v.first_mipmap_level != 0 || v.first_layer != 0)
        {
            crate::guest_warn!(
                self.id,
                "cudaCreateTextureObject: resource views other than the whole resource in its own format are not carried"
            );
            return Err(CudaError::NotSupported);
        }
        let format = |d: &ChannelFormatDesc| {
            phos_ptx::exec::ChannelFormat::from_cuda(d.x, d.y, d.z, d.w, d.f)
                .map_err(|_| CudaError::InvalidChannelDescriptor)
        };
        let (source, resource) = match record.res_type {
            RESOURCE_ARRAY => {
                let a = self.objects.arrays.array(record.array)?;
                let source = TextureSource::Array { raw: a.raw, format: a.shape.format };
                (source, Resource::Array(a.shape.layout))
            }
            RESOURCE_MIPMAPPED => {
                let m = self.objects.arrays.mipmapped(record.mipmap)?;
                let source = TextureSource::Mipmapped { raw: m.raw, format: m.shape.format };
                (source, Resource::Mipmapped(m.shape.layout))
            }
            RESOURCE_LINEAR => {
                let f = format(&record.desc)?;
                if !self.objects.memory.contains(record.dev_ptr, record.size) {
                    return Err(self.texture_refused("linear memory outside the session's", CudaError::InvalidValue));
                }
                let source = TextureSource::Linear { addr: record.dev_ptr, format: f, size: record.size };
                (source, Resource::Linear { base: record.dev_ptr, format: f, size: record.size })
            }
            RESOURCE_PITCH_2D => {
                let f = format(&record.desc)?;
                let (w, h, pitch) = (record.width, record.height, record.pitch);
                let row = w.checked_mul(u64::from(f.element_size())).ok_or(CudaError::InvalidValue)?;
                let span = pitch.checked_mul(h.saturating_sub(1)).and_then(|n| n.checked_add(row));
                let (Ok(w32), Ok(h32), Some(span)) = (u32::try_from(w), u32::try_from(h), span) else {
                    return Err(self.texture_refused("pitched memory of an impossible extent", CudaError::InvalidValue));
                };
                if pitch % TEXTURE_PITCH_ALIGNMENT != 0 || !self.objects.memory.contains(record.dev_ptr, span) {
                    let why = "pitched memory outside the session's, or a pitch not a multiple of 32";
                    return Err(self.texture_refused(why, CudaError::InvalidValue));
                }
                let source = TextureSource::Pitch2D { addr: record.dev_ptr, format: f, width: w, height: h, pitch };
                (source, Resource::Pitch2D { base: record.dev_ptr, format: f, width: w32, height: h32, pitch })
            }
            other => {
                return Err(self.texture_refused(&format!("resource type {other}"), CudaError::InvalidValue));
            }
        };
        Texture { resource, desc }
            .validate()
            .map_err(|e| self.texture_refused(&e.to_string(), CudaError(e.cuda_error())))?;
        let view = record.view;
        let backend = self.backend();
        self.objects.arrays.add_texture(
            record,
            cx.device,
            || backend.texture_create(&source, &desc, view.as_ref()),
            &|| self.refuse(cx, LimitKind::Allocations),
        )
    }
}
