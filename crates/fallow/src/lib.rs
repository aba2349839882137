//! fallow: a page allocator whose every free page has a known state (dirty, zeroed or reported),
//! that zeroes free pages while the machine is idle and gives idle free memory back to the kernel.
//!
//! The design, its invariants, threads and locks are in `docs/design.md`. One file per concept:
//! - `os`: every system call;
//! - `lock`: the allocator lock (a futex mutex that `fork` handlers can hold);
//! - `page`: per-page states and the per-block side record;
//! - `arena`: a reservation and its side metadata;
//! - `buddy`: free lists, split and merge over one arena;
//! - `heap`: the allocator itself (flags, free with validation, growth, statistics);
//! - `worker`: background-thread plumbing; `report`: free page reporting; `zero`: background
//!   pre-zeroing; `nt`: zeroing with non-temporal stores;
//! - `cache`: per-thread page caches, the lock-free fast path;
//! - `global`: `FallowAlloc`, a `GlobalAlloc` (large requests to fallow, small to the system);
//! - `start`: `StartGate`, the creation of a process-wide allocator on first use;
//! - `config`, `error`, `stats`.
//!
//! ```
//! use fallow::{Allocator, Config, Flags};
//! let a = Allocator::new(Config { arena_size: 64 << 20, max_order: 10, ..Config::default() }).unwrap();
//! let p = a.alloc(100_000, 4096, Flags::ZERO).unwrap();
//! // SAFETY: `p` is a live block of at least 100,000 bytes, zeroed (`Flags::ZERO`).
//! assert_eq!(unsafe { *p.as_ptr().add(99_999) }, 0);
//! a.free(p.as_ptr()).unwrap();
//! ```

pub mod arena;
pub mod buddy;
pub mod cache;
pub mod config;
pub mod error;
pub mod global;
pub mod heap;
pub mod lock;
pub mod nt;
pub mod os;
pub mod page;
pub(crate) mod report;
pub mod start;
pub mod stats;
pub(crate) mod worker;
pub(crate) mod zero;

pub use config::{Backing, Config, ReportMode, Tunables};
pub use error::Error;
pub use global::FallowAlloc;
pub use heap::{Allocator, Flags};
pub use page::PageState;
pub use stats::Stats;
