//! Statistics: a snapshot taken under the allocator lock in time proportional to the number of
//! arenas (every figure is a counter kept as the lists change, none is computed by a walk).
//!
//! Every figure is defined once, in the table `stats_table!` below: its name, its unit and its
//! doc. From the table come the fields of [`Stats`], its report (`Display` and
//! [`Stats::write_report`], one line per figure, the preload's exit report too), the C mirror
//! [`CStats`] (`struct fallow_stats` of `include/fallow.h`) with its conversion, and
//! [`C_FIELDS`], the C layout that a test of `fallow-capi` compares with the header.
//!
//! The table has two parts. `c`: the figures of `struct fallow_stats`, in its order, which is
//! ABI (a program built against an older header passes a struct of that size, so a figure added
//! there goes at its end, read by `fallow_stats_read_size`, which takes the caller's size;
//! `fallow_stats_read` fills the struct up to `C_STATS_V1_SIZE` bytes only; `C_STATS_V2_SIZE` is
//! the struct before the small objects' figures). `rust`: the figures only `Stats` has.

use core::fmt::{self, Write};

use crate::config::ORDERS;
use crate::os::PAGE_SIZE;
use crate::page::{Class, CLASSES};

/// What a figure counts, which fixes its Rust and C type and how the report prints it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Events or objects, printed as is.
    Count,
    /// Bytes, printed in MiB.
    Bytes,
    /// 4 KiB pages, printed as a count and in MiB.
    Pages,
    /// Nanoseconds, printed in milliseconds.
    Ns,
    /// Free blocks by class and order (`[[u64; ORDERS]; CLASSES]`), printed as a table after the
    /// single figures.
    Blocks,
    /// Where the memory limit in force comes from, a code printed by name (`LIMIT_SOURCES`).
    LimitSource,
    /// Which memory pressure signal the reporter watches, a code printed by name
    /// (`PRESSURE_SIGNALS`).
    PressureSignal,
}

/// Names of `memory_limit_source`'s codes (the index is the code).
pub const LIMIT_SOURCES: [&str; 5] =
    ["none", "setting", "cgroup v2 memory.high", "cgroup v2 memory.max", "cgroup v1 memory.limit_in_bytes"];
/// `memory_limit_source` codes.
pub const SOURCE_NONE: u64 = 0;
pub const SOURCE_SETTING: u64 = 1;
pub const SOURCE_V2_HIGH: u64 = 2;
pub const SOURCE_V2_MAX: u64 = 3;
pub const SOURCE_V1: u64 = 4;

/// Names of `pressure_signal`'s codes (the index is the code).
pub const PRESSURE_SIGNALS: [&str; 5] =
    ["off", "psi cgroup memory.pressure", "psi /proc/pressure/memory", "MemAvailable polling", "none"];
/// `pressure_signal` codes.
pub const SIGNAL_OFF: u64 = 0;
pub const SIGNAL_PSI_CGROUP: u64 = 1;
pub const SIGNAL_PSI_SYSTEM: u64 = 2;
pub const SIGNAL_MEMAVAILABLE: u64 = 3;
pub const SIGNAL_NONE: u64 = 4;

impl Unit {
    /// The array dimensions of a figure of this unit (outermost first); none for a single `u64`.
    pub const fn dims(self) -> &'static [usize] {
        match self {
            Unit::Blocks => &[CLASSES, ORDERS],
            _ => &[],
        }
    }
}

/// The type of a figure of each unit.
macro_rules! unit_type {
    (Blocks) => { [[u64; ORDERS]; CLASSES] };
    ($other:ident) => { u64 };
}

/// One field of the C struct: its name, element type, array dimensions (none for a scalar) and
/// offset in `CStats`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CField {
    pub name: &'static str,
    pub c_type: &'static str,
    pub dims: &'static [usize],
    pub offset: usize,
}

/// The one list of the statistics; `$m` receives it (`define_stats!`).
macro_rules! stats_table {
    ($m:ident) => { $m! {
    c {
        /// Bytes in live blocks (page-rounded).
        bytes_in_use: Bytes,
        live_blocks: Count,
        /// Free pages by state.
        free_dirty_pages: Pages,
        free_zeroed_pages: Pages,
        free_reported_pages: Pages,
        free_lazy_pages: Pages,
        /// Free pages taken off the lists by a background worker at this moment.
        isolated_pages: Pages,
        /// Address space reserved, and in how many arenas.
        reserved_bytes: Bytes,
        arenas: Count,
        alloc_calls: Count,
        free_calls: Count,
        /// Bytes of `ZERO` requests served without a memset (zeroed or reported pages).
        zero_skipped_bytes: Bytes,
        /// Bytes memset on the allocation path for `ZERO` requests.
        zeroed_on_alloc_bytes: Bytes,
        /// Bytes handed out that were not resident: reported, or never touched (so faulted in
        /// by the caller or `POPULATE`).
        reused_reported_bytes: Bytes,
        /// Bytes `mlock`ed at this moment.
        locked_bytes: Bytes,
        /// Free pages held in per-thread caches (already counted in the free pages by state and
        /// in `free_blocks`: memory in a cache is free).
        cached_pages: Pages,
        /// Allocations and frees served by a per-thread cache without the lock.
        cache_hits: Count,
        /// Bytes given back to the kernel (pages that were resident when reported), by the
        /// reporting worker and by trims on demand.
        reported_bytes: Bytes,
        /// System calls made to report (`process_madvise`, `madvise`, `fallocate`).
        report_calls: Count,
        /// Batches reported (one pass of the reporter each).
        report_batches: Count,
        /// Nanoseconds spent in the reporting system calls.
        report_ns: Ns,
        /// Blocks handed out that held reported pages.
        reported_blocks_reused: Count,
        /// Bytes zeroed by the zeroing worker.
        zeroed_background_bytes: Bytes,
        /// Background-zeroed bytes that were never used as zeros: reported afterwards, or handed
        /// to a request that did not ask for zeros.
        zeroing_wasted_bytes: Bytes,
        /// Bytes past the request in live blocks that a per-thread cache served whole (a request
        /// of 65..127 pages gets a block of 128): unused, their pages keep their free states, and
        /// they come back with the block.
        slack_bytes: Bytes,
        /// Free blocks on the lists, by class (dirty, zeroed, reported) and order:
        /// `/proc/buddyinfo` split by state.
        free_blocks: Blocks,
        // From here on: filled by `fallow_stats_read_size` only (`fallow_stats_read` writes the
        // fields above, the struct as it was before these were added).
        /// The soft memory limit in force (0: none); for a cgroup's limit, the limit less the
        /// margin for what fallow does not own. Known once the reporting worker has started.
        memory_limit_bytes: Bytes,
        /// Where it comes from: none, the setting, or the cgroup file.
        memory_limit_source: LimitSource,
        /// What the limit was last compared with: fallow's resident memory (live blocks and
        /// free pages not reported) for a set limit, the cgroup's usage less its inactive file
        /// cache for a cgroup's.
        memory_limit_usage_bytes: Bytes,
        /// Times the usage passed the limit (each time it went from below to above).
        memory_limit_hits: Count,
        /// Bytes given back before their reporting delay because the limit was passed.
        limit_reported_bytes: Bytes,
        /// The memory pressure signal watched: PSI stall (the cgroup's or the system's),
        /// `MemAvailable` polling, none found, or off.
        pressure_signal: PressureSignal,
        /// Times pressure was signalled (150 ms of memory stall within a second, `MemAvailable`
        /// fell low).
        pressure_events: Count,
        /// Bytes given back before their reporting delay because of memory pressure.
        pressure_reported_bytes: Bytes,
        // From here on: the small objects' figures, filled by `fallow_stats_read_size` given a
        // struct of this size (a smaller one, `C_STATS_V2_SIZE` bytes, is the struct as it was
        // before them).
        /// Small objects (the slab layer, `Allocator::malloc`) live, and their bytes (class
        /// sizes): handed out and not yet back with their span's owner (one another thread
        /// freed counts until the owner collects it, at its next look at that span).
        small_live_objects: Count,
        small_live_bytes: Bytes,
        /// Spans (page blocks cut into small objects; counted in `bytes_in_use` as live
        /// blocks) held by the slab layer, and their bytes; of them, spare ones (empty, one kept
        /// per class and thread heap).
        small_spans: Count,
        small_span_bytes: Bytes,
        small_spare_spans: Count,
        /// Bytes of spans in no live small object: free objects, never-used ones, span tails.
        small_free_bytes: Bytes,
    }
    rust {
        /// Reserved address space never used: free pages never touched (a lower bound: those
        /// past the highest page ever used in each arena, and of the free reported pages below
        /// it, those beyond all the pages ever given back). Counted in `free_reported_pages` too,
        /// as its pages read zero and are not resident, but never given back: never memory.
        never_used_pages: Pages,
        /// Batched refills and drains of per-thread caches (each one hold of the lock).
        cache_refills: Count,
        cache_drains: Count,
        /// Caches of idle threads drained by the reporting worker (each a hold of the lock).
        cache_remote_drains: Count,
        /// Blocks whose report the kernel refused (put back unchanged).
        report_failures: Count,
        /// Trims on demand (`Allocator::trim`, the preload's `malloc_trim`), and the bytes of free
        /// blocks they gave back (counted in `reported_bytes` too; what their trims of the
        /// calling thread's live spans gave back is in `small_trimmed_pages_total`).
        trims: Count,
        trimmed_bytes: Bytes,
        /// Free dirty bytes the zeroing worker found never written (nothing behind them, or the
        /// shared zero page, released) and listed `Reported` instead of zeroing them.
        zeroing_unwritten_bytes: Bytes,
        /// Nanoseconds the zeroing worker spent zeroing.
        zeroing_ns: Ns,
        /// Bytes made resident and zero by the zeroing worker for `populated_reserve`.
        populated_bytes: Bytes,
        /// Bytes of dirty pages of `ZERO` requests of 32 MiB or more that were left without a
        /// memset because the program never wrote them (nothing behind them, or the shared zero
        /// page: `/proc/self/pagemap`), so they read zero already.
        zero_unwritten_bytes: Bytes,
        /// The zeroing worker's current estimate of `ZERO` demand (bytes wanted zeroed soon).
        zero_demand_bytes: Bytes,
        /// Naps the workers took because no CPU was idle (each 10 ms to 100 ms; see
        /// `worker::IdleGate`).
        busy_cpu_naps: Count,
        /// Times the zeroing worker looked for work under the lock (its MEASURE step).
        zero_scans: Count,
        /// Pages of live spans (small objects) given back to the kernel by their owner's trims
        /// and not yet taken again: not resident, though counted in `small_span_bytes` and
        /// `bytes_in_use` (the span is one live page block). The never-used pages a trim gave
        /// back (slab/tail.rs) are not counted here, though they are not resident either.
        small_trimmed_pages: Pages,
        /// Trims of live spans made, and the pages they gave back in all.
        small_trims: Count,
        small_trimmed_pages_total: Pages,
        /// Spans given back by another thread than their owner: spans the owner found full and
        /// parked, whose every object other threads then freed while the owner did not take
        /// them back (an owner that sleeps would hold them for as long as it sleeps).
        small_claimed_spans: Count,
    }
    } };
}

macro_rules! define_stats {
    (
        c { $( $(#[doc = $cdoc:literal])* $c:ident : $cu:ident, )* }
        rust { $( $(#[doc = $rdoc:literal])* $r:ident : $ru:ident, )* }
    ) => {
        /// A snapshot of the statistics (`Allocator::stats`); printed by `Display` or
        /// [`Stats::write_report`].
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct Stats {
            $( $(#[doc = $cdoc])* pub $c: unit_type!($cu), )*
            $( $(#[doc = $rdoc])* pub $r: unit_type!($ru), )*
        }

        /// `struct fallow_stats` of `include/fallow.h`: the figures of the table's `c` part, in
        /// its order.
        #[repr(C)]
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub struct CStats {
            $( $(#[doc = $cdoc])* pub $c: unit_type!($cu), )*
        }

        impl From<&Stats> for CStats {
            fn from(s: &Stats) -> CStats {
                CStats { $( $c: s.$c, )* }
            }
        }

        /// The layout of `CStats`, field by field in order.
        pub const C_FIELDS: &[CField] = &[
            $( CField {
                name: stringify!($c),
                c_type: "uint64_t",
                dims: Unit::$cu.dims(),
                offset: core::mem::offset_of!(CStats, $c),
            }, )*
        ];

        /// Every figure of `Stats`, in the table's order: name and unit.
        pub const FIELDS: &[(&str, Unit)] = &[
            $( (stringify!($c), Unit::$cu), )*
            $( (stringify!($r), Unit::$ru), )*
        ];

        impl Stats {
            /// Each single figure as one line `PREFIX name: value`, in the table's order.
            fn write_figures(&self, w: &mut dyn Write, prefix: &str) -> fmt::Result {
                $( Figure::write(&self.$c, w, prefix, stringify!($c), Unit::$cu)?; )*
                $( Figure::write(&self.$r, w, prefix, stringify!($r), Unit::$ru)?; )*
                Ok(())
            }
        }
    };
}

stats_table!(define_stats);

/// The size of `struct fallow_stats` before the memory limit's figures were added: what
/// `fallow_stats_read` writes (a program built against that header passes a struct this large).
pub const C_STATS_V1_SIZE: usize = core::mem::offset_of!(CStats, memory_limit_bytes);
/// The size of `struct fallow_stats` with the memory limit's figures and before the small
/// objects' were added (a program built against that header passes it to
/// `fallow_stats_read_size`, which fills that much).
pub const C_STATS_V2_SIZE: usize = core::mem::offset_of!(CStats, small_live_objects);

/// How a field of `Stats` is printed on its line (the tables are printed apart, by
/// `write_buddyinfo`).
trait Figure {
    fn write(&self, w: &mut dyn Write, prefix: &str, name: &str, unit: Unit) -> fmt::Result;
}

impl Figure for u64 {
    fn write(&self, w: &mut dyn Write, prefix: &str, name: &str, unit: Unit) -> fmt::Result {
        const NAME_WIDTH: usize = 25;
        let v = *self;
        let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
        write!(w, "{prefix}{name}:{:pad$}", "", pad = NAME_WIDTH.saturating_sub(name.len()))?;
        match unit {
            Unit::Count | Unit::Blocks => writeln!(w, "{v:>10}"),
            Unit::LimitSource => writeln!(w, "{:>10}", LIMIT_SOURCES.get(v as usize).unwrap_or(&"?")),
            Unit::PressureSignal => writeln!(w, "{:>10}", PRESSURE_SIGNALS.get(v as usize).unwrap_or(&"?")),
            Unit::Bytes => writeln!(w, "{:>10.1} MiB", mib(v)),
            Unit::Pages => writeln!(w, "{v:>10} ({:.1} MiB)", mib(v * PAGE_SIZE as u64)),
            Unit::Ns => writeln!(w, "{:>10.1} ms", v as f64 / 1e6),
        }
    }
}

impl Figure for [[u64; ORDERS]; CLASSES] {
    fn write(&self, _: &mut dyn Write, _: &str, _: &str, _: Unit) -> fmt::Result {
        Ok(())
    }
}

/// Counters of the workers, kept under the allocator lock (part of `Heap`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ReclaimCounters {
    pub reported_bytes: u64,
    pub report_calls: u64,
    pub report_batches: u64,
    pub report_ns: u64,
    pub report_failures: u64,
    pub trims: u64,
    pub trimmed_bytes: u64,
    pub zeroed_then_reported_bytes: u64,
    pub zeroed_background_bytes: u64,
    pub zeroing_unwritten_bytes: u64,
    pub zeroing_ns: u64,
    pub populated_bytes: u64,
    pub zero_demand_bytes: u64,
    pub busy_cpu_naps: u64,
    pub zero_scans: u64,
    pub memory_limit_bytes: u64,
    pub memory_limit_source: u64,
    pub memory_limit_usage_bytes: u64,
    pub memory_limit_hits: u64,
    pub limit_reported_bytes: u64,
    pub pressure_signal: u64,
    pub pressure_events: u64,
    pub pressure_reported_bytes: u64,
}

impl ReclaimCounters {
    pub fn fill(&self, s: &mut Stats) {
        s.reported_bytes = self.reported_bytes;
        s.report_calls = self.report_calls;
        s.report_batches = self.report_batches;
        s.report_ns = self.report_ns;
        s.report_failures = self.report_failures;
        s.trims = self.trims;
        s.trimmed_bytes = self.trimmed_bytes;
        s.zeroed_background_bytes = self.zeroed_background_bytes;
        s.zeroing_unwritten_bytes = self.zeroing_unwritten_bytes;
        s.zeroing_ns = self.zeroing_ns;
        s.populated_bytes = self.populated_bytes;
        s.zero_demand_bytes = self.zero_demand_bytes;
        s.busy_cpu_naps = self.busy_cpu_naps;
        s.zero_scans = self.zero_scans;
        s.memory_limit_bytes = self.memory_limit_bytes;
        s.memory_limit_source = self.memory_limit_source;
        s.memory_limit_usage_bytes = self.memory_limit_usage_bytes;
        s.memory_limit_hits = self.memory_limit_hits;
        s.limit_reported_bytes = self.limit_reported_bytes;
        s.pressure_signal = self.pressure_signal;
        s.pressure_events = self.pressure_events;
        s.pressure_reported_bytes = self.pressure_reported_bytes;
    }
}

impl Stats {
    pub fn free_pages(&self) -> u64 {
        self.free_dirty_pages + self.free_zeroed_pages + self.free_reported_pages + self.free_lazy_pages
    }

    /// Free bytes that are resident: dirty and zeroed pages (lazily freed pages may or may not be).
    pub fn resident_free_bytes(&self) -> u64 {
        (self.free_dirty_pages + self.free_zeroed_pages) * PAGE_SIZE as u64
    }

    /// A `/proc/buddyinfo`-like table, one line per class.
    pub fn buddyinfo(&self) -> String {
        let mut s = String::new();
        let _ = self.write_buddyinfo(&mut s, "");
        s
    }

    /// `buddyinfo`, each line after `prefix`, without allocating.
    fn write_buddyinfo(&self, w: &mut dyn Write, prefix: &str) -> fmt::Result {
        let top = self
            .free_blocks
            .iter()
            .flat_map(|row| row.iter().enumerate().filter(|(_, n)| **n > 0).map(|(o, _)| o))
            .max()
            .unwrap_or(0);
        for class in Class::ALL {
            write!(w, "{prefix}{:>9}", class.name())?;
            for o in 0..=top {
                write!(w, " {:>6}", self.free_blocks[class as usize][o])?;
            }
            writeln!(w)?;
        }
        Ok(())
    }

    /// Where the reserved address space is, in plain words: never used, live, free by state
    /// (each line in MiB with what it means), adding up to `reserved_bytes`. Reserved address
    /// space costs no memory until a page is touched, so "never used" is not memory given back.
    fn write_summary(&self, w: &mut dyn Write, prefix: &str) -> fmt::Result {
        let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
        let pages = |n: u64| mib(n * PAGE_SIZE as u64);
        let arenas = if self.arenas == 1 { "arena" } else { "arenas" };
        writeln!(
            w,
            "{prefix}address space reserved: {:.1} MiB in {} {arenas} (memory only where touched), of which:",
            mib(self.reserved_bytes),
            self.arenas
        )?;
        let given_back = self.free_reported_pages.saturating_sub(self.never_used_pages);
        let lines: [(&str, f64, &str); 8] = [
            ("never used", pages(self.never_used_pages), "address space only, never touched"),
            ("live", mib(self.bytes_in_use), "in blocks handed out"),
            ("slack", mib(self.slack_bytes), "past the request in live blocks served whole"),
            ("free, dirty", pages(self.free_dirty_pages), "resident, old contents"),
            ("free, zeroed", pages(self.free_zeroed_pages), "resident, zeroed ahead of need"),
            ("free, reported", pages(given_back), "given back to the kernel, not resident"),
            ("free, lazily reported", pages(self.free_lazy_pages), "given back with MADV_FREE, maybe resident"),
            ("held by a worker", pages(self.isolated_pages), "being zeroed or reported right now"),
        ];
        for (name, v, what) in lines {
            writeln!(w, "{prefix}  {name:<22}{v:>10.1} MiB  {what}")?;
        }
        Ok(())
    }

    /// The report: first where the reserved address space is (never used, live, free by state,
    /// in plain words), then every single figure on a line of its own under `counters:` (`name:
    /// value`, bytes and pages in MiB, nanoseconds in ms), then the free blocks by class and
    /// order; each line starts with `prefix`. Writes into `w` and allocates nothing (the preload
    /// prints it from inside `malloc`'s library at exit, into a buffer on the stack).
    pub fn write_report(&self, w: &mut dyn Write, prefix: &str) -> fmt::Result {
        self.write_summary(w, prefix)?;
        writeln!(w, "{prefix}counters:")?;
        self.write_figures(w, prefix)?;
        writeln!(w, "{prefix}free blocks by order:")?;
        self.write_buddyinfo(w, prefix)
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_report(f, "")
    }
}
