//! What fallow's own C library (`fallow-capi`), LD_PRELOAD library (`fallow-preload`),
//! measurement examples and benchmark guests (`fallow-bench`: `env`) need of its internals, and
//! nothing more: the allocator behind a C
//! `malloc` has to set `errno`, format messages and write them to stderr without allocating,
//! abort on a bad pointer (`fatal`), take a lock that `fork` handlers can hold, read its settings
//! from the environment (`env`, shared with the C library) and create the process-wide allocator
//! exactly once from inside `malloc` itself (`LazyAllocator`, over `StartGate`).
//!
//! NOT A STABLE API: hidden from the documentation, it changes with those crates without notice.
//! Programs use the public items at the crate root.
//!
//! Everything here is sound to call from safe code; what relies on a caller's promise is an
//! `unsafe fn` with its `# Safety` section (`RawLock::unlock`, `RawLock::reset_after_fork`,
//! `move_pages`).

/// The page size fallow works in (4 KiB; fallow checks nothing else).
pub use crate::os::PAGE_SIZE;

/// The calling thread's `errno`, read and set (the C API and `malloc` report errors through it).
pub use crate::os::{errno, set_errno};

/// Write to stderr without allocating (messages from inside `malloc`).
pub use crate::os::write_stderr;

/// This process's id (the preload's statistics at exit).
pub use crate::os::getpid;

/// Move pages from one block to another with `mremap` instead of copying them (the preload's
/// `realloc`).
pub use crate::os::move_pages;

/// The span of every arena of this process (`[SPAN_START, SPAN_END)`, only ever widened): an
/// address outside it is no allocator's (the preload's `free` and `realloc` test it before they
/// ask `Allocator::owns`).
pub use crate::heap::{SPAN_END, SPAN_START};

/// The smallest request below a binding's threshold that asks the hot block first
/// (`Allocator::alloc_from_hot`): the preload's routing below its threshold.
pub use crate::cache::hot_from;

/// Objects a span of a small request's class holds (its span less the class's colour).
pub use crate::slab::objects_per_span;

/// A fixed buffer that `core::fmt::Write` fills without allocating.
pub use crate::message::StackBuf;

/// What `Allocator::free_hot_step` (and `SpanMap::free_hot_sole`) did with a pointer, and
/// what they leave the binding to do with one call of its own (the preload's `free`): push
/// another thread's small object it checked, or move a span.
pub use crate::allocator::{FreeHot, FreeSole, RemoteFree, SpanMove};

/// A copy of an allocator's first arena and page map of spans (`Allocator::span_map`), for a
/// binding's own `free` (`SpanMap::free_hot_sole`).
pub use crate::slab::SpanMap;

/// The one fatal-error path of a process-wide allocator: `fallow: {op}(): double free 0x...` (or
/// `invalid pointer 0x...`) on stderr, formatted on the stack, then `abort`.
pub use crate::message::fatal;

/// The `FALLOW_*` environment variables, parsed once for the preload library and the C library
/// (`fallow_create_from_env`): the same names, ranges and warnings (`env.rs`).
pub mod env {
    pub use crate::env::{
        from_environment, parse, EnvSettings, DEFAULT_THRESHOLD, MAX_ARENA_SIZE, MIN_THRESHOLD,
    };
}

/// A futex mutex with explicit `lock` / `unlock`, so that `fork` handlers can hold it across
/// `fork`.
pub use crate::lock::RawLock;

/// fallow's own threads, which never keep a process alive (`worker/exit_watch.rs`): a thread of a binding's
/// own counts itself and ends once the program is gone.
pub use crate::worker::exit_watch::{program_gone, OwnThread};

/// The `fork` registry (`allocator/fork.rs`): `register` an allocator at its creation, and it is
/// locked around every `fork` of the process by handlers registered when the library is loaded;
/// `release` destroys it, its workers joined before it leaves the registry (the C library's).
pub mod fork {
    pub use crate::allocator::fork::{register, release};
}

/// The once-only creation of a process-wide allocator on first use: `LazyAllocator`, the
/// preload's and `FallowAlloc`'s, over the gate that `StartGate` is.
pub use crate::global::LazyAllocator;
pub use crate::start::{Entry, StartGate};

/// The length from which zeroing uses non-temporal stores, and its one-off calibration
/// (`examples/reclaim_measure.rs` measures both).
pub use crate::nt::{calibrate as calibrate_nt, threshold as nt_threshold};

/// The C mirror of `Stats` (`struct fallow_stats`), its layout field by field, and the list of
/// every figure with its unit: all from the one table in `stats.rs`.
pub use crate::stats::{CField, CStats, Unit, C_FIELDS, C_STATS_V1_SIZE, C_STATS_V2_SIZE, FIELDS};
