//! Statistics: a snapshot taken under the allocator lock in time proportional to the number of
//! arenas (every figure is a counter kept as the lists change, none is computed by a walk).

use crate::config::ORDERS;
use crate::os::PAGE_SIZE;
use crate::page::{Class, CLASSES};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Free blocks on the lists, by class (dirty, zeroed, reported) and order: `/proc/buddyinfo`
    /// split by state.
    pub free_blocks: [[u64; ORDERS]; CLASSES],
    /// Free pages by state.
    pub free_dirty_pages: u64,
    pub free_zeroed_pages: u64,
    pub free_reported_pages: u64,
    pub free_lazy_pages: u64,
    /// Free pages taken off the lists by a background worker at this moment.
    pub isolated_pages: u64,
    /// Bytes in live blocks (page-rounded).
    pub bytes_in_use: u64,
    /// Bytes past the request in live blocks that a per-thread cache served whole (a request of
    /// 65..127 pages gets a block of 128): unused, their pages keep their free states, and they
    /// come back with the block.
    pub slack_bytes: u64,
    pub live_blocks: u64,
    /// Address space reserved, and in how many arenas.
    pub reserved_bytes: u64,
    pub arenas: u64,
    pub alloc_calls: u64,
    pub free_calls: u64,
    /// Bytes of `ZERO` requests served without a memset (zeroed or reported pages).
    pub zero_skipped_bytes: u64,
    /// Bytes memset on the allocation path for `ZERO` requests.
    pub zeroed_on_alloc_bytes: u64,
    /// Bytes handed out that were reported (so faulted back in by the caller or `POPULATE`).
    pub reused_reported_bytes: u64,
    /// Bytes `mlock`ed at this moment.
    pub locked_bytes: u64,
    /// Free pages held in per-thread caches (already counted in the free pages by state and in
    /// `free_blocks`: memory in a cache is free).
    pub cached_pages: u64,
    /// Allocations and frees served by a per-thread cache without the lock.
    pub cache_hits: u64,
    /// Batched refills and drains of per-thread caches (each one hold of the lock).
    pub cache_refills: u64,
    pub cache_drains: u64,
    /// Caches of idle threads drained by the reporting worker (each a hold of the lock).
    pub cache_remote_drains: u64,
    // ---- Free page reporting (report.rs) ----
    /// Bytes given back to the kernel (pages that were resident when reported).
    pub reported_bytes: u64,
    /// System calls made to report (`process_madvise`, `madvise`, `fallocate`).
    pub report_calls: u64,
    /// Batches reported (one pass of the reporter each).
    pub report_batches: u64,
    /// Blocks handed out that held reported pages.
    pub reported_blocks_reused: u64,
    /// Nanoseconds spent in the reporting system calls.
    pub report_ns: u64,
    /// Blocks whose report the kernel refused (put back unchanged).
    pub report_failures: u64,
    // ---- Background zeroing (zero.rs) ----
    /// Bytes zeroed by the zeroing worker.
    pub zeroed_background_bytes: u64,
    /// Nanoseconds the zeroing worker spent zeroing.
    pub zeroing_ns: u64,
    /// Bytes made resident and zero by the zeroing worker for `populated_reserve`.
    pub populated_bytes: u64,
    /// Background-zeroed bytes that were never used as zeros: reported afterwards, or handed to a
    /// request that did not ask for zeros.
    pub zeroing_wasted_bytes: u64,
    /// The zeroing worker's current estimate of `ZERO` demand (bytes wanted zeroed soon).
    pub zero_demand_bytes: u64,
    /// Naps the workers took because no CPU was idle (each 10 ms to 100 ms; see `worker::IdleGate`).
    pub busy_cpu_naps: u64,
    /// Times the zeroing worker looked for work under the lock (its MEASURE step).
    pub zero_scans: u64,
}

/// Counters of the workers, kept under the allocator lock (part of `Heap`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ReclaimCounters {
    pub reported_bytes: u64,
    pub report_calls: u64,
    pub report_batches: u64,
    pub report_ns: u64,
    pub report_failures: u64,
    pub zeroed_then_reported_bytes: u64,
    pub zeroed_background_bytes: u64,
    pub zeroing_ns: u64,
    pub populated_bytes: u64,
    pub zero_demand_bytes: u64,
    pub busy_cpu_naps: u64,
    pub zero_scans: u64,
}

impl ReclaimCounters {
    pub fn fill(&self, s: &mut Stats) {
        s.reported_bytes = self.reported_bytes;
        s.report_calls = self.report_calls;
        s.report_batches = self.report_batches;
        s.report_ns = self.report_ns;
        s.report_failures = self.report_failures;
        s.zeroed_background_bytes = self.zeroed_background_bytes;
        s.zeroing_ns = self.zeroing_ns;
        s.populated_bytes = self.populated_bytes;
        s.zero_demand_bytes = self.zero_demand_bytes;
        s.busy_cpu_naps = self.busy_cpu_naps;
        s.zero_scans = self.zero_scans;
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
        let top = self
            .free_blocks
            .iter()
            .flat_map(|row| row.iter().enumerate().filter(|(_, n)| **n > 0).map(|(o, _)| o))
            .max()
            .unwrap_or(0);
        for class in Class::ALL {
            s.push_str(&format!("{:>9}", class.name()));
            for o in 0..=top {
                s.push_str(&format!(" {:>6}", self.free_blocks[class as usize][o]));
            }
            s.push('\n');
        }
        s
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |pages: u64| pages as f64 * PAGE_SIZE as f64 / (1 << 20) as f64;
        let b = |bytes: u64| bytes as f64 / (1 << 20) as f64;
        writeln!(f, "in use:        {:>10.1} MiB in {} blocks", b(self.bytes_in_use), self.live_blocks)?;
        if self.slack_bytes > 0 {
            writeln!(f, "slack:         {:>10.1} MiB past the requests in cache-served blocks", b(self.slack_bytes))?;
        }
        writeln!(
            f,
            "free:          {:>10.1} MiB dirty, {:.1} MiB zeroed, {:.1} MiB reported, {:.1} MiB lazy-free, {:.1} MiB isolated",
            mib(self.free_dirty_pages),
            mib(self.free_zeroed_pages),
            mib(self.free_reported_pages),
            mib(self.free_lazy_pages),
            mib(self.isolated_pages)
        )?;
        writeln!(f, "reserved:      {:>10.1} MiB in {} arenas", b(self.reserved_bytes), self.arenas)?;
        writeln!(f, "calls:         {} allocs, {} frees", self.alloc_calls, self.free_calls)?;
        writeln!(
            f,
            "zeroing:       {:.1} MiB skipped, {:.1} MiB memset on allocation",
            b(self.zero_skipped_bytes),
            b(self.zeroed_on_alloc_bytes)
        )?;
        writeln!(f, "reported reuse:{:>10.1} MiB", b(self.reused_reported_bytes))?;
        writeln!(
            f,
            "reporting:     {:.1} MiB in {} batches, {} calls, {:.1} ms in syscalls, {} blocks reused",
            b(self.reported_bytes),
            self.report_batches,
            self.report_calls,
            self.report_ns as f64 / 1e6,
            self.reported_blocks_reused
        )?;
        writeln!(
            f,
            "bg zeroing:    {:.1} MiB zeroed in {:.1} ms, {:.1} MiB populated, {:.1} MiB wasted, demand {:.1} MiB",
            b(self.zeroed_background_bytes),
            self.zeroing_ns as f64 / 1e6,
            b(self.populated_bytes),
            b(self.zeroing_wasted_bytes),
            b(self.zero_demand_bytes)
        )?;
        writeln!(f, "workers:       {} naps for want of an idle CPU, {} zeroing scans", self.busy_cpu_naps, self.zero_scans)?;
        writeln!(
            f,
            "thread caches: {:>10.1} MiB cached, {} hits, {} refills, {} drains, {} idle caches drained",
            mib(self.cached_pages),
            self.cache_hits,
            self.cache_refills,
            self.cache_drains,
            self.cache_remote_drains
        )?;
        write!(f, "free blocks by order:\n{}", self.buddyinfo())
    }
}
