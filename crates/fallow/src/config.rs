//! Configuration of an allocator, and its validation. Every setting names its accepted range in
//! the error it gives.

use crate::arena::MAX_ORDER_LIMIT;
use crate::error::Error;

/// What backs an arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Private anonymous memory (the default).
    Anonymous,
    /// A `memfd`, mapped shared, so that another process (a VMM, say) can map the same memory
    /// through the descriptor `Allocator::arena_fds` gives.
    Memfd,
}

#[derive(Clone, Debug)]
pub struct Config {
    /// Bytes reserved per arena; 0 means the machine's RAM, rounded up to the largest block.
    pub arena_size: usize,
    /// Largest block order: blocks go from 4 KiB (order 0) to 4 KiB << max_order. Default 18 (1 GiB).
    pub max_order: u8,
    /// Ask for transparent huge pages (`MADV_HUGEPAGE`) on the arenas.
    pub thp: bool,
    pub backing: Backing,
    /// Per-thread page caches (`cache.rs`, seed 002): blocks of orders `0..=cache_max_order` are
    /// served and taken back without the lock. Default on.
    pub cache: bool,
    /// Largest cached order (0..=9). Default 3 (32 KiB), as Linux's per-CPU lists.
    pub cache_max_order: u8,
    /// Pages moved per refill under one hold of the lock, per order (`>> order` blocks, at least
    /// one). Default 63, as Linux (see docs/design.md, "Per-thread caches", for the measurement).
    pub cache_batch_pages: u32,
    /// Most pages one thread may hold per order in one allocator's cache (`>> order` blocks, at
    /// least two); a full list drains half. Default 256 (4 MiB per thread for orders 0..3).
    pub cache_high_pages: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            arena_size: 0,
            max_order: 18,
            thp: false,
            backing: Backing::Anonymous,
            cache: true,
            cache_max_order: 3,
            cache_batch_pages: 63,
            cache_high_pages: 256,
        }
    }
}

impl Config {
    pub fn validate(&self) -> Result<(), Error> {
        if self.max_order > MAX_ORDER_LIMIT {
            return Err(Error::Config {
                setting: "max_order",
                message: "must be between 0 and 30 (4 KiB to 4 TiB blocks)",
            });
        }
        if self.thp && self.max_order < 9 {
            return Err(Error::Config {
                setting: "max_order",
                message: "must be at least 9 (2 MiB) when thp is on",
            });
        }
        if self.cache_max_order > crate::cache::CACHE_ORDER_LIMIT {
            return Err(Error::Config { setting: "cache_max_order", message: "must be between 0 and 9 (4 KiB to 2 MiB)" });
        }
        if !(1..=4096).contains(&self.cache_high_pages) {
            return Err(Error::Config { setting: "cache_high_pages", message: "must be between 1 and 4096" });
        }
        if self.cache_batch_pages == 0 || self.cache_batch_pages > self.cache_high_pages {
            return Err(Error::Config {
                setting: "cache_batch_pages",
                message: "must be between 1 and cache_high_pages",
            });
        }
        Ok(())
    }
}
