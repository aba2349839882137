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
}

impl Default for Config {
    fn default() -> Self {
        Config { arena_size: 0, max_order: 18, thp: false, backing: Backing::Anonymous }
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
        Ok(())
    }
}
