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
use crate::backend::{ArraySide, ArraySpec, Raw, TextureSource};

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

    /// The box of level `level` as a copy takes it: row bytes, rows, slices times layers.
    fn level_box(&self, level: usize) -> Option<[u64; 3]> {
        let l = self.layout.levels.get(level)?;
        let esize = u64::from(self.format.element_size());
        let slices = u64::from(l.depth.max(1)) * u64::from(self.layout.layers.max(1));
        Some([u64::from(l.width) * esize, u64::from(l.height.max(1)), slices])
    }

    /// Bytes of every level's texels, packed (what a checkpoint copies).
    pub fn content_bytes(&self) -> u64 {
        (0..self.layout.levels.len()).filter_map(|l| self.level_box(l)).map(|[w, h, d]| w * h * d).sum()
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
    /// The device it was made on (the guest's number).
    device: i32,
    /// The mipmapped array this is a level of.
    level_of: Option<u64>,
}

struct Mipmapped {
    raw: Raw,
    shape: Shape,
    device: i32,
    /// Handles of the levels asked for so far.
    levels: HashMap<u32, u64>,
    /// The backend's arrays of levels a checkpoint read (the guest was not handed them).
    read_levels: HashMap<u32, Raw>,
}

/// A texture object as it was created (what the queries answer).
#[derive(Debug, Clone, PartialEq, bincode::Encode, bincode::Decode)]
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
    /// Texture objects, with the device each was made on.
    textures: HashMap<u64, (TextureRecord, i32)>,
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
            None => g.arrays.add(Array { raw, shape, device, level_of: None }, new),
            Some(_) => g
                .mipmaps
                .add(Mipmapped { raw, shape, device, levels: HashMap::new(), read_levels: HashMap::new() }, new),
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
        let device = m.device;
        let raw = match m.read_levels.get(&level) {
            Some(&raw) => raw,
            None => backend.mipmap_level(m.raw, level)?,
        };
        // Levels are not counted against the limit: a mipmapped array has at most 32.
        let h = g
            .arrays
            .insert(Array { raw, shape, device, level_of: Some(mipmap) })
            .map_err(|_| CudaError::MemoryAllocation)?;
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
        device: i32,
        make: impl FnOnce() -> Result<u64, CudaError>,
        full: &dyn Fn() -> CudaError,
    ) -> Result<u64, CudaError> {
        let mut g = self.inner.lock();
        if g.textures.len() + g.surfaces.len() >= g.object_limit {
            return Err(full());
        }
        let object = make()?;
        g.textures.insert(object, (record, device));
        Ok(object)
    }

    pub fn texture(&self, object: u64) -> Result<TextureRecord, CudaError> {
        self.inner.lock().textures.get(&object).map(|t| t.0.clone()).ok_or(CudaError::InvalidValue)
    }

    /// The ranges of device memory the session's texture objects of linear and pitched
    /// memory read (kernels reach them through the objects, not their parameters).
    pub fn linear_ranges(&self) -> Vec<(u64, u64)> {
        let g = self.inner.lock();
        g.textures.values().filter_map(|(t, _)| linear_range(t)).collect()
    }

    /// Bytes a checkpoint would copy of the arrays' contents.
    pub fn content_bytes(&self) -> u64 {
        let g = self.inner.lock();
        let plain: u64 =
            g.arrays.iter().filter(|(_, a)| a.level_of.is_none()).map(|(_, a)| a.shape.content_bytes()).sum();
        plain + g.mipmaps.iter().map(|(_, m)| m.shape.content_bytes()).sum::<u64>()
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

    /// What a checkpoint holds of the arrays and objects (the session at rest: nothing
    /// writes an array meanwhile): every array and mipmapped array with its contents, read
    /// back from the backend level by level, the level handles the guest was handed, the
    /// texture and surface objects with what they were made of, and the handle counters.
    /// Empty for a session without any.
    pub fn snapshot(&self, backend: &dyn Backend) -> Result<Vec<u8>, CudaError> {
        let mut g = self.inner.lock();
        if g.arrays.is_empty() && g.mipmaps.is_empty() && g.textures.is_empty() && g.surfaces.is_empty() {
            return Ok(Vec::new());
        }
        let mut image = ArraysImage { next: [g.arrays.next_counter(), g.mipmaps.next_counter()], ..Default::default() };
        for (handle, a) in g.arrays.iter().filter(|(_, a)| a.level_of.is_none()) {
            backend.bind(a.device)?;
            image.arrays.push(ArrayImage {
                handle,
                device: a.device,
                desc: a.shape.desc,
                extent: a.shape.extent,
                flags: a.shape.flags,
                levels: 0,
                level_handles: Vec::new(),
                contents: read_levels(backend, &a.shape, &[a.raw])?,
            });
        }
        let mipmaps: Vec<u64> = g.mipmaps.iter().map(|(h, _)| h).collect();
        for handle in mipmaps {
            let m = g.mipmaps.get_mut(handle)?;
            backend.bind(m.device)?;
            // The backend's array of each level: those the guest holds, else read now (and
            // kept, so that a later checkpoint or request asks the backend no more).
            let mut raws = Vec::with_capacity(m.shape.layout.levels.len());
            for level in 0..m.shape.layout.levels.len() as u32 {
                let raw = match m.read_levels.get(&level) {
                    Some(&raw) => raw,
                    None => {
                        let raw = backend.mipmap_level(m.raw, level)?;
                        m.read_levels.insert(level, raw);
                        raw
                    }
                };
                raws.push(raw);
            }
            let m = g.mipmaps.get(handle)?;
            let mut level_handles: Vec<(u32, u64)> = m.levels.iter().map(|(&l, &h)| (l, h)).collect();
            level_handles.sort_unstable();
            image.arrays.push(ArrayImage {
                handle,
                device: m.device,
                desc: m.shape.desc,
                extent: m.shape.extent,
                flags: m.shape.flags,
                levels: m.shape.layout.levels.len() as u32,
                level_handles,
                contents: read_levels(backend, &m.shape, &raws)?,
            });
        }
        image.arrays.sort_unstable_by_key(|a| a.handle);
        image.objects = g
            .textures
            .iter()
            .map(|(&value, (t, device))| ObjectImage { value, device: *device, texture: Some(t.clone()), array: 0 })
            .chain(g.surfaces.iter().map(|(&value, &array)| {
                let device = g.arrays.get(array).map(|a| a.device).unwrap_or(0);
                ObjectImage { value, device, texture: None, array }
            }))
            .collect();
        image.objects.sort_unstable_by_key(|o| o.value);
        Ok(phos_protocol::encode(&image))
    }

    /// Put back what [`snapshot`](Self::snapshot) took, into a fresh session whose records
    /// have been replayed (linear memory a texture reads exists again): every array under its
    /// handle with its contents, and every texture and surface object under the value it had
    /// (kernels hold them; see [`make_objects`]). `holds` says whether linear memory is the
    /// session's. A failure leaves what was made for the session's release to destroy.
    pub fn load(&self, backend: &dyn Backend, image: &[u8], holds: &dyn Fn(u64, u64) -> bool) -> Result<(), String> {
        if image.is_empty() {
            return Ok(());
        }
        let image: ArraysImage = phos_protocol::decode(image).map_err(|e| format!("the arrays do not decode: {e}"))?;
        for a in &image.arrays {
            self.load_array(backend, a).map_err(|e| format!("CUDA array {:#x}: {e}", a.handle))?;
        }
        {
            let mut g = self.inner.lock();
            g.arrays.set_next_counter(image.next[0]);
            g.mipmaps.set_next_counter(image.next[1]);
            if image.objects.len() > g.object_limit {
                return Err(format!("{} texture and surface objects, past the session's limit", image.objects.len()));
            }
        }
        // Values in increasing order, each once.
        if image.objects.first().is_some_and(|o| o.value == 0)
            || image.objects.windows(2).any(|w| w[0].value >= w[1].value)
        {
            return Err("texture and surface objects out of order, named twice or of value 0".into());
        }
        make_objects(backend, self, &image.objects, holds)
    }

    /// What can be said of an image's arrays before anything is made: that they decode, each
    /// of a shape CUDA makes with the contents it holds, of handles of their kinds, and
    /// objects in increasing order of value, each once, no more than `limit` of each.
    pub fn check_image(image: &[u8], limit: u64) -> Result<(), String> {
        if image.is_empty() {
            return Ok(());
        }
        let image: ArraysImage = phos_protocol::decode(image).map_err(|e| format!("the arrays do not decode: {e}"))?;
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        if image.arrays.len() > limit.saturating_mul(2) || image.objects.len() > limit {
            return Err(format!(
                "{} arrays and {} objects, past the session's limits",
                image.arrays.len(),
                image.objects.len()
            ));
        }
        for a in &image.arrays {
            let levels = (a.levels > 0).then_some(a.levels);
            let kind = if levels.is_some() { HandleKind::MipmappedArray } else { HandleKind::Array };
            let bad = |why: String| Err(format!("CUDA array {:#x}: {why}", a.handle));
            if !super::handles::is_handle_of(kind, a.handle)
                || a.level_handles.iter().any(|&(_, h)| !super::handles::is_handle_of(HandleKind::Array, h))
            {
                return bad("a handle of another kind".into());
            }
            let shape = match Shape::new(a.desc, a.extent, a.flags, levels) {
                Ok(s) => s,
                Err(e) => return bad(format!("its shape: {e:?}")),
            };
            if a.contents.len() as u64 != shape.content_bytes() {
                return bad(format!("{} bytes of contents for {} of texels", a.contents.len(), shape.content_bytes()));
            }
        }
        if image.objects.first().is_some_and(|o| o.value == 0)
            || image.objects.windows(2).any(|w| w[0].value >= w[1].value)
        {
            return Err("texture and surface objects out of order, named twice or of value 0".into());
        }
        Ok(())
    }

    /// One array or mipmapped array of an image, with its contents and level handles. The
    /// records' replay made it again already (its creation is recorded, as an allocation's):
    /// it must be of the image's shape; one no record made is made here.
    fn load_array(&self, backend: &dyn Backend, a: &ArrayImage) -> Result<(), String> {
        let levels = (a.levels > 0).then_some(a.levels);
        let shape = Shape::new(a.desc, a.extent, a.flags, levels).map_err(|e| format!("its shape: {e:?}"))?;
        if levels.is_some_and(|n| n as usize != shape.layout.levels.len()) {
            return Err(format!("{} levels, where its extent allows {}", a.levels, shape.layout.levels.len()));
        }
        if a.contents.len() as u64 != shape.content_bytes() {
            return Err(format!("{} bytes of contents for {} of texels", a.contents.len(), shape.content_bytes()));
        }
        if levels.is_none() && !a.level_handles.is_empty() {
            return Err("level handles of an array that is not mipmapped".into());
        }
        backend.bind(a.device).map_err(|e| format!("device {}: {e:?}", a.device))?;
        let replayed = {
            let g = self.inner.lock();
            match levels {
                None => g.arrays.get(a.handle).ok().map(|x| (x.raw, x.shape.clone(), x.device, x.level_of.is_some())),
                Some(_) => g.mipmaps.get(a.handle).ok().map(|m| (m.raw, m.shape.clone(), m.device, false)),
            }
        };
        let raw = match replayed {
            Some((raw, made, device, level)) => {
                let same = made.desc == shape.desc
                    && made.extent == shape.extent
                    && made.flags == shape.flags
                    && made.layout.levels.len() == shape.layout.levels.len();
                if !same || device != a.device || level {
                    return Err("its record made an array of another shape or device".into());
                }
                raw
            }
            None => {
                let raw =
                    backend.array_create(a.device, &shape.spec(levels)).map_err(|e| format!("creating it: {e:?}"))?;
                let mut g = self.inner.lock();
                let put = match levels {
                    None => g
                        .arrays
                        .insert_at(a.handle, Array { raw, shape: shape.clone(), device: a.device, level_of: None }),
                    Some(_) => g.mipmaps.insert_at(
                        a.handle,
                        Mipmapped {
                            raw,
                            shape: shape.clone(),
                            device: a.device,
                            levels: HashMap::new(),
                            read_levels: HashMap::new(),
                        },
                    ),
                };
                if let Err(e) = put {
                    drop(g);
                    let _ = backend.array_destroy(raw, levels.is_some());
                    return Err(format!("its handle: {e:?}"));
                }
                g.bytes += shape.bytes;
                raw
            }
        };
        let raws = match levels {
            None => vec![raw],
            Some(_) => {
                let mut raws = Vec::with_capacity(shape.layout.levels.len());
                for level in 0..shape.layout.levels.len() as u32 {
                    let l = backend.mipmap_level(raw, level).map_err(|e| format!("level {level}: {e:?}"))?;
                    let mut g = self.inner.lock();
                    g.mipmaps.get_mut(a.handle).map_err(|e| format!("{e:?}"))?.read_levels.insert(level, l);
                    raws.push(l);
                }
                let mut g = self.inner.lock();
                for &(level, handle) in &a.level_handles {
                    let level_shape = shape.level(level).ok_or_else(|| format!("no level {level}"))?;
                    let level_array = Array {
                        raw: raws[level as usize],
                        shape: level_shape,
                        device: a.device,
                        level_of: Some(a.handle),
                    };
                    g.arrays
                        .insert_at(handle, level_array)
                        .map_err(|e| format!("the handle of level {level}: {e:?}"))?;
                    g.mipmaps.get_mut(a.handle).map_err(|e| format!("{e:?}"))?.levels.insert(level, handle);
                }
                raws
            }
        };
        write_levels(backend, &shape, &raws, &a.contents).map_err(|e| format!("writing its contents: {e:?}"))
    }

    /// What a texture record of an image reads, once the arrays are back.
    fn texture_source(&self, t: &TextureRecord, holds: &dyn Fn(u64, u64) -> bool) -> Result<TextureSource, String> {
        let format = |d: &ChannelFormatDesc| {
            ChannelFormat::from_cuda(d.x, d.y, d.z, d.w, d.f).map_err(|_| "its channel format".to_string())
        };
        match t.res_type {
            RESOURCE_ARRAY => {
                let a = self.array(t.array).map_err(|_| format!("no array {:#x}", t.array))?;
                Ok(TextureSource::Array { raw: a.raw, format: a.shape.format })
            }
            RESOURCE_MIPMAPPED => {
                let m = self.mipmapped(t.mipmap).map_err(|_| format!("no mipmapped array {:#x}", t.mipmap))?;
                Ok(TextureSource::Mipmapped { raw: m.raw, format: m.shape.format })
            }
            RESOURCE_LINEAR | RESOURCE_PITCH_2D => {
                let (addr, len) = linear_range(t).ok_or("an impossible extent")?;
                if !holds(addr, len) {
                    return Err(format!("memory {addr:#x}+{len:#x} that is not the session's"));
                }
                let f = format(&t.desc)?;
                Ok(if t.res_type == RESOURCE_LINEAR {
                    TextureSource::Linear { addr: t.dev_ptr, format: f, size: t.size }
                } else {
                    TextureSource::Pitch2D {
                        addr: t.dev_ptr,
                        format: f,
                        width: t.width,
                        height: t.height,
                        pitch: t.pitch,
                    }
                })
            }
            other => Err(format!("resource type {other}")),
        }
    }
}

/// `cudaResourceType`.
pub const RESOURCE_ARRAY: i32 = 0;
pub const RESOURCE_MIPMAPPED: i32 = 1;
pub const RESOURCE_LINEAR: i32 = 2;
pub const RESOURCE_PITCH_2D: i32 = 3;

/// The device memory a texture of linear or pitched memory reads: (start, length).
fn linear_range(t: &TextureRecord) -> Option<(u64, u64)> {
    match t.res_type {
        RESOURCE_LINEAR => Some((t.dev_ptr, t.size)),
        RESOURCE_PITCH_2D => {
            let f = ChannelFormat::from_cuda(t.desc.x, t.desc.y, t.desc.z, t.desc.w, t.desc.f).ok()?;
            let row = t.width.checked_mul(u64::from(f.element_size()))?;
            let span = t.pitch.checked_mul(t.height.saturating_sub(1))?.checked_add(row)?;
            Some((t.dev_ptr, span))
        }
        _ => None,
    }
}

/// Texture and surface objects made again that the backend gave values below the wanted
/// ones, held until every object is made, at most.
const PLACEHOLDERS: usize = 1 << 16;

/// Make the image's texture and surface objects again, each under the value the program
/// holds (kernels take them by value, where no one could translate them). A backend that
/// can make an object under a given value does (`emu`); a driver picks its own values, small
/// integers it hands out lowest first in a fresh context, so the objects are made in
/// increasing order of value, and an object the driver gives a lower value than wanted is
/// kept aside (a placeholder) while the same object is made again, until the value comes;
/// placeholders are destroyed at the end. A driver that gives a higher value than wanted
/// (the value is taken) fails the restore, naming both.
fn make_objects(
    backend: &dyn Backend,
    arrays: &ArrayRegistry,
    objects: &[ObjectImage],
    holds: &dyn Fn(u64, u64) -> bool,
) -> Result<(), String> {
    let mut placeholders: Vec<(u64, bool)> = Vec::new();
    let made = (|| -> Result<(), String> {
        for o in objects {
            backend.bind(o.device).map_err(|e| format!("device {}: {e:?}", o.device))?;
            let what = if o.texture.is_some() { "texture" } else { "surface" };
            loop {
                let got = match &o.texture {
                    Some(t) => {
                        let source = arrays.texture_source(t, holds)?;
                        let desc = crate::service::texture_desc(&t.tex_desc)
                            .map_err(|e| format!("texture object {:#x}: {e}", o.value))?;
                        backend.texture_create_as(o.value, &source, &desc, t.view.as_ref())
                    }
                    None => {
                        let a = arrays
                            .array(o.array)
                            .map_err(|_| format!("surface object {:#x}: no array {:#x}", o.value, o.array))?;
                        if a.shape.flags & SURFACE_LOAD_STORE == 0 {
                            return Err(format!(
                                "surface object {:#x} of an array made without cudaArraySurfaceLoadStore",
                                o.value
                            ));
                        }
                        backend.surface_create_as(o.value, a.raw)
                    }
                }
                .map_err(|e| format!("{what} object {:#x}: {e:?}", o.value))?;
                if got == o.value {
                    break;
                }
                if got < o.value && placeholders.len() < PLACEHOLDERS {
                    placeholders.push((got, o.texture.is_some()));
                    continue;
                }
                let _ = if o.texture.is_some() { backend.texture_destroy(got) } else { backend.surface_destroy(got) };
                return Err(format!(
                    "the backend made {what} object {:#x} again as {got:#x}, where the program holds {:#x}: restore the session on a server whose devices have no other objects",
                    o.value, o.value
                ));
            }
            let mut g = arrays.inner.lock();
            match &o.texture {
                Some(t) => {
                    g.textures.insert(o.value, (t.clone(), o.device));
                }
                None => {
                    g.surfaces.insert(o.value, o.array);
                }
            }
        }
        Ok(())
    })();
    for (value, texture) in placeholders {
        let _ = if texture { backend.texture_destroy(value) } else { backend.surface_destroy(value) };
    }
    made
}

/// Read every level of an array (`raws`: the backend's array of each level, level 0 first),
/// packed: each level's rows, slices and layers one after another.
fn read_levels(backend: &dyn Backend, shape: &Shape, raws: &[Raw]) -> Result<Vec<u8>, CudaError> {
    let mut out = vec![0u8; usize::try_from(shape.content_bytes()).map_err(|_| CudaError::MemoryAllocation)?];
    let mut at = 0usize;
    for (level, &raw) in raws.iter().enumerate() {
        let extent = shape.level_box(level).ok_or(CudaError::InvalidValue)?;
        let len = (extent[0] * extent[1] * extent[2]) as usize;
        backend.array_copy(
            ArraySide::HostOut(&mut out[at..at + len]),
            ArraySide::Array { raw, x: 0, y: 0, z: 0 },
            extent,
            None,
        )?;
        at += len;
    }
    Ok(out)
}

/// Write `contents` (as [`read_levels`] packs them) into the arrays of `raws`.
fn write_levels(backend: &dyn Backend, shape: &Shape, raws: &[Raw], contents: &[u8]) -> Result<(), CudaError> {
    let mut at = 0usize;
    for (level, &raw) in raws.iter().enumerate() {
        let extent = shape.level_box(level).ok_or(CudaError::InvalidValue)?;
        let len = (extent[0] * extent[1] * extent[2]) as usize;
        let bytes = contents.get(at..at + len).ok_or(CudaError::InvalidValue)?;
        backend.array_copy(ArraySide::Array { raw, x: 0, y: 0, z: 0 }, ArraySide::Host(bytes), extent, None)?;
        at += len;
    }
    Ok(())
}

/// What a checkpoint holds of the arrays (see [`ArrayRegistry::snapshot`]).
#[derive(Default, bincode::Encode, bincode::Decode)]
struct ArraysImage {
    /// Arrays and mipmapped arrays (not levels), by handle.
    arrays: Vec<ArrayImage>,
    /// Texture and surface objects, by value.
    objects: Vec<ObjectImage>,
    /// The next handle counters of arrays and mipmapped arrays.
    next: [u64; 2],
}

#[derive(bincode::Encode, bincode::Decode)]
struct ArrayImage {
    handle: u64,
    device: i32,
    desc: ChannelFormatDesc,
    extent: [u64; 3],
    flags: u32,
    /// 0 for an array, the level count of a mipmapped array.
    levels: u32,
    /// (level, its `array` handle) of the levels the guest was handed.
    level_handles: Vec<(u32, u64)>,
    /// Every level's texels, level 0 first, each as its rows, slices and layers.
    contents: Vec<u8>,
}

#[derive(bincode::Encode, bincode::Decode)]
struct ObjectImage {
    /// The value the program holds.
    value: u64,
    device: i32,
    /// A texture object: what it was made of; `None` for a surface object of `array`.
    texture: Option<TextureRecord>,
    array: u64,
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

    /// A checkpoint's arrays put back into a fresh session on a fresh backend: the same
    /// handles (levels handed out too), contents, counters, and objects under the values the
    /// program holds, made in a backend that has handed out other values meanwhile.
    #[test]
    fn arrays_and_objects_come_back_under_their_handles_and_values() {
        use crate::backend::emu::EmuBackend;
        let full = || CudaError::MemoryAllocation;
        let new = NewHandle { forced: None, full: &full };
        let emu = EmuBackend::new(64 << 20);
        let r = ArrayRegistry::new(16);
        let float = desc(32, 2);
        let plain = r.create(&emu, 0, Shape::new(float, [5, 3, 0], 2, None).unwrap(), None, &new).unwrap();
        let layered = r.create(&emu, 0, Shape::new(desc(8, 1), [4, 2, 3], 1, None).unwrap(), None, &new).unwrap();
        let mip = r.create(&emu, 0, Shape::new(float, [8, 8, 0], 0, Some(3)).unwrap(), Some(3), &new).unwrap();
        let level1 = r.level(&emu, mip, 1).unwrap();
        let write = |handle: u64, bytes: &[u8], extent: [u64; 3]| {
            let a = r.array(handle).unwrap();
            emu.array_copy(ArraySide::Array { raw: a.raw, x: 0, y: 0, z: 0 }, ArraySide::Host(bytes), extent, None)
                .unwrap();
        };
        let texels: Vec<u8> = (0..60).collect();
        write(plain, &texels, [20, 3, 1]);
        let layers: Vec<u8> = (100..124).collect();
        write(layered, &layers, [4, 2, 3]);
        let level: Vec<u8> = (0..64).map(|i| 200 - i).collect();
        write(level1, &level, [16, 4, 1]);
        let record = TextureRecord {
            res_type: RESOURCE_ARRAY,
            array: plain,
            mipmap: 0,
            dev_ptr: 0,
            desc: float,
            width: 0,
            height: 0,
            pitch: 0,
            size: 0,
            tex_desc: TextureDescWire::default(),
            view: None,
        };
        let source =
            TextureSource::Array { raw: r.array(plain).unwrap().raw, format: r.array(plain).unwrap().shape.format };
        let tex_desc = crate::service::texture_desc(&record.tex_desc).unwrap();
        let texture = r.add_texture(record.clone(), 0, || emu.texture_create(&source, &tex_desc, None), &full).unwrap();
        let surface = r.add_surface(&emu, plain, &full).unwrap();
        assert_eq!(r.add_surface(&emu, layered, &full).err(), Some(CudaError::InvalidValue), "no load/store flag");
        let image = r.snapshot(&emu).unwrap();
        assert!(ArrayRegistry::new(16).snapshot(&emu).unwrap().is_empty(), "nothing for a session without arrays");
        // What a restore checks before it makes anything.
        ArrayRegistry::check_image(&image, 16).unwrap();
        assert!(ArrayRegistry::check_image(&image[..image.len() - 1], 16).is_err(), "cut short");
        assert!(ArrayRegistry::check_image(&[7; 40], 16).is_err(), "not an image's");
        assert!(ArrayRegistry::check_image(&image, 1).is_err(), "past the limits");

        let emu2 = EmuBackend::new(64 << 20);
        // Values the new backend hands out meanwhile do not matter.
        for _ in 0..5 {
            emu2.stream_create(0, 1, 0).unwrap();
        }
        let back = ArrayRegistry::new(16);
        back.load(&emu2, &image, &|_, _| true).unwrap();
        let read = |reg: &ArrayRegistry, emu: &EmuBackend, handle: u64, extent: [u64; 3]| {
            let a = reg.array(handle).unwrap();
            let mut out = vec![0u8; (extent[0] * extent[1] * extent[2]) as usize];
            emu.array_copy(
                ArraySide::HostOut(&mut out),
                ArraySide::Array { raw: a.raw, x: 0, y: 0, z: 0 },
                extent,
                None,
            )
            .unwrap();
            out
        };
        assert_eq!(read(&back, &emu2, plain, [20, 3, 1]), texels);
        assert_eq!(read(&back, &emu2, layered, [4, 2, 3]), layers);
        assert_eq!(read(&back, &emu2, level1, [16, 4, 1]), level);
        assert_eq!(back.level(&emu2, mip, 1).unwrap(), level1, "the level handle handed out");
        let level2 = back.level(&emu2, mip, 2).unwrap();
        assert!(level2 > level1, "a new level handle comes from the counter: {level2:#x}");
        assert_eq!(back.texture(texture).unwrap(), record);
        assert_eq!(back.surface(surface).unwrap(), plain);
        assert_eq!(back.bytes(), r.bytes());
        assert_eq!(back.content_bytes(), r.content_bytes());
        // New objects never take a restored value, and new arrays get new handles.
        let another = back.add_surface(&emu2, plain, &full).unwrap();
        assert!(another != surface && another != texture);
        let newer = back.create(&emu2, 0, Shape::new(float, [2, 0, 0], 0, None).unwrap(), None, &new).unwrap();
        assert!(newer > layered);
        // An image loads into a session once: the handles are taken.
        assert!(back.load(&emu2, &image, &|_, _| true).is_err());
        back.release_all(&emu2);
        r.release_all(&emu);
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
