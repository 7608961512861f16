//! The `emu` backend's CUDA arrays, texture objects and surface objects. An array lives in an
//! anonymous mapping of the server, in the packed layout `phos_ptx::exec::ArrayDesc::from_cuda`
//! gives (each level's rows, slices and layers one after another); texture and surface objects
//! are the interpreter's descriptors of it, which kernels reach through
//! `exec::run_with_resources`. The interpreter checks every texel access against the launch's
//! memory, which [`ArrayStore::for_launch`] extends with the arrays' mappings.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use phos_protocol::CudaError;
use phos_protocol::types::ResourceViewWire;
use phos_ptx::exec::{ArrayDesc, GlobalMemory, Resource, ResourceTable, Surface, Texture, TextureDesc, TextureError};

use super::{ArraySide, ArraySpec, Raw, TextureSource};
use crate::registry::memory::MemoryView;

/// An anonymous mapping holding an array's texels; unmapped when the last array, level,
/// texture or surface that uses it has gone.
pub(super) struct Storage {
    addr: u64,
    len: usize,
}

impl Storage {
    fn new(len: u64) -> Result<Storage, CudaError> {
        let len = usize::try_from(len.max(1)).map_err(|_| CudaError::MemoryAllocation)?;
        // SAFETY: a fresh private anonymous mapping, at an address the kernel picks: nothing
        // of the process is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(CudaError::MemoryAllocation);
        }
        Ok(Storage { addr: p as u64, len })
    }

    fn range(&self) -> Range<u64> {
        self.addr..self.addr + self.len as u64
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        // SAFETY: this storage's own mapping; every descriptor naming it held an `Arc` to it,
        // so none is left.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

struct EmuArray {
    desc: ArrayDesc,
    storage: Arc<Storage>,
    mipmapped: bool,
    /// The mipmapped array this is a level of.
    level_of: Option<Raw>,
}

/// The backend's arrays and objects.
#[derive(Default)]
pub(super) struct ArrayStore {
    arrays: HashMap<Raw, EmuArray>,
    table: ResourceTable,
    /// The storage each texture or surface object reads, kept while the object lives.
    object_storage: HashMap<u64, Arc<Storage>>,
}

/// The launch's memory: the session's, and the arrays' mappings.
pub(super) struct WithArrays<'a, 'v> {
    view: &'a MemoryView<'v>,
    arrays: Vec<Range<u64>>,
}

impl GlobalMemory for WithArrays<'_, '_> {
    fn region(&self, addr: u64) -> Option<Range<u64>> {
        MemoryView::region(self.view, addr).or_else(|| self.arrays.iter().find(|r| r.contains(&addr)).cloned())
    }
}

fn texture_error(e: TextureError) -> CudaError {
    tracing::debug!("emu: {e}");
    CudaError(e.cuda_error())
}

impl ArrayStore {
    /// The bytes an array's storage takes.
    pub(super) fn bytes(spec: &ArraySpec) -> Result<u64, CudaError> {
        let levels = spec.levels.unwrap_or(1);
        let (_, bytes) =
            ArrayDesc::from_cuda(spec.format, spec.extent, spec.flags, levels, 0).map_err(texture_error)?;
        Ok(bytes)
    }

    /// A new array under `raw`.
    pub(super) fn create(&mut self, raw: Raw, spec: &ArraySpec) -> Result<(), CudaError> {
        let storage = Arc::new(Storage::new(Self::bytes(spec)?)?);
        let levels = spec.levels.unwrap_or(1);
        let (desc, _) =
            ArrayDesc::from_cuda(spec.format, spec.extent, spec.flags, levels, storage.addr).map_err(texture_error)?;
        self.arrays.insert(raw, EmuArray { desc, storage, mipmapped: spec.levels.is_some(), level_of: None });
        Ok(())
    }

    /// Destroy an array or mipmapped array and its levels; the bytes given back.
    pub(super) fn destroy(&mut self, raw: Raw) -> Result<u64, CudaError> {
        match self.arrays.get(&raw) {
            Some(a) if a.level_of.is_none() => {}
            _ => return Err(CudaError::InvalidValue),
        }
        self.arrays.retain(|_, a| a.level_of != Some(raw));
        let a = self.arrays.remove(&raw).ok_or(CudaError::InvalidValue)?;
        Ok(a.storage.len as u64)
    }

    pub(super) fn level(&mut self, mipmap: Raw, level: u32, raw: Raw) -> Result<(), CudaError> {
        let m = self.arrays.get(&mipmap).filter(|m| m.mipmapped).ok_or(CudaError::InvalidResourceHandle)?;
        let l = *m.desc.levels.get(level as usize).ok_or(CudaError::InvalidValue)?;
        let desc = ArrayDesc { levels: vec![l], ..m.desc.clone() };
        let level = EmuArray { desc, storage: m.storage.clone(), mipmapped: false, level_of: Some(mipmap) };
        self.arrays.insert(raw, level);
        Ok(())
    }

    /// The address of one side's row `y` of slice `z`, and the bytes from there to the end of
    /// its storage (an array's), for a copy `width` bytes wide.
    fn row(&self, side: &ArraySide<'_>, y: u64, z: u64, width: u64) -> Result<Option<u64>, CudaError> {
        let bad = || CudaError::InvalidValue;
        Ok(match *side {
            ArraySide::Array { raw, x, y: y0, z: z0 } => {
                let a = self.arrays.get(&raw).ok_or(CudaError::InvalidResourceHandle)?;
                let l = a.desc.levels[0];
                let offset = (l.base - a.storage.addr) + (z0 + z) * l.slice_pitch + (y0 + y) * l.row_pitch + x;
                // The service checked the corner and extent against the shape; this keeps a
                // mistake there from reaching past the mapping.
                if offset.checked_add(width).is_none_or(|end| end > a.storage.len as u64) {
                    return Err(bad());
                }
                Some(a.storage.addr + offset)
            }
            ArraySide::Device { addr, pitch, slice } => Some(addr + z * slice + y * pitch),
            ArraySide::Host(_) | ArraySide::HostOut(_) => None,
        })
    }

    /// A copy of `[width, height, depth]` between two sides (the service checked both).
    pub(super) fn copy(
        &self,
        mut dst: ArraySide<'_>,
        src: ArraySide<'_>,
        [w, h, d]: [u64; 3],
    ) -> Result<(), CudaError> {
        for z in 0..d {
            for y in 0..h {
                let packed = ((z * h + y) * w) as usize;
                let from = match (&src, self.row(&src, y, z, w)?) {
                    (_, Some(addr)) => addr as *const u8,
                    (ArraySide::Host(bytes), None) => bytes[packed..packed + w as usize].as_ptr(),
                    _ => return Err(CudaError::InvalidValue),
                };
                let to = match self.row(&dst, y, z, w)? {
                    Some(addr) => addr as *mut u8,
                    None => match &mut dst {
                        ArraySide::HostOut(bytes) => bytes[packed..packed + w as usize].as_mut_ptr(),
                        _ => return Err(CudaError::InvalidValue),
                    },
                };
                // SAFETY: both rows are `w` bytes of memory this process has mapped: an
                // array's storage (checked just above), the session's device memory (checked
                // by the service), or the request's buffers (sliced above). Rows of one array
                // may overlap (`copy`, not `copy_nonoverlapping`).
                unsafe { std::ptr::copy(from, to, w as usize) };
            }
        }
        Ok(())
    }

    pub(super) fn texture(
        &mut self,
        handle: u64,
        source: &TextureSource,
        desc: &TextureDesc,
        view: Option<&ResourceViewWire>,
    ) -> Result<(), CudaError> {
        // Views are carried only where they change nothing: the whole resource, its format.
        if let Some(v) = view
            && (v.format != 0 || v.first_mipmap_level != 0 || v.first_layer != 0)
        {
            return Err(CudaError::NotSupported);
        }
        let array = |raw: &Raw, mipmapped: bool| -> Result<(ArrayDesc, Option<Arc<Storage>>), CudaError> {
            let a =
                self.arrays.get(raw).filter(|a| a.mipmapped == mipmapped).ok_or(CudaError::InvalidResourceHandle)?;
            Ok((a.desc.clone(), Some(a.storage.clone())))
        };
        let fits = |x: u64| u32::try_from(x).map_err(|_| CudaError::InvalidValue);
        let (resource, storage) = match *source {
            TextureSource::Array { raw, .. } => {
                let (a, s) = array(&raw, false)?;
                (Resource::Array(a), s)
            }
            TextureSource::Mipmapped { raw, .. } => {
                let (a, s) = array(&raw, true)?;
                (Resource::Mipmapped(a), s)
            }
            TextureSource::Linear { addr, format, size } => (Resource::Linear { base: addr, format, size }, None),
            TextureSource::Pitch2D { addr, format, width, height, pitch } => {
                (Resource::Pitch2D { base: addr, format, width: fits(width)?, height: fits(height)?, pitch }, None)
            }
        };
        let texture = Texture { resource, desc: *desc };
        texture.validate().map_err(texture_error)?;
        self.table.textures.insert(handle, Arc::new(texture));
        if let Some(s) = storage {
            self.object_storage.insert(handle, s);
        }
        Ok(())
    }

    /// Whether a texture or surface object has the value `handle`.
    pub(super) fn has_object(&self, handle: u64) -> bool {
        self.table.textures.contains_key(&handle) || self.table.surfaces.contains_key(&handle)
    }

    pub(super) fn destroy_texture(&mut self, handle: u64) -> Result<(), CudaError> {
        self.table.textures.remove(&handle).ok_or(CudaError::InvalidValue)?;
        self.object_storage.remove(&handle);
        Ok(())
    }

    pub(super) fn surface(&mut self, handle: u64, array: Raw) -> Result<(), CudaError> {
        let a = self.arrays.get(&array).filter(|a| !a.mipmapped).ok_or(CudaError::InvalidResourceHandle)?;
        self.table.surfaces.insert(handle, Arc::new(Surface { array: a.desc.clone() }));
        self.object_storage.insert(handle, a.storage.clone());
        Ok(())
    }

    pub(super) fn destroy_surface(&mut self, handle: u64) -> Result<(), CudaError> {
        self.table.surfaces.remove(&handle).ok_or(CudaError::InvalidValue)?;
        self.object_storage.remove(&handle);
        Ok(())
    }

    /// What a launch needs: the objects, and the memory extended with every array's storage.
    pub(super) fn for_launch<'a, 'v>(&self, view: &'a MemoryView<'v>) -> (ResourceTable, WithArrays<'a, 'v>) {
        let arrays =
            self.arrays.values().map(|a| &a.storage).chain(self.object_storage.values()).map(|s| s.range()).collect();
        (self.table.clone(), WithArrays { view, arrays })
    }
}
