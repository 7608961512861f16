//! The `cuda` backend's CUDA arrays, texture objects and surface objects, through the driver
//! API's raw calls (`cudarc`'s typed layer has none of them). Every value that reaches a Rust
//! enum of the bindings comes from a descriptor the service checked
//! (`phos_ptx::exec::{ChannelFormat, TextureDesc}`), so no guest integer becomes an enum here.
//! Texture and surface objects are the driver's own values, which the guest passes to kernels
//! as they are.

use std::ffi::c_void;

use cudarc::driver::sys;
use phos_protocol::CudaError;
use phos_protocol::types::ResourceViewWire;
use phos_ptx::exec::{AddressMode, ChannelFormat, ChannelType, FilterMode, ReadMode, TextureDesc};

use super::cuda::{CudaBackend, check, stream_handle};
use super::{ArraySide, ArraySpec, Arrays, Raw, StreamRef, TextureSource};

/// `CU_TRSF_*` flags of a texture descriptor.
const TRSF_READ_AS_INTEGER: u32 = 0x01;
const TRSF_NORMALIZED_COORDINATES: u32 = 0x02;
const TRSF_SRGB: u32 = 0x10;
const TRSF_SEAMLESS_CUBEMAP: u32 = 0x40;

fn array_format(format: ChannelFormat) -> (sys::CUarray_format, u32) {
    use sys::CUarray_format::*;
    let f = match format.ty {
        ChannelType::U8 => CU_AD_FORMAT_UNSIGNED_INT8,
        ChannelType::U16 => CU_AD_FORMAT_UNSIGNED_INT16,
        ChannelType::U32 => CU_AD_FORMAT_UNSIGNED_INT32,
        ChannelType::S8 => CU_AD_FORMAT_SIGNED_INT8,
        ChannelType::S16 => CU_AD_FORMAT_SIGNED_INT16,
        ChannelType::S32 => CU_AD_FORMAT_SIGNED_INT32,
        ChannelType::F16 => CU_AD_FORMAT_HALF,
        ChannelType::F32 => CU_AD_FORMAT_FLOAT,
    };
    (f, u32::from(format.channels))
}

fn address_mode(m: AddressMode) -> sys::CUaddress_mode {
    use sys::CUaddress_mode::*;
    match m {
        AddressMode::Wrap => CU_TR_ADDRESS_MODE_WRAP,
        AddressMode::Clamp => CU_TR_ADDRESS_MODE_CLAMP,
        AddressMode::Mirror => CU_TR_ADDRESS_MODE_MIRROR,
        AddressMode::Border => CU_TR_ADDRESS_MODE_BORDER,
    }
}

fn filter_mode(m: FilterMode) -> sys::CUfilter_mode {
    match m {
        FilterMode::Point => sys::CUfilter_mode::CU_TR_FILTER_MODE_POINT,
        FilterMode::Linear => sys::CUfilter_mode::CU_TR_FILTER_MODE_LINEAR,
    }
}

/// A driver resource descriptor. The struct has a union and enum fields without a zero value,
/// so it is built whole.
fn resource_desc(source: &TextureSource) -> sys::CUDA_RESOURCE_DESC {
    use sys::CUDA_RESOURCE_DESC_st__bindgen_ty_1 as Res;
    use sys::CUresourcetype::*;
    let (res_type, res) = match *source {
        TextureSource::Array { raw, .. } => (
            CU_RESOURCE_TYPE_ARRAY,
            Res { array: sys::CUDA_RESOURCE_DESC_st__bindgen_ty_1__bindgen_ty_1 { hArray: raw as sys::CUarray } },
        ),
        TextureSource::Mipmapped { raw, .. } => (
            CU_RESOURCE_TYPE_MIPMAPPED_ARRAY,
            Res {
                mipmap: sys::CUDA_RESOURCE_DESC_st__bindgen_ty_1__bindgen_ty_2 {
                    hMipmappedArray: raw as sys::CUmipmappedArray,
                },
            },
        ),
        TextureSource::Linear { addr, format, size } => {
            let (format, channels) = array_format(format);
            (
                CU_RESOURCE_TYPE_LINEAR,
                Res {
                    linear: sys::CUDA_RESOURCE_DESC_st__bindgen_ty_1__bindgen_ty_3 {
                        devPtr: addr,
                        format,
                        numChannels: channels,
                        sizeInBytes: size as usize,
                    },
                },
            )
        }
        TextureSource::Pitch2D { addr, format, width, height, pitch } => {
            let (format, channels) = array_format(format);
            (
                CU_RESOURCE_TYPE_PITCH2D,
                Res {
                    pitch2D: sys::CUDA_RESOURCE_DESC_st__bindgen_ty_1__bindgen_ty_4 {
                        devPtr: addr,
                        format,
                        numChannels: channels,
                        width: width as usize,
                        height: height as usize,
                        pitchInBytes: pitch as usize,
                    },
                },
            )
        }
    };
    sys::CUDA_RESOURCE_DESC { resType: res_type, res, flags: 0 }
}

/// The driver's texture descriptor of the runtime's: the runtime reads integer formats as
/// integers in element-type mode, and the flags carry what the runtime has as fields.
fn texture_desc(desc: &TextureDesc, integer_format: bool) -> sys::CUDA_TEXTURE_DESC {
    let mut flags = 0;
    if desc.read == ReadMode::ElementType && integer_format {
        flags |= TRSF_READ_AS_INTEGER;
    }
    if desc.normalized_coords {
        flags |= TRSF_NORMALIZED_COORDINATES;
    }
    if desc.srgb {
        flags |= TRSF_SRGB;
    }
    if desc.seamless_cubemap {
        flags |= TRSF_SEAMLESS_CUBEMAP;
    }
    sys::CUDA_TEXTURE_DESC {
        addressMode: desc.address.map(address_mode),
        filterMode: filter_mode(desc.filter),
        flags,
        maxAnisotropy: desc.max_anisotropy,
        mipmapFilterMode: filter_mode(desc.mipmap_filter),
        mipmapLevelBias: desc.mipmap_level_bias,
        minMipmapLevelClamp: desc.min_mipmap_level_clamp,
        maxMipmapLevelClamp: desc.max_mipmap_level_clamp,
        borderColor: desc.border_color,
        reserved: [0; 12],
    }
}

/// A copy side as the driver's `CUDA_MEMCPY3D` has it: (memory type, host pointer, device
/// address, array, x in bytes, y, z, pitch), for slice `z` of the copy.
type DriverSide = (sys::CUmemorytype, *mut c_void, u64, sys::CUarray, u64, u64, u64, u64);

fn driver_side(side: &mut ArraySide<'_>, z: u64, width: u64, height: u64) -> DriverSide {
    use sys::CUmemorytype::*;
    let null = std::ptr::null_mut();
    match side {
        ArraySide::Array { raw, x, y, z: z0 } => {
            (CU_MEMORYTYPE_ARRAY, null, 0, *raw as sys::CUarray, *x, *y, *z0 + z, 0)
        }
        ArraySide::Device { addr, pitch, slice } => {
            (CU_MEMORYTYPE_DEVICE, null, *addr + z * *slice, std::ptr::null_mut(), 0, 0, 0, *pitch)
        }
        ArraySide::Host(bytes) => {
            let at = (z * width * height) as usize;
            (CU_MEMORYTYPE_HOST, bytes[at..].as_ptr() as *mut c_void, 0, std::ptr::null_mut(), 0, 0, 0, width)
        }
        ArraySide::HostOut(bytes) => {
            let at = (z * width * height) as usize;
            (CU_MEMORYTYPE_HOST, bytes[at..].as_mut_ptr() as *mut c_void, 0, std::ptr::null_mut(), 0, 0, 0, width)
        }
    }
}

impl Arrays for CudaBackend {
    fn array_create(&self, device: i32, spec: &ArraySpec) -> Result<Raw, CudaError> {
        self.device(device)?;
        let (format, channels) = array_format(spec.format);
        let [w, h, d] = spec.extent;
        let desc = sys::CUDA_ARRAY3D_DESCRIPTOR {
            Width: w as usize,
            Height: h as usize,
            Depth: d as usize,
            Format: format,
            NumChannels: channels,
            Flags: spec.flags,
        };
        match spec.levels {
            None => {
                let mut array: sys::CUarray = std::ptr::null_mut();
                // SAFETY: writes one handle; the descriptor is a local, checked by the service.
                check(unsafe { sys::cuArray3DCreate_v2(&mut array, &desc) })?;
                Ok(array as Raw)
            }
            Some(levels) => {
                let mut mipmap: sys::CUmipmappedArray = std::ptr::null_mut();
                // SAFETY: writes one handle into the local `mipmap`; `desc` is a local the service
                // checked, and `levels` was checked against the extent.
                check(unsafe { sys::cuMipmappedArrayCreate(&mut mipmap, &desc, levels) })?;
                Ok(mipmap as Raw)
            }
        }
    }

    fn array_destroy(&self, array: Raw, mipmapped: bool) -> Result<(), CudaError> {
        if mipmapped {
            // SAFETY: a mipmapped array of the session's (the registry's), which it forgets.
            check(unsafe { sys::cuMipmappedArrayDestroy(array as sys::CUmipmappedArray) })
        } else {
            // SAFETY: a plain array of the session's (never a level: those go with their
            // mipmapped array), which the registry forgets.
            check(unsafe { sys::cuArrayDestroy(array as sys::CUarray) })
        }
    }

    fn mipmap_level(&self, mipmap: Raw, level: u32) -> Result<Raw, CudaError> {
        let mut array: sys::CUarray = std::ptr::null_mut();
        // SAFETY: writes one handle; a mipmapped array of the session's.
        check(unsafe { sys::cuMipmappedArrayGetLevel(&mut array, mipmap as sys::CUmipmappedArray, level) })?;
        Ok(array as Raw)
    }

    fn array_copy(
        &self,
        mut dst: ArraySide<'_>,
        mut src: ArraySide<'_>,
        [width, height, depth]: [u64; 3],
        stream: Option<StreamRef>,
    ) -> Result<(), CudaError> {
        let host_side = matches!(src, ArraySide::Host(_)) || matches!(dst, ArraySide::HostOut(_));
        // One copy per slice: a device side's slice pitch need not be a whole number of rows,
        // which the driver's `srcHeight` / `dstHeight` would ask.
        for z in 0..depth {
            let s = driver_side(&mut src, z, width, height);
            let d = driver_side(&mut dst, z, width, height);
            let p = sys::CUDA_MEMCPY3D {
                srcXInBytes: s.4 as usize,
                srcY: s.5 as usize,
                srcZ: s.6 as usize,
                srcLOD: 0,
                srcMemoryType: s.0,
                srcHost: s.1,
                srcDevice: s.2,
                srcArray: s.3,
                reserved0: std::ptr::null_mut(),
                srcPitch: s.7 as usize,
                srcHeight: height as usize,
                dstXInBytes: d.4 as usize,
                dstY: d.5 as usize,
                dstZ: d.6 as usize,
                dstLOD: 0,
                dstMemoryType: d.0,
                dstHost: d.1,
                dstDevice: d.2,
                dstArray: d.3,
                reserved1: std::ptr::null_mut(),
                dstPitch: d.7 as usize,
                dstHeight: height as usize,
                WidthInBytes: width as usize,
                Height: height as usize,
                Depth: 1,
            };
            match stream {
                // SAFETY: the service checked both sides (an array's corner and extent, a
                // device side's rows, a host side's length); a host side is borrowed until the
                // copy is done.
                None => check(unsafe { sys::cuMemcpy3D_v2(&p) })?,
                // SAFETY: the service checked both sides (an array's corner and extent, a device
                // side's rows, a host side's length); a host side stays borrowed until the stream
                // is synchronised below.
                Some(st) => check(unsafe { sys::cuMemcpy3DAsync_v2(&p, stream_handle(st)) })?,
            }
        }
        // A host side is the request's or the reply's buffer: done before either goes.
        if let Some(st) = stream
            && host_side
        {
            // SAFETY: a live stream of the session's, or a special one.
            check(unsafe { sys::cuStreamSynchronize(stream_handle(st)) })?;
        }
        Ok(())
    }

    fn texture_create(
        &self,
        source: &TextureSource,
        desc: &TextureDesc,
        view: Option<&ResourceViewWire>,
    ) -> Result<u64, CudaError> {
        let integer_format = !source.format().ty.is_float();
        let res = resource_desc(source);
        let tex = texture_desc(desc, integer_format);
        // The service carries views of the resource's own format only.
        let view = view.map(|v| sys::CUDA_RESOURCE_VIEW_DESC {
            format: sys::CUresourceViewFormat::CU_RES_VIEW_FORMAT_NONE,
            width: v.width as usize,
            height: v.height as usize,
            depth: v.depth as usize,
            firstMipmapLevel: v.first_mipmap_level,
            lastMipmapLevel: v.last_mipmap_level,
            firstLayer: v.first_layer,
            lastLayer: v.last_layer,
            reserved: [0; 16],
        });
        let mut object: sys::CUtexObject = 0;
        let view_ptr = view.as_ref().map_or(std::ptr::null(), |v| v as *const _);
        // SAFETY: writes one value; three local descriptors (the view may be null), whose
        // arrays and memory the service checked are the session's.
        check(unsafe { sys::cuTexObjectCreate(&mut object, &res, &tex, view_ptr) })?;
        Ok(object)
    }

    fn texture_destroy(&self, texture: u64) -> Result<(), CudaError> {
        // SAFETY: a texture object of the session's (the registry's), which it forgets.
        check(unsafe { sys::cuTexObjectDestroy(texture) })
    }

    fn surface_create(&self, array: Raw) -> Result<u64, CudaError> {
        // The format is not part of the driver's array resource descriptor.
        let format = ChannelFormat { ty: ChannelType::U8, channels: 1 };
        let res = resource_desc(&TextureSource::Array { raw: array, format });
        let mut object: sys::CUsurfObject = 0;
        // SAFETY: writes one value; a local descriptor of an array of the session's.
        check(unsafe { sys::cuSurfObjectCreate(&mut object, &res) })?;
        Ok(object)
    }

    fn surface_destroy(&self, surface: u64) -> Result<(), CudaError> {
        // SAFETY: a surface object of the session's (the registry's), which it forgets.
        check(unsafe { sys::cuSurfObjectDestroy(surface) })
    }
}
