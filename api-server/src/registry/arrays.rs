//! The session's CUDA arrays, mipmapped arrays, texture objects and surface objects.
//!
//! Arrays and mipmapped arrays reach the guest as virtual handles; a mipmapped array's levels
//! are `array` handles too, made on first request and gone with their mipmapped array. Texture
//! and surface objects are the backend's own values (kernels take them by value, where the
//! server cannot tell them from other parameters): the registry keeps the session's, so a
//! value that is not one of them is refused. The registry knows each array's shape and checks
//! every copy's corner and extent against it, so the backends see only copies that fit.

use std::collections::HashMap;

use parking_lot::Mutex;
use phos_protocol::CudaError;
use phos_protocol::apis::HandleKind;
use phos_protocol::types::{ChannelFormatDesc, ResourceViewWire, TextureDescWire};
use phos_ptx::exec::{ArrayDesc, ChannelFormat};

use super::handles::{HandleTable, NewHandle};
use crate::backend::prelude::*;
use crate::backend::{ArraySpec, Raw};

/// `cudaArray*` flags Phos carries: layered, surface load/store, cubemap, texture gather,
/// color attachment (which changes nothing off the graphics APIs).
pub const ARRAY_FLAGS: u32 = 0x1 | 0x2 | 0x4 | 0x8 | 0x20;
const SURFACE_LOAD_STORE: u32 = 0x2;
const LAYERED_OR_CUBEMAP: u32 = 0x1 | 0x4;

/// The largest extents CUDA gives arrays (an H100's `cudaDevAttrMaxTexture*`/`MaxSurface*`):
/// (width, height, depth or layers) per shape.
const MAX_1D: u64 = 131_072;
const MAX_2D: [u64; 2] = [131_072, 65_536];
const MAX_3D: u64 = 16_384;
const MAX_LAYERED: [u64; 3] = [32_768, 32_768, 2_048];

/// An array's shape, as created.
#[derive(Debug, Clone)]
pub struct Shape {
    pub desc: ChannelFormatDesc,
    pub format: ChannelFormat,
    /// As given (0 for the dimensions it lacks).
    pub extent: [u64; 3],
    pub flags: u32,
    /// The layout (base 0): each level's extent, and the layer count.
    pub layout: ArrayDesc,
    /// Bytes of the packed layout, accounted as device memory.
    pub bytes: u64,
}

impl Shape {
    /// The shape of `cudaMalloc3DArray` (`levels` None) or `cudaMallocMipmappedArray`; the
    /// errors CUDA answers for formats, flags and extents it refuses.
    pub fn new(desc: ChannelFormatDesc, extent: [u64; 3], flags: u32, levels: Option<u32>) -> Result<Shape, CudaError> {
        let format = ChannelFormat::from_cuda(desc.x, desc.y, desc.z, desc.w, desc.f)
            .map_err(|_| CudaError::InvalidChannelDescriptor)?;
        if flags & !ARRAY_FLAGS != 0 {
            return Err(CudaError::InvalidValue);
        }
        let [w, h, d] = extent;
        let fits = if flags & LAYERED_OR_CUBEMAP != 0 {
            w <= MAX_LAYERED[0] && h <= MAX_LAYERED[1] && d <= MAX_LAYERED[2]
        } else if d > 0 {
            w <= MAX_3D && h <= MAX_3D && d <= MAX_3D
        } else if h > 0 {
            w <= MAX_2D[0] && h <= MAX_2D[1]
        } else {
            w <= MAX_1D
        };
        if !fits || w == 0 {
            return Err(CudaError::InvalidValue);
        }
        let (layout, bytes) = ArrayDesc::from_cuda(format, extent, flags, levels.unwrap_or(1), 0)
            .map_err(|e| CudaError(e.cuda_error()))?;
        Ok(Shape { desc, format, extent, flags, layout, bytes })
    }

    /// The shape of level `level` as an array of its own.
    fn level(&self, level: u32) -> Option<Shape> {
        let l = *self.layout.levels.get(level as usize)?;
        let layered = self.flags & LAYERED_OR_CUBEMAP != 0;
        let extent = [
            u64::from(l.width),
            if self.extent[1] == 0 { 0 } else { u64::from(l.height) },
            if self.extent[2] == 0 {
                0
            } else if layered {
                self.extent[2]
            } else {
                u64::from(l.depth)
            },
        ];
        let layout = ArrayDesc { levels: vec![l], ..self.layout.clone() };
        Some(Shape { extent, layout, bytes: 0, ..self.clone() })
    }

    fn spec(&self, levels: Option<u32>) -> ArraySpec {
        ArraySpec { format: self.format, extent: self.extent, flags: self.flags, levels }
    }

    /// Whether a box `width` bytes by `height` rows by `depth` slices (or layers) at `(x, y, z)`
    /// (x in bytes) lies in the array's first level, and `x` and `width` are whole elements.
    pub fn holds(&self, [x, y, z]: [u64; 3], [width, height, depth]: [u64; 3]) -> bool {
        let l = self.layout.levels[0];
        let esize = u64::from(self.format.element_size());
        let row = u64::from(l.width) * esize;
        let slices = u64::from(l.depth) * u64::from(self.layout.layers);
        let within = |at: u64, len: u64, size: u64| at.checked_add(len).is_some_and(|end| end <= size);
        x % esize == 0
            && width % esize == 0
            && within(x, width, row)
            && within(y, height, u64::from(l.height))
            && within(z, depth, slices)
    }
}

struct Array {
    raw: Raw,
    shape: Shape,
    /// The mipmapped array this is a level of.
    level_of: Option<u64>,
}

struct Mipmapped {
    raw: Raw,
    shape: Shape,
    /// Handles of the levels asked for so far.
    levels: HashMap<u32, u64>,
}

/// A texture object as it was created (what the queries answer).
#[derive(Debug, Clone, PartialEq)]
pub struct TextureRecord {
    pub res_type: i32,
    pub array: u64,
    pub mipmap: u64,
    pub dev_ptr: u64,
    pub desc: ChannelFormatDesc,
    pub width: u64,
    pub height: u64,
    pub pitch: u64,
    pub size: u64,
    pub tex_desc: TextureDescWire,
    pub view: Option<ResourceViewWire>,
}

struct Inner {
    arrays: HandleTable<Array>,
    mipmaps: HandleTable<Mipmapped>,
    textures: HashMap<u64, TextureRecord>,
    /// Surface objects, with the array handle each was made of.
    surfaces: HashMap<u64, u64>,
    /// Texture and surface objects held at most.
    object_limit: usize,
    /// Bytes of every array and mipmapped array.
    bytes: u64,
}

pub struct ArrayRegistry {
    inner: Mutex<Inner>,
}

/// What a texture's resource resolved to: the backend's array and its shape.
pub struct Resolved {
    pub raw: Raw,
    pub shape: Shape,
}

impl ArrayRegistry {
    /// The arrays of a session that may hold `limit` arrays, `limit` mipmapped arrays and
    /// `limit` texture and surface objects at once.
    pub fn new(limit: u64) -> Self {
        ArrayRegistry {
            inner: Mutex::new(Inner {
                arrays: HandleTable::new(HandleKind::Array, limit),
                mipmaps: HandleTable::new(HandleKind::MipmappedArray, limit),
                textures: HashMap::new(),
                surfaces: HashMap::new(),
                object_limit: usize::try_from(limit).unwrap_or(usize::MAX),
                bytes: 0,
            }),
        }
    }

    /// Bytes of device memory the session's arrays take (in CUDA's packed layout).
    pub fn bytes(&self) -> u64 {
        self.inner.lock().bytes
    }

    /// Whether the session holds no array, mipmapped array, texture or surface object.
    pub fn is_empty(&self) -> bool {
        let g = self.inner.lock();
        g.arrays.is_empty() && g.mipmaps.is_empty() && g.textures.is_empty() && g.surfaces.is_empty()
    }

    /// A new array (`levels` None) or mipmapped array of `shape`; its handle.
    pub fn create(
        &self,
        backend: &dyn Backend,
        device: i32,
        shape: Shape,
        levels: Option<u32>,
        new: &NewHandle<'_>,
    ) -> Result<u64, CudaError> {
        let raw = backend.array_create(device, &shape.spec(levels))?;
        let bytes = shape.bytes;
        let mut g = self.inner.lock();
        let added = match levels {
            None => g.arrays.add(Array { raw, shape, level_of: None }, new),
            Some(_) => g.mipmaps.add(Mipmapped { raw, shape, levels: HashMap::new() }, new),
        };
        match added {
            Ok(h) => {
                g.bytes += bytes;
                Ok(h)
            }
            Err(e) => {
                drop(g);
                let _ = backend.array_destroy(raw, levels.is_some());
                Err(e)
            }
        }
    }

    /// Destroy an array (not a level: it goes with its mipmapped array).
    pub fn destroy(&self, backend: &dyn Backend, handle: u64) -> Result<(), CudaError> {
        let mut g = self.inner.lock();
        match g.arrays.get(handle) {
            Ok(a) if a.level_of.is_none() => {}
            Ok(_) => return Err(CudaError::InvalidValue),
            Err(e) => return Err(e),
        }
        let a = g.arrays.remove(handle)?;
        g.bytes -= a.shape.bytes;
        drop(g);
        backend.array_destroy(a.raw, false)
    }

    pub fn destroy_mipmapped(&self, backend: &dyn Backend, handle: u64) -> Result<(), CudaError> {
        let mut g = self.inner.lock();
        let m = g.mipmaps.remove(handle)?;
        g.arrays.retain(|a| a.level_of != Some(handle));
        g.bytes -= m.shape.bytes;
        drop(g);
        backend.array_destroy(m.raw, true)
    }

    /// The handle of level `level` of a mipmapped array (the same one every time).
    pub fn level(&self, backend: &dyn Backend, mipmap: u64, level: u32) -> Result<u64, CudaError> {
        let mut g = self.inner.lock();
        let m = g.mipmaps.get(mipmap)?;
        if let Some(&h) = m.levels.get(&level) {
            return Ok(h);
        }
        let shape = m.shape.level(level).ok_or(CudaError::InvalidValue)?;
        let raw = backend.mipmap_level(m.raw, level)?;
        // Levels are not counted against the limit: a mipmapped array has at most 32.
        let h =
            g.arrays.insert(Array { raw, shape, level_of: Some(mipmap) }).map_err(|_| CudaError::MemoryAllocation)?;
        g.mipmaps.get_mut(mipmap)?.levels.insert(level, h);
        Ok(h)
    }

    /// The backend's array behind an `array` handle, and its shape.
    pub fn array(&self, handle: u64) -> Result<Resolved, CudaError> {
        let g = self.inner.lock();
        let a = g.arrays.get(handle)?;
        Ok(Resolved { raw: a.raw, shape: a.shape.clone() })
    }

    pub fn mipmapped(&self, handle: u64) -> Result<Resolved, CudaError> {
        let g = self.inner.lock();
        let m = g.mipmaps.get(handle)?;
        Ok(Resolved { raw: m.raw, shape: m.shape.clone() })
    }

    /// Record a texture object the backend made (`make` runs under the registry's lock, so
    /// the limit holds).
    pub fn add_texture(
        &self,
        record: TextureRecord,
        make: impl FnOnce() -> Result<u64, CudaError>,
        full: &dyn Fn() -> CudaError,
    ) -> Result<u64, CudaError> {
        let mut g = self.inner.lock();
        if g.textures.len() + g.surfaces.len() >= g.object_limit {
            return Err(full());
        }
        let object = make()?;
        g.textures.insert(object, record);
        Ok(object)
    }

    pub fn texture(&self, object: u64) -> Result<TextureRecord, CudaError> {
        self.inner.lock().textures.get(&object).cloned().ok_or(CudaError::InvalidValue)
    }

    pub fn destroy_texture(&self, backend: &dyn Backend, object: u64) -> Result<(), CudaError> {
        let mut g = self.inner.lock();
        g.textures.remove(&object).ok_or(CudaError::InvalidValue)?;
        backend.texture_destroy(object)
    }

    /// A surface object of the array behind `array` (made with cudaArraySurfaceLoadStore).
    pub fn add_surface(
        &self,
        backend: &dyn Backend,
        array: u64,
        full: &dyn Fn() -> CudaError,
    ) -> Result<u64, CudaError> {
        let mut g = self.inner.lock();
        let a = g.arrays.get(array)?;
        if a.shape.flags & SURFACE_LOAD_STORE == 0 {
            return Err(CudaError::InvalidValue);
        }
        let raw = a.raw;
        if g.textures.len() + g.surfaces.len() >= g.object_limit {
            return Err(full());
        }
        let object = backend.surface_create(raw)?;
        g.surfaces.insert(object, array);
        Ok(object)
    }

    /// The array handle a surface object was made of.
    pub fn surface(&self, object: u64) -> Result<u64, CudaError> {
        self.inner.lock().surfaces.get(&object).copied().ok_or(CudaError::InvalidValue)
    }

    pub fn destroy_surface(&self, backend: &dyn Backend, object: u64) -> Result<(), CudaError> {
        let mut g = self.inner.lock();
        g.surfaces.remove(&object).ok_or(CudaError::InvalidValue)?;
        backend.surface_destroy(object)
    }

    /// Destroy everything (a device reset, the session's end): objects first, then arrays.
    pub fn release_all(&self, backend: &dyn Backend) {
        let mut g = self.inner.lock();
        for (object, _) in g.textures.drain() {
            let _ = backend.texture_destroy(object);
        }
        for (object, _) in g.surfaces.drain() {
            let _ = backend.surface_destroy(object);
        }
        for (_, a) in g.arrays.drain() {
            if a.level_of.is_none() {
                let _ = backend.array_destroy(a.raw, false);
            }
        }
        for (_, m) in g.mipmaps.drain() {
            let _ = backend.array_destroy(m.raw, true);
        }
        g.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(bits: i32, kind: i32) -> ChannelFormatDesc {
        ChannelFormatDesc { x: bits, y: 0, z: 0, w: 0, f: kind }
    }

    /// The size the guest accounts (phos_protocol::types::array_bytes) is the layout's.
    #[test]
    fn accounted_bytes_are_the_layouts() {
        let four = ChannelFormatDesc { x: 32, y: 32, z: 32, w: 32, f: 2 };
        for (d, extent, flags, levels) in [
            (desc(8, 1), [100, 0, 0], 0, None),
            (desc(32, 2), [33, 17, 0], 0, None),
            (four, [8, 8, 8], 0, None),
            (desc(16, 0), [16, 16, 5], 1, None),
            (desc(8, 1), [7, 0, 3], 1, None),
            (desc(32, 2), [16, 16, 6], 4, None),
            (desc(32, 2), [16, 16, 12], 5, Some(3)),
            (desc(8, 1), [100, 60, 0], 0, Some(9)),
            (four, [9, 5, 3], 0, Some(4)),
        ] {
            let shape = Shape::new(d, extent, flags, levels).unwrap();
            let esize = d.element_size().unwrap();
            let accounted = phos_protocol::types::array_bytes(esize, extent, flags, levels.unwrap_or(0)).unwrap();
            assert_eq!(accounted, shape.bytes, "{extent:?} flags {flags} levels {levels:?}");
        }
    }

    #[test]
    fn shapes_cuda_refuses_are_refused() {
        let bad_format = ChannelFormatDesc { x: 8, y: 16, z: 0, w: 0, f: 1 };
        assert_eq!(Shape::new(bad_format, [4, 4, 0], 0, None).err(), Some(CudaError::InvalidChannelDescriptor));
        assert_eq!(Shape::new(desc(8, 1), [0, 4, 0], 0, None).err(), Some(CudaError::InvalidValue));
        assert_eq!(Shape::new(desc(8, 1), [4, 4, 0], 0x40, None).err(), Some(CudaError::InvalidValue), "sparse");
        assert_eq!(Shape::new(desc(8, 1), [1 << 40, 4, 0], 0, None).err(), Some(CudaError::InvalidValue));
        assert_eq!(Shape::new(desc(8, 1), [4, 5, 6], 4, None).err(), Some(CudaError::InvalidValue), "cubemap");
    }

    #[test]
    fn copies_must_fit_the_first_level_in_whole_elements() {
        let s = Shape::new(ChannelFormatDesc { x: 16, y: 16, z: 0, w: 0, f: 0 }, [10, 4, 3], 1, None).unwrap();
        assert!(s.holds([0, 0, 0], [40, 4, 3]));
        assert!(s.holds([36, 3, 2], [4, 1, 1]));
        assert!(!s.holds([2, 0, 0], [4, 1, 1]), "half an element");
        assert!(!s.holds([0, 0, 0], [42, 1, 1]), "past the row");
        assert!(!s.holds([0, 4, 0], [4, 1, 1]), "past the rows");
        assert!(!s.holds([0, 0, 3], [4, 1, 1]), "past the layers");
        assert!(!s.holds([u64::MAX - 3, 0, 0], [4, 1, 1]), "wrapping");
        let level = Shape::new(desc(32, 2), [16, 8, 0], 0, Some(4)).unwrap().level(2).unwrap();
        assert_eq!(level.extent, [4, 2, 0]);
        assert!(level.holds([0, 0, 0], [16, 2, 1]) && !level.holds([0, 0, 0], [20, 1, 1]));
    }
}
