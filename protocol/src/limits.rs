//! Per-session limits on the objects a guest can make its API server keep: streams, events,
//! allocations, modules, graphs... CUDA itself has no such limits worth the name (a driver
//! fails only when it runs out of memory), but every object costs the server bookkeeping
//! and the backend driver resources, so one tenant must not be able to create millions.
//!
//! The router's configuration sets them (`[limits]`), the router passes them to each API
//! server on its command line (`--limit streams=16384`), and the server refuses a call that
//! would go past one with `cudaErrorMemoryAllocation` (what CUDA answers when it cannot
//! create a resource), logs it and counts it in its usage reports.

/// One kind of object a session may hold a limited number of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LimitKind {
    Streams,
    Events,
    /// Device memory allocations (`cudaMalloc` and its relatives).
    Allocations,
    /// Page-locked host allocations in the pinned arena (`cudaMallocHost`, `cudaHostAlloc`).
    HostAllocations,
    /// Loaded modules (one per fat binary the program uses).
    Modules,
    /// Kernel handles looked up in modules.
    Functions,
    Graphs,
    GraphExecs,
    GraphNodes,
}

impl LimitKind {
    pub const ALL: [LimitKind; 9] = [
        LimitKind::Streams,
        LimitKind::Events,
        LimitKind::Allocations,
        LimitKind::HostAllocations,
        LimitKind::Modules,
        LimitKind::Functions,
        LimitKind::Graphs,
        LimitKind::GraphExecs,
        LimitKind::GraphNodes,
    ];

    /// The name in configuration files, command lines and metrics.
    pub fn name(self) -> &'static str {
        match self {
            LimitKind::Streams => "streams",
            LimitKind::Events => "events",
            LimitKind::Allocations => "allocations",
            LimitKind::HostAllocations => "host_allocations",
            LimitKind::Modules => "modules",
            LimitKind::Functions => "functions",
            LimitKind::Graphs => "graphs",
            LimitKind::GraphExecs => "graph_execs",
            LimitKind::GraphNodes => "graph_nodes",
        }
    }

    pub fn from_name(name: &str) -> Option<LimitKind> {
        LimitKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Position in [`LimitKind::ALL`] (and on the wire, in usage reports).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The default limit. Each is far beyond what a real program holds at once (programs
    /// use a handful of streams, events by the thousand for timing, allocations by the
    /// thousand behind a caching allocator, a module per translation unit with device
    /// code), and small enough that the server's tables stay in the tens of MiB.
    pub fn default_limit(self) -> u64 {
        match self {
            LimitKind::Streams => 16_384,
            LimitKind::Events => 262_144,
            LimitKind::Allocations => 1_048_576,
            // Each one is registered with the driver (pinned): far costlier than the others.
            LimitKind::HostAllocations => 65_536,
            LimitKind::Modules => 16_384,
            LimitKind::Functions => 262_144,
            LimitKind::Graphs => 16_384,
            LimitKind::GraphExecs => 16_384,
            LimitKind::GraphNodes => 1_048_576,
        }
    }
}

impl std::fmt::Display for LimitKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The limit of every kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits([u64; LimitKind::ALL.len()]);

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits(LimitKind::ALL.map(LimitKind::default_limit))
    }
}

impl SessionLimits {
    pub fn get(&self, kind: LimitKind) -> u64 {
        self.0[kind.index()]
    }

    pub fn set(&mut self, kind: LimitKind, value: u64) {
        self.0[kind.index()] = value;
    }

    /// Apply one `KIND=N` setting (a server's `--limit` argument).
    pub fn apply(&mut self, setting: &str) -> Result<(), String> {
        let (name, value) = setting.split_once('=').ok_or_else(|| format!("`{setting}`: expected KIND=N"))?;
        let kind = LimitKind::from_name(name.trim()).ok_or_else(|| {
            let known: Vec<&str> = LimitKind::ALL.iter().map(|k| k.name()).collect();
            format!("`{name}` is not a limit (known: {})", known.join(", "))
        })?;
        let value: u64 = value.trim().parse().map_err(|_| format!("limit `{name}`: `{value}` is not a count"))?;
        if value == 0 {
            return Err(format!("limit `{name}` must be at least 1"));
        }
        self.set(kind, value);
        Ok(())
    }

    /// The `--limit KIND=N` arguments that give a server these limits.
    pub fn to_args(&self) -> Vec<String> {
        LimitKind::ALL.iter().flat_map(|k| ["--limit".to_string(), format!("{}={}", k.name(), self.get(*k))]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_and_arguments_round_trip() {
        let mut l = SessionLimits::default();
        assert_eq!(l.get(LimitKind::Streams), 16_384);
        l.apply("streams=10").unwrap();
        l.apply(" events = 20 ").unwrap();
        assert_eq!((l.get(LimitKind::Streams), l.get(LimitKind::Events)), (10, 20));
        assert!(l.apply("spoons=1").unwrap_err().contains("graph_nodes"), "the error lists the kinds");
        assert!(l.apply("streams=0").is_err());
        assert!(l.apply("streams=-1").is_err());
        assert!(l.apply("streams").is_err());
        let args = l.to_args();
        let mut back = SessionLimits(LimitKind::ALL.map(|_| 1));
        for pair in args.chunks(2) {
            assert_eq!(pair[0], "--limit");
            back.apply(&pair[1]).unwrap();
        }
        assert_eq!(back, l);
        for (i, k) in LimitKind::ALL.iter().enumerate() {
            assert_eq!(k.index(), i);
            assert_eq!(LimitKind::from_name(k.name()), Some(*k));
        }
    }
}
