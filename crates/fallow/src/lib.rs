//! fallow: a page allocator whose every free page has a known state (dirty, zeroed or reported),
//! that zeroes free pages while the machine is idle and gives idle free memory back to the kernel.
//!
//! Public: [`Allocator`] with [`Flags`], its [`Config`] and [`Tunables`] (with [`Backing`] and
//! [`ReportMode`]), [`Stats`], [`Error`], [`PageState`], and [`FallowAlloc`], a `GlobalAlloc`.
//! Everything else is crate-private but for `binding_support`, a hidden module for fallow's own C
//! library, LD_PRELOAD library and measurement examples (not a stable API; `docs/design.md`,
//! "Public surface").
//!
//! The design, its invariants, threads and locks are in `docs/design.md`. The modules are
//! layers, bottom up; each imports only modules that come before it here (`tests/layers.rs`):
//! - `os`: every system call; `error`; `message` (`StackBuf`, messages without allocating, and
//!   `fatal`, the abort on a bad pointer); `flags`, `lock` (the allocator lock, a futex mutex
//!   that `fork` handlers can hold), `sync` (the atomics and futex of `worker`, swapped for
//!   loom's in the model checks), `nt` (zeroing with non-temporal stores), `start` (`StartGate`,
//!   the creation of a process-wide allocator on first use);
//! - `config`: settings, their validation, and the limits they are checked against; `env`: the
//!   `FALLOW_*` environment variables over a `Config`; `page`: per-page states and the
//!   per-block side record; `stats`: the counters and their report;
//! - `worker`: background-thread plumbing (the worker word);
//! - `arena`: a reservation and its side metadata; `buddy`: an arena with its free lists,
//!   split and merge;
//! - `heap/`: the locked allocator (allocation, free with validation, resize, growth), what an
//!   allocator's handles, caches and workers share, and the workers' isolation interface;
//! - `cache/`: per-thread page caches, the lock-free fast path;
//! - `slab/`: small objects (up to 64 KiB) in spans of pages, per-thread heaps, free-list
//!   sharding;
//! - `report`: free page reporting; `zero`: background pre-zeroing (the two workers);
//! - `allocator/`: the public `Allocator`, its hit paths inlined, its statistics and controls,
//!   and the `fork` registry (the allocators of `FallowAlloc` and the C library, locked around
//!   every `fork`);
//! - `global`: `LazyAllocator` (a process-wide allocator created on first use) and `FallowAlloc`,
//!   a `GlobalAlloc` (large requests to fallow, small to the system, or to the slab layer);
//!   `binding_support`: the few internals that fallow's other crates and examples use.
//!
//! ```
//! use fallow::{Allocator, Config, Flags};
//! let a = Allocator::new(Config { arena_size: 64 << 20, max_order: 10, ..Config::default() }).unwrap();
//! let p = a.alloc(100_000, 4096, Flags::ZERO).unwrap();
//! // SAFETY: `p` is a live block of at least 100,000 bytes, zeroed (`Flags::ZERO`).
//! assert_eq!(unsafe { *p.as_ptr().add(99_999) }, 0);
//! a.free(p.as_ptr()).unwrap();
//! ```

#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::missing_safety_doc)]

/// `write_every_field!(dst, Type { field: value, ... })`: write each field of `*dst` through its
/// raw place (`dst` a `*mut Type`; no reference to the whole, which may be uninitialised), with
/// a never-called closure that destructures a `Type` naming the same fields, so that a field of
/// `Type` left out of the list does not compile. Fields the caller wrote in place before are
/// named after a `;` (`Type { a: 1, b: 2; c }`): checked, not written. Expands to raw-pointer
/// writes: the caller's `unsafe` block says why `dst` is valid for them. Used where a value too
/// large for the stack is set up where it lives (a thread's cache, an allocator's shared state).
macro_rules! write_every_field {
    ($dst:expr, $ty:ident { $($field:ident: $value:expr),* $(,)? $(; $($done:ident),* $(,)?)? }) => {{
        let _every_field_named = |v: $ty| {
            let $ty { $($field: _,)* $($($done: _,)*)? } = v;
        };
        $( (&raw mut (*$dst).$field).write($value); )*
    }};
}

pub(crate) mod allocator;
pub(crate) mod arena;
pub(crate) mod buddy;
pub(crate) mod cache;
pub(crate) mod config;
pub(crate) mod env;
pub(crate) mod error;
pub(crate) mod flags;
pub(crate) mod global;
pub(crate) mod heap;
pub(crate) mod limit;
pub(crate) mod lock;
pub(crate) mod message;
pub(crate) mod nt;
pub(crate) mod os;
pub(crate) mod page;
pub(crate) mod report;
pub(crate) mod trim;
pub(crate) mod slab;
pub(crate) mod start;
pub(crate) mod stats;
pub(crate) mod sync;
pub(crate) mod worker;
pub(crate) mod zero;

#[doc(hidden)]
pub mod binding_support;

/// Only in a build with the `loom` feature (`make test-loom`): the protocol code that `tests/loom/`
/// model-checks, running on loom's atomics and futex model (`sync.rs`).
#[cfg(feature = "loom")]
#[doc(hidden)]
pub mod loom_support {
    pub use crate::sync::{futex_wait, futex_wake_all};
    pub use crate::worker::{Worker, ABSENT, IDLE, KICKED, NAPPING, RUNNING};
}

pub use config::{Backing, Config, MemoryLimit, ReportMode, Tunables};
pub use error::Error;
pub use global::FallowAlloc;
pub use allocator::Allocator;
pub use flags::Flags;
pub use page::PageState;
pub use stats::Stats;
