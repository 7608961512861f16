//! The session's cuRAND generators and their settings. A generator is a virtual handle of kind
//! `curand_generator`; what it stands for on the backend is its type, its settings and its
//! position in its sequence, so a restore makes it again by replaying its creation, the last
//! call of each setter and the offset of its position (`service::curand` records that one).

use parking_lot::Mutex;
use phos_protocol::CudaError;
use phos_protocol::apis::HandleKind;

use super::handles::{HandleTable, NewHandle};
use crate::backend::Backend;

/// cuRAND generators a session may hold at once.
pub const MAX_GENERATORS: u64 = 1024;

/// One generator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Generator {
    /// The device current when it was made.
    pub device: i32,
    /// Its `curandRngType_t`, as the program asked for it.
    pub rng_type: i32,
    /// Made by curandCreateGeneratorHost: its numbers go to host memory (the reply).
    pub host: bool,
    /// The stream its work goes on (a stream handle; 0 is the legacy default stream).
    pub stream: u64,
    pub seed: u64,
    pub offset: u64,
    pub ordering: i32,
    pub dimensions: u32,
    /// How far it has drawn since its seed, offset or ordering was last set: 32-bit words of
    /// the CPU generator, or numbers of NVIDIA's (the unit of its offset).
    pub drawn: u64,
    /// The vendor library's generator (NVIDIA's `curandGenerator_t`), 0 where the server draws
    /// the numbers itself.
    pub raw: u64,
}

impl Generator {
    /// Where in its sequence the next number comes from, as an offset.
    pub fn position(&self) -> u64 {
        self.offset.saturating_add(self.drawn)
    }
}

pub struct RandRegistry {
    table: Mutex<HandleTable<Generator>>,
}

impl Default for RandRegistry {
    fn default() -> Self {
        RandRegistry { table: Mutex::new(HandleTable::new(HandleKind::CurandGenerator, MAX_GENERATORS)) }
    }
}

impl RandRegistry {
    pub fn create(&self, generator: Generator, new: &NewHandle<'_>) -> Result<u64, CudaError> {
        self.table.lock().add(generator, new)
    }

    pub fn destroy(&self, handle: u64) -> Result<Generator, CudaError> {
        self.table.lock().remove(handle)
    }

    pub fn get(&self, handle: u64) -> Result<Generator, CudaError> {
        self.table.lock().get(handle).copied()
    }

    /// Change a generator in one step; returns it as changed.
    pub fn update(&self, handle: u64, change: impl FnOnce(&mut Generator)) -> Result<Generator, CudaError> {
        let mut table = self.table.lock();
        let g = table.get_mut(handle)?;
        change(g);
        Ok(*g)
    }

    pub fn next_counter(&self) -> u64 {
        self.table.lock().next_counter()
    }

    pub fn set_next_counter(&self, next: u64) {
        self.table.lock().set_next_counter(next);
    }

    /// Destroy every generator (a device reset, the session's end).
    pub fn release_all(&self, backend: &dyn Backend) {
        let generators = self.table.lock().drain();
        if let Some(curand) = backend.curand() {
            for (_, g) in generators.into_iter().filter(|(_, g)| g.raw != 0) {
                curand.destroy(g.raw);
            }
        }
    }
}
