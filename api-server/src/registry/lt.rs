//! The session's cuBLASLt objects: handles (kind `cublaslt_handle`) and the four kinds of
//! descriptor (matmul descriptors, matrix layouts, matmul preferences, transform descriptors),
//! each a virtual handle of its kind. A descriptor is its attributes: the registry keeps every
//! attribute's value as cuBLASLt stores it (the bytes of its C type), with cuBLASLt's defaults,
//! so the server can size and check a matmul from them and a restore can set them again.

use parking_lot::Mutex;
use phos_protocol::CudaError;
use phos_protocol::apis::HandleKind;

use super::handles::{HandleTable, NewHandle};
use crate::backend::Backend;
use crate::fast_hash::FoldHash;

/// cuBLASLt objects of each kind a session may hold at once.
pub const MAX_LT_OBJECTS: u64 = 65536;

/// One attribute of a descriptor kind: its number, the size of its C type, and its default.
#[derive(Debug, Clone, Copy)]
pub struct AttributeSpec {
    pub id: i32,
    pub size: usize,
    pub default: i64,
}

const fn a(id: i32, size: usize, default: i64) -> AttributeSpec {
    AttributeSpec { id, size, default }
}

/// The kinds of descriptor, with their attributes (cublasLt.h of CUDA 11.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DescKind {
    Matmul,
    Layout,
    Preference,
    Transform,
}

/// Matmul descriptor attributes (`cublasLtMatmulDescAttributes_t`).
pub mod matmul {
    pub const COMPUTE_TYPE: i32 = 0;
    pub const SCALE_TYPE: i32 = 1;
    pub const POINTER_MODE: i32 = 2;
    pub const TRANSA: i32 = 3;
    pub const TRANSB: i32 = 4;
    pub const TRANSC: i32 = 5;
    pub const FILL_MODE: i32 = 6;
    pub const EPILOGUE: i32 = 7;
    pub const BIAS_POINTER: i32 = 8;
    pub const BIAS_BATCH_STRIDE: i32 = 10;
    pub const EPILOGUE_AUX_POINTER: i32 = 11;
    pub const EPILOGUE_AUX_LD: i32 = 12;
    pub const EPILOGUE_AUX_BATCH_STRIDE: i32 = 13;
    pub const ALPHA_VECTOR_BATCH_STRIDE: i32 = 14;
    pub const SM_COUNT_TARGET: i32 = 15;
    pub const A_SCALE_POINTER: i32 = 17;
    pub const B_SCALE_POINTER: i32 = 18;
    pub const C_SCALE_POINTER: i32 = 19;
    pub const D_SCALE_POINTER: i32 = 20;
    pub const AMAX_D_POINTER: i32 = 21;
    pub const EPILOGUE_AUX_DATA_TYPE: i32 = 22;
    pub const EPILOGUE_AUX_SCALE_POINTER: i32 = 23;
    pub const EPILOGUE_AUX_AMAX_POINTER: i32 = 24;
    pub const FAST_ACCUM: i32 = 25;
    pub const BIAS_DATA_TYPE: i32 = 26;
}

/// Matrix layout attributes (`cublasLtMatrixLayoutAttribute_t`).
pub mod layout {
    pub const TYPE: i32 = 0;
    pub const ORDER: i32 = 1;
    pub const ROWS: i32 = 2;
    pub const COLS: i32 = 3;
    pub const LD: i32 = 4;
    pub const BATCH_COUNT: i32 = 5;
    pub const STRIDED_BATCH_OFFSET: i32 = 6;
    pub const PLANE_OFFSET: i32 = 7;
}

/// Matmul preference attributes (`cublasLtMatmulPreferenceAttributes_t`).
pub mod preference {
    pub const MAX_WORKSPACE_BYTES: i32 = 1;
}

/// Transform descriptor attributes (`cublasLtMatrixTransformDescAttributes_t`).
pub mod transform {
    pub const SCALE_TYPE: i32 = 0;
    pub const POINTER_MODE: i32 = 1;
    pub const TRANSA: i32 = 2;
    pub const TRANSB: i32 = 3;
}

impl DescKind {
    pub fn handle_kind(self) -> HandleKind {
        match self {
            DescKind::Matmul => HandleKind::CublasltMatmulDesc,
            DescKind::Layout => HandleKind::CublasltMatrixLayout,
            DescKind::Preference => HandleKind::CublasltMatmulPreference,
            DescKind::Transform => HandleKind::CublasltMatrixTransformDesc,
        }
    }

    /// The name of the kind in the specs (and in checkpoint images' counters).
    pub fn kind_name(self) -> &'static str {
        match self {
            DescKind::Matmul => "cublaslt_matmul_desc",
            DescKind::Layout => "cublaslt_matrix_layout",
            DescKind::Preference => "cublaslt_matmul_preference",
            DescKind::Transform => "cublaslt_matrix_transform_desc",
        }
    }

    /// The attributes of the kind (default -1 where cuBLASLt's is "same as another").
    pub const fn attributes(self) -> &'static [AttributeSpec] {
        use matmul as m;
        const MATMUL: &[AttributeSpec] = &[
            a(m::COMPUTE_TYPE, 4, 0),
            a(m::SCALE_TYPE, 4, 0),
            a(m::POINTER_MODE, 4, 0),
            a(m::TRANSA, 4, 0),
            a(m::TRANSB, 4, 0),
            a(m::TRANSC, 4, 0),
            a(m::FILL_MODE, 4, 2),
            a(m::EPILOGUE, 4, 1),
            a(m::BIAS_POINTER, 8, 0),
            a(m::BIAS_BATCH_STRIDE, 8, 0),
            a(m::EPILOGUE_AUX_POINTER, 8, 0),
            a(m::EPILOGUE_AUX_LD, 8, 0),
            a(m::EPILOGUE_AUX_BATCH_STRIDE, 8, 0),
            a(m::ALPHA_VECTOR_BATCH_STRIDE, 8, 0),
            a(m::SM_COUNT_TARGET, 4, 0),
            a(m::A_SCALE_POINTER, 8, 0),
            a(m::B_SCALE_POINTER, 8, 0),
            a(m::C_SCALE_POINTER, 8, 0),
            a(m::D_SCALE_POINTER, 8, 0),
            a(m::AMAX_D_POINTER, 8, 0),
            a(m::EPILOGUE_AUX_DATA_TYPE, 4, -1),
            a(m::EPILOGUE_AUX_SCALE_POINTER, 8, 0),
            a(m::EPILOGUE_AUX_AMAX_POINTER, 8, 0),
            a(m::FAST_ACCUM, 1, 0),
            a(m::BIAS_DATA_TYPE, 4, -1),
        ];
        const LAYOUT: &[AttributeSpec] = &[
            a(layout::TYPE, 4, 0),
            a(layout::ORDER, 4, 0),
            a(layout::ROWS, 8, 0),
            a(layout::COLS, 8, 0),
            a(layout::LD, 8, 0),
            a(layout::BATCH_COUNT, 4, 1),
            a(layout::STRIDED_BATCH_OFFSET, 8, 0),
            a(layout::PLANE_OFFSET, 8, 0),
        ];
        const PREFERENCE: &[AttributeSpec] = &[
            a(0, 4, 0),                               // SEARCH_MODE: best fit
            a(preference::MAX_WORKSPACE_BYTES, 8, 0), // no workspace
            a(2, 4, 1),                               // MATH_MODE_MASK
            a(3, 4, 0x7f),                            // REDUCTION_SCHEME_MASK: all
            a(4, 4, 3),                               // GAUSSIAN_MODE_MASK
            a(5, 4, 256),                             // MIN_ALIGNMENT_A_BYTES
            a(6, 4, 256),                             // ... B
            a(7, 4, 256),                             // ... C
            a(8, 4, 256),                             // ... D
            a(9, 4, 0),                               // MAX_WAVES_COUNT (a float, 0.0)
            a(10, 4, 3),                              // POINTER_MODE_MASK: host and device
            a(11, 4, 1),                              // EPILOGUE_MASK: default
            a(12, 8, -1),                             // IMPL_MASK: everything
            a(13, 4, 0),                              // SM_COUNT_TARGET
        ];
        const TRANSFORM: &[AttributeSpec] = &[
            a(transform::SCALE_TYPE, 4, 0),
            a(transform::POINTER_MODE, 4, 0),
            a(transform::TRANSA, 4, 0),
            a(transform::TRANSB, 4, 0),
        ];
        match self {
            DescKind::Matmul => MATMUL,
            DescKind::Layout => LAYOUT,
            DescKind::Preference => PREFERENCE,
            DescKind::Transform => TRANSFORM,
        }
    }

    pub fn attribute(self, id: i32) -> Option<AttributeSpec> {
        self.attributes().iter().copied().find(|s| s.id == id)
    }
}

/// Attribute numbers a descriptor has room for (the largest is the matmul descriptor's
/// `BIAS_DATA_TYPE`, 26).
const SLOTS: usize = 27;

/// A kind's attributes as a table indexed by attribute number: each one's size (0: not an
/// attribute of the kind) and default (its bytes, little-endian, in a `u64`).
struct Slots {
    sizes: [u8; SLOTS],
    defaults: [u64; SLOTS],
}

/// The low `size` bytes of a `u64`.
const fn mask(size: usize) -> u64 {
    if size >= 8 { u64::MAX } else { (1u64 << (size * 8)) - 1 }
}

const fn slots(attrs: &[AttributeSpec]) -> Slots {
    let mut t = Slots { sizes: [0; SLOTS], defaults: [0; SLOTS] };
    let mut i = 0;
    while i < attrs.len() {
        let s = attrs[i];
        assert!(s.id >= 0 && (s.id as usize) < SLOTS && s.size >= 1 && s.size <= 8);
        t.sizes[s.id as usize] = s.size as u8;
        t.defaults[s.id as usize] = s.default as u64 & mask(s.size);
        i += 1;
    }
    t
}

impl DescKind {
    fn slots(self) -> &'static Slots {
        const MATMUL: Slots = slots(DescKind::Matmul.attributes());
        const LAYOUT: Slots = slots(DescKind::Layout.attributes());
        const PREFERENCE: Slots = slots(DescKind::Preference.attributes());
        const TRANSFORM: Slots = slots(DescKind::Transform.attributes());
        match self {
            DescKind::Matmul => &MATMUL,
            DescKind::Layout => &LAYOUT,
            DescKind::Preference => &PREFERENCE,
            DescKind::Transform => &TRANSFORM,
        }
    }

    /// The size of attribute `id` of the kind (0: not one of its attributes).
    fn size_of(self, id: i32) -> usize {
        usize::try_from(id).ok().and_then(|i| self.slots().sizes.get(i)).map_or(0, |&s| usize::from(s))
    }
}

/// One descriptor: its attributes' values, the bytes of each (little-endian, as cuBLASLt keeps
/// them) in a slot indexed by the attribute's number. A fixed table, not a map: a framework
/// makes, sets and uses descriptors for every matmul, and copying one is a copy of 232 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub kind: DescKind,
    /// Attribute `id`'s bytes in the low bytes of `values[id]` (the rest zero).
    values: [u64; SLOTS],
    /// The vendor library's descriptor, 0 where the server computes the calls itself.
    pub raw: u64,
}

impl Descriptor {
    /// A descriptor with cuBLASLt's defaults.
    pub fn new(kind: DescKind) -> Descriptor {
        Descriptor { kind, values: kind.slots().defaults, raw: 0 }
    }

    /// An attribute's bytes (`None`: not an attribute of the descriptor's kind).
    pub fn bytes(&self, id: i32) -> Option<Vec<u8>> {
        let size = self.kind.size_of(id);
        (size > 0).then(|| self.values[id as usize].to_le_bytes()[..size].to_vec())
    }

    /// An attribute as a signed integer (sign-extended from its size).
    pub fn int(&self, id: i32) -> i64 {
        let size = self.kind.size_of(id);
        if size == 0 {
            return 0;
        }
        let v = self.values[id as usize];
        let unused = 64 - 8 * size as u32;
        ((v << unused) as i64) >> unused
    }

    /// An attribute as an unsigned 64-bit value (pointers, sizes).
    pub fn u64(&self, id: i32) -> u64 {
        self.int(id) as u64
    }

    /// Set an attribute from an integer (creation arguments).
    pub fn set_int(&mut self, id: i32, value: i64) {
        let size = self.kind.size_of(id);
        if size > 0 {
            self.values[id as usize] = value as u64 & mask(size);
        }
    }

    /// Set an attribute from its bytes; `false` (and nothing set) where `id` is not an
    /// attribute of the kind or `value` is not of its size.
    pub fn set_bytes(&mut self, id: i32, value: &[u8]) -> bool {
        let size = self.kind.size_of(id);
        if size == 0 || value.len() != size {
            return false;
        }
        let mut b = [0u8; 8];
        b[..size].copy_from_slice(value);
        self.values[id as usize] = u64::from_le_bytes(b);
        true
    }
}

/// A cuBLASLt handle: the device it was made on and the vendor's handle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LtHandle {
    pub device: i32,
    /// NVIDIA's `cublasLtHandle_t`, 0 where the server computes the calls itself.
    pub raw: u64,
}

pub struct LtRegistry {
    handles: Mutex<HandleTable<LtHandle>>,
    matmul: Mutex<HandleTable<Descriptor>>,
    layouts: Mutex<HandleTable<Descriptor>>,
    preferences: Mutex<HandleTable<Descriptor>>,
    transforms: Mutex<HandleTable<Descriptor>>,
    /// Descriptors a captured call names ([`retain`](Self::retain)), and those of them the
    /// program has destroyed since, kept for the graph (see [`destroy`](Self::destroy)).
    retained: Mutex<Retained>,
    /// Descriptors in the guest's pool ([`park`](Self::park)): the program destroyed them, and
    /// every call that names one is refused until the guest makes it again.
    parked: Mutex<std::collections::HashSet<(DescKind, u64), FoldHash>>,
}

/// Descriptors kept for captured calls.
#[derive(Default)]
struct Retained {
    named: std::collections::HashSet<(DescKind, u64), FoldHash>,
    kept: std::collections::HashMap<(DescKind, u64), Descriptor>,
    /// What each captured call's descriptors were when it was captured, by the number the
    /// graph keeps with the call ([`snapshot`](LtRegistry::snapshot)).
    snapshots: std::collections::HashMap<u64, Vec<(u64, Descriptor)>>,
    next_snapshot: u64,
    /// Descriptors made again under their handle ([`reinit`](LtRegistry::reinit)) while a
    /// captured call named them: their vendor objects live on for the graph's launches.
    replaced: Vec<Descriptor>,
}

/// Descriptors kept past their destruction for captured calls, at most: beyond, a destroyed
/// descriptor goes, and a graph launch that names it fails with its name in the log.
const MAX_KEPT: usize = 4096;

impl Default for LtRegistry {
    fn default() -> Self {
        let table = |kind: DescKind| Mutex::new(HandleTable::new(kind.handle_kind(), MAX_LT_OBJECTS));
        LtRegistry {
            handles: Mutex::new(HandleTable::new(HandleKind::CublasltHandle, MAX_LT_OBJECTS)),
            matmul: table(DescKind::Matmul),
            layouts: table(DescKind::Layout),
            preferences: table(DescKind::Preference),
            transforms: table(DescKind::Transform),
            retained: Mutex::default(),
            parked: Mutex::default(),
        }
    }
}

/// The kinds whose counters a checkpoint keeps, in [`LtRegistry::next_counters`]' order.
pub const COUNTED: [&str; 5] = [
    "cublaslt_handle",
    "cublaslt_matmul_desc",
    "cublaslt_matrix_layout",
    "cublaslt_matmul_preference",
    "cublaslt_matrix_transform_desc",
];

impl LtRegistry {
    fn table(&self, kind: DescKind) -> &Mutex<HandleTable<Descriptor>> {
        match kind {
            DescKind::Matmul => &self.matmul,
            DescKind::Layout => &self.layouts,
            DescKind::Preference => &self.preferences,
            DescKind::Transform => &self.transforms,
        }
    }

    pub fn create_handle(&self, handle: LtHandle, new: &NewHandle<'_>) -> Result<u64, CudaError> {
        self.handles.lock().add(handle, new)
    }

    pub fn destroy_handle(&self, handle: u64) -> Result<LtHandle, CudaError> {
        self.handles.lock().remove(handle)
    }

    pub fn handle(&self, handle: u64) -> Result<LtHandle, CudaError> {
        self.handles.lock().get(handle).copied()
    }

    pub fn create(&self, desc: Descriptor, new: &NewHandle<'_>) -> Result<u64, CudaError> {
        self.table(desc.kind).lock().add(desc, new)
    }

    /// Destroy a descriptor of the program's: it is gone for the program. One a captured call
    /// names is kept for the graph's launches (PyTorch destroys a matmul's descriptors right
    /// after capturing it: CUDA's graph holds the kernel's parameters, Phos's the call, which
    /// looks them up again); its vendor descriptor then lives until the session ends, and
    /// what is returned has none to destroy.
    pub fn destroy(&self, kind: DescKind, handle: u64) -> Result<Descriptor, CudaError> {
        self.not_parked(kind, handle)?;
        let desc = self.table(kind).lock().remove(handle)?;
        let mut retained = self.retained.lock();
        if retained.named.remove(&(kind, handle)) && retained.kept.len() < MAX_KEPT {
            retained.kept.insert((kind, handle), desc.clone());
            return Ok(Descriptor { raw: 0, ..desc });
        }
        Ok(desc)
    }

    /// A descriptor: the program's, or one kept for captured calls.
    pub fn get(&self, kind: DescKind, handle: u64) -> Result<Descriptor, CudaError> {
        self.not_parked(kind, handle)?;
        let found = self.table(kind).lock().get(handle).cloned();
        found.or_else(|e| self.retained.lock().kept.get(&(kind, handle)).cloned().ok_or(e))
    }

    /// Keep the descriptors a captured call names for the graph's launches, should the
    /// program destroy them first (or the guest make them again under their handles): what
    /// they are now is kept under the number answered, which the graph keeps with the call
    /// and gives back at each launch ([`get_captured`](Self::get_captured)); at most
    /// `MAX_KEPT` captured calls' (beyond, `None`).
    pub fn snapshot(&self, named: &[(DescKind, u64)]) -> Option<u64> {
        let kept: Vec<(u64, Descriptor)> = named
            .iter()
            .filter_map(|&(kind, handle)| Some((handle, self.table(kind).lock().get(handle).ok()?.clone())))
            .collect();
        let mut retained = self.retained.lock();
        retained.named.extend(named.iter().copied());
        if retained.snapshots.len() >= MAX_KEPT {
            // Beyond, a launch looks the descriptors up by their handles.
            return None;
        }
        if retained.next_snapshot == 0 {
            // Numbers of another session (a graph restored from an image) are not this one's.
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            retained.next_snapshot = (now.as_nanos() as u64) << 8 | 1;
        }
        let id = retained.next_snapshot;
        retained.next_snapshot = retained.next_snapshot.wrapping_add(1).max(1);
        retained.snapshots.insert(id, kept);
        Some(id)
    }

    /// A descriptor a graph launch's call names: as it was captured (`snapshot`, the number
    /// [`snapshot`](Self::snapshot) gave), else as [`get`](Self::get) finds it.
    pub fn get_captured(&self, kind: DescKind, handle: u64, snapshot: Option<u64>) -> Result<Descriptor, CudaError> {
        if let Some(id) = snapshot {
            let retained = self.retained.lock();
            let found =
                retained.snapshots.get(&id).and_then(|s| s.iter().find(|(h, d)| d.kind == kind && *h == handle));
            if let Some((_, d)) = found {
                return Ok(d.clone());
            }
        }
        self.get(kind, handle)
    }

    /// A descriptor of the program's goes into the guest's pool: refused from now on, as if
    /// destroyed, until [`reinit`](Self::reinit).
    pub fn park(&self, kind: DescKind, handle: u64) -> Result<(), CudaError> {
        self.not_parked(kind, handle)?;
        self.table(kind).lock().get(handle)?;
        self.parked.lock().insert((kind, handle));
        Ok(())
    }

    fn not_parked(&self, kind: DescKind, handle: u64) -> Result<(), CudaError> {
        let parked = self.parked.lock();
        if !parked.is_empty() && parked.contains(&(kind, handle)) {
            return Err(CudaError::InvalidResourceHandle);
        }
        Ok(())
    }

    /// Make a descriptor again under its handle (the guest's pool): `desc` replaces it, and the
    /// earlier one is answered, to be destroyed; one a captured call named is kept for the
    /// graph instead, and what is answered has no vendor object to destroy.
    pub fn reinit(&self, kind: DescKind, handle: u64, desc: Descriptor) -> Result<Descriptor, CudaError> {
        let old = std::mem::replace(self.table(kind).lock().get_mut(handle)?, desc);
        self.parked.lock().remove(&(kind, handle));
        let mut retained = self.retained.lock();
        if retained.named.remove(&(kind, handle)) {
            retained.replaced.push(old.clone());
            return Ok(Descriptor { raw: 0, ..old });
        }
        Ok(old)
    }

    /// Set one attribute's bytes (the caller has checked its size).
    pub fn set(&self, kind: DescKind, handle: u64, id: i32, value: &[u8]) -> Result<(), CudaError> {
        self.not_parked(kind, handle)?;
        if self.table(kind).lock().get_mut(handle)?.set_bytes(id, value) {
            Ok(())
        } else {
            Err(CudaError::InvalidValue)
        }
    }

    pub fn next_counters(&self) -> [u64; 5] {
        [
            self.handles.lock().next_counter(),
            self.matmul.lock().next_counter(),
            self.layouts.lock().next_counter(),
            self.preferences.lock().next_counter(),
            self.transforms.lock().next_counter(),
        ]
    }

    /// Carry on the counter of the kind named `kind` (one of [`COUNTED`]).
    pub fn set_next_counter(&self, kind: &str, next: u64) {
        match kind {
            "cublaslt_handle" => self.handles.lock().set_next_counter(next),
            "cublaslt_matmul_desc" => self.matmul.lock().set_next_counter(next),
            "cublaslt_matrix_layout" => self.layouts.lock().set_next_counter(next),
            "cublaslt_matmul_preference" => self.preferences.lock().set_next_counter(next),
            "cublaslt_matrix_transform_desc" => self.transforms.lock().set_next_counter(next),
            _ => {}
        }
    }

    /// Destroy every object (a device reset, the session's end).
    pub fn release_all(&self, backend: &dyn Backend) {
        let handles = self.handles.lock().drain();
        let retained = std::mem::take(&mut *self.retained.lock());
        self.parked.lock().clear();
        let descriptors: Vec<Descriptor> =
            [DescKind::Matmul, DescKind::Layout, DescKind::Preference, DescKind::Transform]
                .into_iter()
                .flat_map(|k| self.table(k).lock().drain().into_iter().map(|(_, d)| d))
                .chain(retained.kept.into_values())
                .chain(retained.replaced)
                .collect();
        if let Some(lt) = backend.cublaslt() {
            for d in descriptors.iter().filter(|d| d.raw != 0) {
                lt.destroy_descriptor(d.kind, d.raw);
            }
            for (_, h) in handles.into_iter().filter(|(_, h)| h.raw != 0) {
                lt.destroy(h.raw);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_a_captured_call_names_outlives_its_destruction() {
        let reg = LtRegistry::default();
        let new = NewHandle { forced: None, full: &|| CudaError::MemoryAllocation };
        let named = reg.create(Descriptor { raw: 7, ..Descriptor::new(DescKind::Layout) }, &new).unwrap();
        let other = reg.create(Descriptor { raw: 8, ..Descriptor::new(DescKind::Layout) }, &new).unwrap();
        reg.snapshot(&[(DescKind::Layout, named)]);
        assert_eq!(reg.destroy(DescKind::Layout, named).unwrap().raw, 0, "kept: nothing to destroy now");
        assert_eq!(reg.get(DescKind::Layout, named).unwrap().raw, 7, "a graph launch still finds it");
        assert_eq!(reg.destroy(DescKind::Layout, other).unwrap().raw, 8, "one no capture names goes");
        assert!(reg.get(DescKind::Layout, other).is_err());
        assert!(reg.destroy(DescKind::Layout, named).is_err(), "destroyed once only");
    }

    #[test]
    fn a_descriptor_made_again_is_fresh_and_a_graph_keeps_the_one_it_captured() {
        let reg = LtRegistry::default();
        let new = NewHandle { forced: None, full: &|| CudaError::MemoryAllocation };
        let mut used = Descriptor { raw: 7, ..Descriptor::new(DescKind::Matmul) };
        used.set_int(matmul::EPILOGUE, 4);
        let h = reg.create(used, &new).unwrap();
        let captured = reg.snapshot(&[(DescKind::Matmul, h)]).unwrap();
        let fresh = Descriptor { raw: 8, ..Descriptor::new(DescKind::Matmul) };
        assert_eq!(reg.reinit(DescKind::Matmul, h, fresh).unwrap().raw, 0, "kept for the graph");
        assert_eq!(reg.get(DescKind::Matmul, h).unwrap().int(matmul::EPILOGUE), 1, "the defaults again");
        assert_eq!(reg.get_captured(DescKind::Matmul, h, Some(captured)).unwrap().raw, 7, "the graph's own");
        assert_eq!(reg.get_captured(DescKind::Matmul, h, Some(captured + 1)).unwrap().raw, 8, "no such snapshot");
        reg.park(DescKind::Matmul, h).unwrap();
        assert!(reg.get(DescKind::Matmul, h).is_err(), "in the guest's pool: refused");
        assert!(reg.destroy(DescKind::Matmul, h).is_err(), "and not destroyed");
        assert!(reg.park(DescKind::Matmul, h).is_err(), "parked once");
        let again = Descriptor { raw: 9, ..Descriptor::new(DescKind::Matmul) };
        assert_eq!(reg.reinit(DescKind::Matmul, h, again).unwrap().raw, 8, "no graph names it: destroyed");
        assert!(reg.get(DescKind::Matmul, h).is_ok(), "made again: the program's");
        assert!(reg.reinit(DescKind::Layout, h, Descriptor::new(DescKind::Layout)).is_err(), "another kind's");
    }

    #[test]
    fn attributes_keep_their_bytes() {
        let mut d = Descriptor::new(DescKind::Preference);
        assert_eq!(d.int(12), -1, "IMPL_MASK: everything");
        assert_eq!(d.bytes(12).unwrap(), vec![0xff; 8]);
        assert!(d.set_bytes(preference::MAX_WORKSPACE_BYTES, &(1u64 << 40).to_le_bytes()));
        assert_eq!(d.u64(preference::MAX_WORKSPACE_BYTES), 1 << 40);
        assert!(!d.set_bytes(preference::MAX_WORKSPACE_BYTES, &[1, 2, 3, 4]), "not its size");
        assert!(!d.set_bytes(20, &[0; 4]), "not a preference attribute");
        assert_eq!((d.bytes(20), d.bytes(-1), d.int(-1)), (None, None, 0));
        let mut m = Descriptor::new(DescKind::Matmul);
        assert_eq!(m.bytes(9), None, "no attribute 9");
        assert!(m.set_bytes(matmul::FAST_ACCUM, &[0xff]));
        assert_eq!(m.int(matmul::FAST_ACCUM), -1);
        assert!(m.set_bytes(matmul::EPILOGUE, &(-2i32).to_le_bytes()));
        assert_eq!(m.int(matmul::EPILOGUE), -2);
        assert_eq!(m.bytes(matmul::EPILOGUE).unwrap(), (-2i32).to_le_bytes());
        let reg = LtRegistry::default();
        let new = NewHandle { forced: None, full: &|| CudaError::MemoryAllocation };
        let h = reg.create(m, &new).unwrap();
        assert_eq!(reg.set(DescKind::Matmul, h, matmul::TRANSA, &[0; 8]), Err(CudaError::InvalidValue));
        reg.set(DescKind::Matmul, h, matmul::TRANSA, &1i32.to_le_bytes()).unwrap();
        assert_eq!(reg.get(DescKind::Matmul, h).unwrap().int(matmul::TRANSA), 1);
    }

    #[test]
    fn defaults_and_integers_read_back() {
        let mut d = Descriptor::new(DescKind::Matmul);
        assert_eq!(d.int(matmul::EPILOGUE), 1);
        assert_eq!(d.int(matmul::BIAS_DATA_TYPE), -1);
        assert_eq!(d.bytes(matmul::FAST_ACCUM).unwrap().len(), 1);
        d.set_int(matmul::BIAS_POINTER, 0x7000_0000_1000);
        assert_eq!(d.u64(matmul::BIAS_POINTER), 0x7000_0000_1000);
        let l = Descriptor::new(DescKind::Layout);
        assert_eq!(l.int(layout::BATCH_COUNT), 1);
        assert_eq!(l.bytes(layout::ROWS).unwrap().len(), 8);
    }
}
