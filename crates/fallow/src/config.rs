//! Configuration of an allocator, and its validation. Every setting names its accepted range in
//! the error it gives. The limits that settings are checked against live here too, at the bottom
//! of the layers: the modules that size their tables by them import them from here.

use crate::error::Error;

/// Orders go from 0 (4 KiB) to at most this (4 TiB); pfns are `u32`, so an arena holds at most
/// 2^32 pages (16 TiB).
pub const MAX_ORDER_LIMIT: u8 = 30;
/// Orders of free lists an arena keeps (`0..=MAX_ORDER_LIMIT`).
pub const ORDERS: usize = MAX_ORDER_LIMIT as usize + 1;
/// Largest order a per-thread cache may serve (8 MiB blocks). A cache keeps whole blocks, a
/// request's pages past its size as slack (up to half the block), so larger blocks are left to
/// the locked path, which gives the tail back.
pub const CACHE_ORDER_LIMIT: u8 = 11;
/// Orders up to this (2 MiB) are cached only in stacks under the high mark; an order above it is
/// cached when every order up to it is, with room for one block beyond the high mark unless it
/// fits in half of it (cache/mod.rs, "Design").
pub(crate) const CACHE_STACKED_ORDER_MAX: u8 = 9;
/// Fewest and most pages a per-thread cache may hold (`Config::cache_high_pages`): two blocks of
/// one page at least, 256 MiB at most.
pub const CACHE_HIGH_PAGES_MIN: u32 = 2;
pub const CACHE_HIGH_PAGES_MAX: u32 = 65536;
/// Longest `report_delay_ms` and `zero_delay_ms` (one hour; also the longest
/// `FALLOW_REPORT_DELAY_MS`).
pub const MAX_DELAY_MS: u32 = 3_600_000;

/// What backs an arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Private anonymous memory (the default).
    Anonymous,
    /// A `memfd`, mapped shared, so that another process (a VMM, say) can map the same memory
    /// through the descriptor `Allocator::arena_fds` gives.
    Memfd,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Bytes reserved per arena; 0 means the machine's RAM, rounded up to the largest block.
    pub arena_size: usize,
    /// Largest block order: blocks go from 4 KiB (order 0) to 4 KiB << max_order. Default 18 (1 GiB).
    pub max_order: u8,
    /// Ask for transparent huge pages (`MADV_HUGEPAGE`) on the arenas (default off; needs
    /// `max_order` and `report_order` >= 9). A 2 MiB unit a block uses is then resident whole;
    /// the page states stay true (docs/design.md, "Huge-page units", which says why it is off:
    /// in a guest whose host takes back its free memory, a huge-page fault costs five times a
    /// 4 KiB one per byte, and the field's large-block benchmarks fault fresh memory often).
    pub thp: bool,
    pub backing: Backing,
    /// Free page reporting and background pre-zeroing (changeable at run time with
    /// `Allocator::set_tunables`).
    pub tunables: Tunables,
    /// Per-thread page caches (`cache/`, seed 002): blocks of orders `0..=cache_max_order` are
    /// served and taken back without the lock. Default on.
    pub cache: bool,
    /// Largest cached order (0..=11). Default 11 (8 MiB): a thread that frees a large block and
    /// asks for one again at once reuses it without the lock, as glibc's per-thread arenas do
    /// (docs/design.md, "Per-thread caches"); a cached block is served whole, so a 5 MiB request
    /// holds an 8 MiB block, its slack within the process-wide slack bound (with 20 live buffers
    /// of 5-25 MiB, 17 MB more resident than with 10, still less than glibc's; before the bound,
    /// 67 MB more). Orders up to 9 are cached only if their block fits
    /// in half of `cache_high_pages`; orders 10 and 11 only if order 9 is, one block each beyond
    /// the high mark (unless they fit in half of it too).
    pub cache_max_order: u8,
    /// Pages moved per refill under one hold of the lock, per order (`>> order` blocks, at least
    /// one). Default 64 (Linux uses 63): a refill of a small order then takes one aligned group of
    /// 64 pages, whose state bytes share no cache line with another thread's blocks (see
    /// docs/design.md, "Per-thread caches", for the measurement).
    pub cache_batch_pages: u32,
    /// The high mark: most pages one thread may hold, over all orders, in one allocator's cache
    /// (and at most 256 blocks per order), plus one block of each cached order above half of it.
    /// A free that would pass it first drains the cache to half of it. Default 1024 (4 MiB per
    /// thread, 8 MiB with one 4 MiB block; see docs/design.md).
    pub cache_high_pages: u32,
    /// Small objects (up to `SMALL_MAX`, 64 KiB) from the slab layer (`slab/`: size classes in
    /// spans of pages, per-thread heaps) for `Allocator::malloc` and what is built on it
    /// (`FallowAlloc`, the C library's and the preload's malloc-like functions); off, they are
    /// page blocks (`Allocator::malloc`) or the system's (`FallowAlloc`, the preload). Default
    /// off until the small-object benchmarks hold (docs/design.md, "Small objects").
    pub small_objects: bool,
    /// With small objects on, the owner of a span whose live objects fall to a quarter of its
    /// capacity (and stay there a two-hundredth of `report_delay_ms`) gives the span's pages that
    /// hold no live object back to the kernel (slab/trim.rs;
    /// docs/design.md, "Small objects", "Trimming live spans"); only on the private anonymous
    /// backing without `thp`. Default on.
    pub small_trim: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            arena_size: 0,
            max_order: 18,
            thp: false,
            backing: Backing::Anonymous,
            tunables: Tunables::default(),
            cache: true,
            cache_max_order: 11,
            cache_batch_pages: 64,
            cache_high_pages: 1024,
            small_objects: false,
            small_trim: true,
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
        if self.cache_max_order > CACHE_ORDER_LIMIT {
            return Err(Error::Config { setting: "cache_max_order", message: "must be between 0 and 11 (4 KiB to 8 MiB)" });
        }
        if !(CACHE_HIGH_PAGES_MIN..=CACHE_HIGH_PAGES_MAX).contains(&self.cache_high_pages) {
            return Err(Error::Config { setting: "cache_high_pages", message: "must be between 2 and 65536" });
        }
        if self.cache_batch_pages == 0 || self.cache_batch_pages > self.cache_high_pages {
            return Err(Error::Config {
                setting: "cache_batch_pages",
                message: "must be between 1 and cache_high_pages",
            });
        }
        self.tunables.validate(self)
    }
}

/// How reported memory is given back to the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportMode {
    /// `Punch` for `Backing::Memfd`, `DontNeed` otherwise.
    Auto,
    /// `MADV_DONTNEED`: freed at once, reads zero afterwards (reported pages count as zeroed).
    DontNeed,
    /// `MADV_FREE`: freed when the kernel needs the memory; contents unknown afterwards, so such
    /// pages are never treated as zeroed. Private anonymous memory only.
    Free,
    /// `fallocate(FALLOC_FL_PUNCH_HOLE)` on the memfd: freed at once, reads zero. Memfd only
    /// (`MADV_DONTNEED` on a shared mapping frees nothing: the file keeps the pages).
    Punch,
}

/// The soft memory limit (`Tunables::memory_limit`; docs/design.md, "Memory limit and pressure").
/// Soft: it makes the reporter give free memory back at once, and never fails an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryLimit {
    /// No limit.
    Off,
    /// The limit of the process's memory cgroup (v2 `memory.high`, else `memory.max`; v1
    /// `memory.limit_in_bytes`, the least over the cgroup and its ancestors) less a margin for
    /// what fallow does not own (`limit::cgroup_margin`); compared with the cgroup's usage. No
    /// limit where none is set. The default.
    Auto,
    /// This many bytes (at least one page), compared with fallow's own resident memory: live
    /// blocks plus free pages not reported.
    Bytes(u64),
}

/// Smallest `MemoryLimit::Bytes`: one page.
pub const MIN_MEMORY_LIMIT: u64 = 4096;

/// The smallest free block the workers take below their orders (`zero_order`, `report_order`),
/// as an order (16 pages, 64 KiB). A block placed right after an arena's used part
/// (`Buddy::take_top`) starts and ends anywhere, so freed between live neighbours it leaves
/// aligned pieces of every order at its ends; these pieces are zeroed and reported as other
/// free blocks are, after the blocks of the workers' orders and only once free for the whole
/// delay (none of the reporter's early rules). Smaller pieces stay until they merge.
pub(crate) const PIECE_ORDER: u8 = 4;

/// Dirty free blocks of this order (32 MiB) or more go back after a tenth of `report_delay`
/// (report.rs: glibc returns every block of that size at its `free`, its largest mmap
/// threshold, and a program that has not taken such a block back within that time is not in
/// a loop on it), and requests of this size or more keep blocks aligned to their order, so
/// that freed they merge back whole (`Buddy::take_top`).
pub(crate) const BIG_ORDER: u8 = 13;

/// Settings of the two background workers (`report.rs`, `zero.rs`). Linux's
/// `mm/page_reporting.c` choices are the defaults for reporting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tunables {
    /// Report idle free memory to the kernel.
    pub report: bool,
    /// Smallest block reported by the delay's rules, as an order (default 9: 2 MiB). At least 9
    /// with THP. Below it, free blocks down to 64 KiB (`PIECE_ORDER`: the pieces a block placed
    /// unaligned leaves between live ones) go back after the whole delay, but with THP.
    pub report_order: u8,
    /// A block is reported only after it has been free this long (ms, default 2000); a dirty
    /// block of 32 MiB or more after a tenth of it, and every dirty block while free dirty memory
    /// passes 64 MiB (or the memory in use, if more) after a twentieth (report.rs).
    pub report_delay_ms: u32,
    /// Blocks per report batch (one `process_madvise`), 1..=256, default 32.
    pub report_batch: u32,
    /// Free bytes that are never reported (a resident floor), default 0.
    pub resident_free_min: usize,
    pub report_mode: ReportMode,
    /// Zero dirty free memory in the background, when a CPU is idle.
    pub zeroing: bool,
    /// Smallest dirty free block the zeroing worker takes first, as an order (default 9: 2 MiB);
    /// after those, the pieces below it down to 64 KiB (`PIECE_ORDER`).
    pub zero_order: u8,
    /// Bytes zeroed per step (a power of two, 4 KiB..=1 GiB, default 2 MiB).
    pub zero_chunk: usize,
    /// A dirty block is zeroed only once it has been free this long (ms, default 20): a block
    /// the program reuses sooner is still hot in its CPU cache, and zeroing it would cost the
    /// program memory traffic and hand it a cold block (see docs/design.md, "Reuse-aware zeroing").
    pub zero_delay_ms: u32,
    /// Zeroed free bytes kept beyond the measured demand, once the program has asked for zeroed
    /// memory at all (default 32 MiB).
    pub zeroed_reserve: usize,
    /// Bytes kept resident and zeroed even past the reporting delay (opt-in, default 0).
    pub populated_reserve: usize,
    /// The soft memory limit (default `Auto`: the cgroup's, if any). Past it the reporter gives
    /// free memory back without waiting for `report_delay_ms`, and the zeroing worker adds no
    /// resident page; an allocation never fails because of it.
    pub memory_limit: MemoryLimit,
    /// Watch memory pressure (default on: PSI's memory stall where the kernel has it, else
    /// `MemAvailable` read at a low rate); while there is pressure, idle free memory goes back at
    /// once, the zeroed reserve first.
    pub pressure: bool,
}

impl Default for Tunables {
    fn default() -> Self {
        Tunables {
            report: true,
            report_order: 9,
            report_delay_ms: 2000,
            report_batch: 32,
            resident_free_min: 0,
            report_mode: ReportMode::Auto,
            zeroing: true,
            zero_order: 9,
            zero_chunk: 2 << 20,
            zero_delay_ms: 20,
            zeroed_reserve: 32 << 20,
            populated_reserve: 0,
            memory_limit: MemoryLimit::Auto,
            pressure: true,
        }
    }
}

/// Largest report batch (the in-flight table is sized for it).
pub const MAX_REPORT_BATCH: u32 = 256;

impl Tunables {
    /// Both workers off (nothing runs in the background).
    pub fn off() -> Tunables {
        Tunables { report: false, zeroing: false, ..Tunables::default() }
    }

    /// The smallest order the reporter takes in an arena: `report_order`, or below it down to
    /// `PIECE_ORDER` for the pieces, but in arenas of huge-page units (a report of less than a
    /// unit would split a huge page).
    pub(crate) fn report_lowest(&self, huge_units: bool) -> u8 {
        if huge_units {
            self.report_order
        } else {
            self.report_order.min(PIECE_ORDER)
        }
    }

    /// The smallest order the zeroing worker takes: `zero_order`, or below it down to
    /// `PIECE_ORDER` for the pieces.
    pub(crate) fn zero_lowest(&self) -> u8 {
        self.zero_order.min(PIECE_ORDER)
    }

    /// The orders a worker scans, `lowest..=max`: from `main` (its own order, `report_order`
    /// or `zero_order`) up, then the pieces below it downwards (`PIECE_ORDER`); with
    /// `largest_first` (the reporter under a squeeze), from `max` down.
    pub(crate) fn scan_orders(lowest: u8, main: u8, max: u8, largest_first: bool) -> impl Iterator<Item = u8> {
        let main = main.min(max);
        let lowest = lowest.min(main);
        (0..=max - lowest).map(move |i| {
            if largest_first {
                max - i
            } else if i <= max - main {
                main + i
            } else {
                main - 1 - (i - (max - main + 1))
            }
        })
    }

    /// The report mode in effect for this backing.
    pub fn effective_mode(&self, backing: Backing) -> ReportMode {
        match (self.report_mode, backing) {
            (ReportMode::Auto, Backing::Memfd) => ReportMode::Punch,
            (ReportMode::Auto, Backing::Anonymous) => ReportMode::DontNeed,
            (m, _) => m,
        }
    }

    pub fn validate(&self, cfg: &Config) -> Result<(), Error> {
        let bad = |setting, message| Err(Error::Config { setting, message });
        if self.report_order > MAX_ORDER_LIMIT {
            return bad("report_order", "must be between 0 and 30 (above max_order means max_order)");
        }
        if cfg.thp && self.report_order < 9 {
            return bad("report_order", "must be between 9 (2 MiB) and max_order when thp is on");
        }
        if self.report_delay_ms > MAX_DELAY_MS {
            return bad("report_delay", "must be between 0 and 3600 s");
        }
        if self.report_batch == 0 || self.report_batch > MAX_REPORT_BATCH {
            return bad("report_batch", "must be between 1 and 256 blocks");
        }
        match (self.report_mode, cfg.backing) {
            (ReportMode::Punch, Backing::Anonymous) => {
                return bad("report_mode", "punch needs the memfd backing; accepted: auto, dontneed, free")
            }
            (ReportMode::DontNeed | ReportMode::Free, Backing::Memfd) => {
                return bad("report_mode", "dontneed and free do not free memfd pages; accepted: auto, punch")
            }
            _ => {}
        }
        if self.zero_order > MAX_ORDER_LIMIT {
            return bad("zero_order", "must be between 0 and 30 (above max_order means max_order)");
        }
        if self.zero_delay_ms > MAX_DELAY_MS {
            return bad("zero_delay_ms", "must be between 0 and 3600 s");
        }
        if !self.zero_chunk.is_power_of_two() || self.zero_chunk < 4096 || self.zero_chunk > 1 << 30 {
            return bad("zero_chunk", "must be a power of two between 4 KiB and 1 GiB (above the largest block means the largest block)");
        }
        if matches!(self.memory_limit, MemoryLimit::Bytes(n) if n < MIN_MEMORY_LIMIT) {
            return bad("memory_limit", "must be off, auto or at least 4096 bytes (one page)");
        }
        Ok(())
    }

    /// The settings in effect for an allocator with this configuration: orders and chunk above
    /// the largest block mean the largest block (so that the defaults suit any `max_order`).
    pub fn clamped(mut self, cfg: &Config) -> Tunables {
        self.report_order = self.report_order.min(cfg.max_order);
        self.zero_order = self.zero_order.min(cfg.max_order);
        self.zero_chunk = self.zero_chunk.min(4096 << cfg.max_order);
        self
    }
}

impl core::str::FromStr for ReportMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<ReportMode, Error> {
        match s {
            "auto" => Ok(ReportMode::Auto),
            "dontneed" => Ok(ReportMode::DontNeed),
            "free" => Ok(ReportMode::Free),
            "punch" => Ok(ReportMode::Punch),
            _ => Err(Error::Config { setting: "report_mode", message: "accepted: auto, dontneed, free, punch" }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Tunables;

    #[test]
    fn a_worker_scans_its_orders_up_then_the_pieces_down() {
        let seq = |lowest, main, max, largest_first| Tunables::scan_orders(lowest, main, max, largest_first).collect::<Vec<u8>>();
        assert_eq!(seq(4, 9, 12, false), vec![9, 10, 11, 12, 8, 7, 6, 5, 4]);
        assert_eq!(seq(4, 9, 12, true), vec![12, 11, 10, 9, 8, 7, 6, 5, 4]);
        assert_eq!(seq(9, 9, 12, false), vec![9, 10, 11, 12]);
        assert_eq!(seq(0, 0, 3, false), vec![0, 1, 2, 3]);
        assert_eq!(seq(4, 6, 6, false), vec![6, 5, 4]);
    }
}
