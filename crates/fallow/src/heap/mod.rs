//! The locked allocator: arenas behind one lock, and what one allocator's handles, per-thread
//! caches and workers share (`Shared`). Its parts: `view` (what the hit paths read of an arena
//! without the lock), `locked` (allocation, free, resize and growth under the lock), `isolate`
//! (the workers' interface: take an idle block out, put it back in a new state) and `workers`
//! (waking, starting and stopping the workers after a free). It imports the layers below it
//! (`buddy`, `arena`, `page`, `worker`, `config`, `os`) and nothing above.
//!
//! Locking. One lock (`Shared::heap`) guards every free list, the records (`BlockMeta`) of free,
//! isolated and unlisted blocks and every state byte of a free page; a cached block's record
//! word belongs to the cache's owner (docs/design.md, "Access rules", says who may touch what).
//! It is held for bookkeeping only: the memset of a `ZERO` request, the `madvise` of `POPULATE`,
//! the `mlock` of `LOCK`, the `mmap` of a new arena all run after it is released, on pages that
//! the caller already owns. State bytes of pages in a live block belong to the block's owner and
//! are written outside the lock (they are atomics, read under the lock only to classify a bad
//! `free`).
//!
//! Arena table. Arenas are installed once into a fixed table of `MAX_ARENAS` slots and never
//! move or go away before the allocator does, so their address ranges are published in atomics
//! and `owns` is a lock-free range check (the preload library's ownership test).

mod isolate;
mod locked;
mod view;
mod workers;

use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

use crate::buddy::{resident_preference, Buddy, Taken};
use crate::config::{Config, Tunables, BIG_ORDER};
use crate::error::Error;
use crate::lock::{self, Locked};
use crate::os::{self, PAGE_SHIFT, PAGE_SIZE};
use crate::page::{Class, Tag, META_FREED_START, META_SLACK};
use crate::stats::ReclaimCounters;
use crate::worker::{self, Worker};

pub(crate) use isolate::{Inflight, INFLIGHT, TRIM_BATCH, TRIM_SLOT, ZERO_SLOT};
pub(crate) use locked::Reclaim;
pub(crate) use view::{ArenaView, HitPath, CACHE_LINE, LINE};
pub use view::{SPAN_END, SPAN_START};
#[cfg(test)]
pub(crate) use view::HIT_LINE;
use view::HitGap;

/// Arenas an allocator may install (its arena table is fixed: arenas never move).
pub(crate) const MAX_ARENAS: usize = 64;

/// Counters kept under the lock.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counters {
    pub alloc_calls: u64,
    pub free_calls: u64,
    pub zero_skipped_bytes: u64,
    pub zeroed_on_alloc_bytes: u64,
    pub zero_unwritten_bytes: u64,
    pub reused_reported_bytes: u64,
    pub locked_bytes: u64,
    /// Wrapping (read as signed): a block served by a per-thread cache and freed on the locked
    /// path is subtracted here before the cache's hit is folded in. `stats()` adds the unfolded
    /// hits of every cache, which makes the sum exact.
    pub in_use_pages: u64,
    pub live_blocks: u64,
    pub isolated_pages: u64,
    /// Blocks handed out that held reported (or lazily freed) pages.
    pub reported_blocks_reused: u64,
    /// Background-zeroed pages handed to a request that did not ask for zeros (bytes).
    pub zeroed_wasted_bytes: u64,
    /// Pages handed to per-thread caches and not yet drained back, as of the last fold of each
    /// cache's counters (`cache/`); wrapping, like `in_use_pages` and `live_blocks`, because a
    /// cache's unfolded hits may move pages either way.
    pub cached_pages: u64,
    pub cache_hits: u64,
    pub cache_refills: u64,
    pub cache_drains: u64,
    /// Caches of idle threads drained by the reporting worker (`cache::drain_unanswered`).
    pub cache_remote_drains: u64,
    /// Pages of live blocks freed as `Reported` (`free_reported`: moved away, not resident).
    /// With the reporter's `reported_bytes`, a bound on the free `Reported` pages that were ever
    /// touched (`Allocator::stats`, `never_used_pages`).
    pub freed_reported_pages: u64,
}

/// Everything the lock guards.
pub(crate) struct Heap {
    /// The arenas, in the order they were made. Its room for `MAX_ARENAS` is taken when the
    /// allocator is made, so that adding one never allocates (the preload's `malloc` may be the
    /// caller), and only the arenas made are written: a fixed array of them, built by value,
    /// made 80 KiB of the creating thread's stack and of the heap resident for good.
    pub arenas: Vec<Buddy>,
    pub counters: Counters,
    /// Settings of the background workers (changed by `Allocator::set_tunables`).
    pub tunables: Tunables,
    /// What the workers did (report.rs, zero.rs).
    pub reclaim: ReclaimCounters,
    /// Blocks isolated by a worker or a trim right now (`Tag::Isolated`, on no list): slots
    /// `0..MAX_REPORT_BATCH` belong to the reporter, `ZERO_SLOT` to the zeroing worker, the
    /// `TRIM_BATCH` from `TRIM_SLOT` to the trim that set `trimming`. Kept here so that a `fork`
    /// child, which has no workers and no trim under way, can put them back.
    pub inflight: [Inflight; INFLIGHT],
    /// A trim on demand holds the trim slots (trim.rs): another one waits. Reset in a `fork`
    /// child.
    pub trimming: bool,
    /// Allocations between deciding to wait for an isolated block and trying again
    /// (`Shared::alloc_locked`): while there are any, the zeroing worker isolates nothing new, so
    /// that the block they wait for comes back whole. Reset in a `fork` child (its waiters were
    /// the parent's other threads).
    pub isolation_waiters: u32,
    /// The per-thread caches of this allocator: the head of an intrusive list whose nodes are the
    /// caches themselves. The cache layer above owns every operation on it (cache/table.rs); the
    /// heap only keeps it under its lock, so that the reporter and the checks can walk it.
    pub caches: CacheList,
}

/// The head of the list of an allocator's per-thread caches (see `Heap::caches`). A cache is
/// a node of it; `head` is null or a registered cache, which the cache layer casts back.
pub(crate) struct CacheList {
    pub(crate) head: *mut (),
    /// A worker or a trim is between the freeze and the thaw of `cache::drain_unanswered`: no
    /// other starts its own (two interleaved freezes could thaw each other's).
    pub(crate) remote_drain: bool,
}

// SAFETY: the list's nodes are heap-allocated caches that are linked, unlinked and walked only
// under the allocator lock (the list lives in the locked `Heap`), from whichever thread holds it.
unsafe impl Send for CacheList {}

/// The entry functions of the two workers' threads.
pub(crate) struct WorkerEntries {
    pub report: worker::Entry,
    pub zero: worker::Entry,
}

/// What every handle, per-thread cache and worker of one allocator shares: the lock and what it
/// guards, the arena views and the cache hit-path words read without it, the worker words.
/// Page-aligned, so that `hit` and `views` sit at fixed page offsets (view.rs, "Page offsets of
/// the hit path's lines").
#[repr(C, align(4096))]
pub(crate) struct Shared {
    gap: HitGap,
    pub(crate) hit: HitPath,
    views: [ArenaView; MAX_ARENAS],
    pub heap: Locked<Heap>,
    pub config: Config,
    epoch_ns: u64,
    /// The free page reporting worker (report.rs) and the zeroing worker (zero.rs).
    pub(crate) reporter: Worker,
    pub(crate) zeroer: Worker,
    /// `Allocator` handles alive (workers hold the `Arc` but no handle): the last handle to go
    /// stops and joins the workers.
    handles: AtomicUsize,
    /// pidfd of this process for `process_madvise` (-1: not opened; -2: not usable), shared by
    /// the reporter and trims.
    pub(crate) pidfd: AtomicI32,
    /// The kernel refused an advice through `process_madvise`: reports and trims `madvise` block
    /// by block (the descriptor stays open until `close_worker_descriptors`: a trim in another
    /// thread may be using it).
    pub(crate) pidfd_refused: AtomicBool,
    /// The workers' thread entries (`report::thread_main`, `zero::thread_main`): given by the
    /// allocator layer, which sits above the workers, so that this layer names no worker.
    entries: WorkerEntries,
    /// Set by the first `ZERO` request (never cleared): until then the zeroing worker zeroes
    /// nothing but the populated reserve. An atomic because the per-thread caches serve `ZERO`
    /// requests without the lock and fold their counters only at refill and drain.
    pub(crate) zero_requested: AtomicBool,
    /// Set by a thread that freed a large block into its cache (cache/: on no list, where the
    /// zeroing worker cannot see it), cleared by the zeroing worker at each look while zeroing
    /// is on (`Shared::note_large_cached`).
    pub(crate) large_cached: AtomicBool,
    /// The zeroing worker's requests for idle threads' large cached blocks (zero.rs
    /// `ask_caches`): bumped by the worker, noted by a thread at each large free.
    pub(crate) large_generation: AtomicU64,
    /// Set by the reporter while the memory limit is passed or there is memory pressure
    /// (limit.rs): the zeroing worker then adds no resident page and zeroes nothing. Relaxed: a
    /// step more or less of zeroing is harmless.
    pub(crate) squeezed: AtomicBool,
    /// A pressure event made by hand (`Allocator::simulate_pressure`, for tests): the reporter
    /// takes it as a pressure event at its next look.
    pub(crate) pressure_injected: AtomicBool,
    /// Slack in live blocks (of the pages in use, those past the requests of blocks served
    /// whole: cache/mod.rs, "Slack"), process-wide: the caches' hand-outs add, every free of a
    /// block with slack subtracts, wherever it is freed; the statistics' `slack_bytes` and the
    /// slack bound (`slack_over`: cache/mod.rs, "The slack bound") read it.
    pub(crate) slack_held: SlackHeld,
    /// The online CPUs: the slack bound allows one live block with slack per thread with a
    /// cache, at least this many and at most twice as many, and the high mark
    /// (`config.cache_high_pages`) of slack pages per block it allows.
    pub(crate) slack_blocks_min: u64,
    /// Per-thread caches registered (`Heap::caches`; changed where a cache is linked and
    /// unlinked, under the lock), read without it by the slack bound: `Relaxed`, a count that
    /// only sizes the bound.
    pub(crate) caches_registered: AtomicU64,
}

/// The slack held in live blocks, two counts in one word so that a hand-out or a free of a
/// block with slack is one read-modify-write: its pages (low bits) and its live blocks (from
/// `BLOCK`). `Relaxed` read-modify-writes on the slack paths only, never on the hit paths; a
/// count nothing's memory safety relies on.
#[derive(Default)]
pub(crate) struct SlackHeld(AtomicU64);

impl SlackHeld {
    /// One live block in the packed word (pages below it: at most 2^40 pages, 4 PiB).
    const BLOCK: u64 = 1 << 40;

    /// A block with `pages` (non-zero) of slack was handed out.
    pub(crate) fn add(&self, pages: u32) {
        debug_assert!(pages != 0, "a block with slack has slack");
        self.0.fetch_add(Self::BLOCK + pages as u64, Ordering::Relaxed);
    }

    /// A block with `pages` (non-zero) of slack was freed, or its slack given back. Each field
    /// stops at 0: a double free that escaped detection (two frees of one live block racing on
    /// the hit path, which the design allows: docs/design.md, "Access rules") subtracts its
    /// block twice, and the word wrapped would keep every later request off slack for good; at
    /// 0, the bound is off by that one block at most.
    pub(crate) fn sub(&self, pages: u32) {
        debug_assert!(pages != 0, "a block with slack has slack");
        let _ = self.0.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
            let (blocks, held) = (w / Self::BLOCK, w & (Self::BLOCK - 1));
            Some(blocks.saturating_sub(1) * Self::BLOCK + held.saturating_sub(pages as u64))
        });
    }

    /// Slack pages in live blocks.
    pub(crate) fn pages(&self) -> u64 {
        self.0.load(Ordering::Relaxed) & (Self::BLOCK - 1)
    }

    /// Live blocks with slack.
    pub(crate) fn blocks(&self) -> u64 {
        self.0.load(Ordering::Relaxed) / Self::BLOCK
    }
}

impl Shared {
    /// The largest block, in bytes.
    pub(crate) fn max_block(&self) -> usize {
        PAGE_SIZE << self.config.max_order
    }

    /// Milliseconds since the allocator began (the clock of `BlockMeta::freed_at_ms`).
    pub(crate) fn now_ms(&self) -> u32 {
        ((os::now_ns() - self.epoch_ns) / 1_000_000) as u32
    }

    /// A worker's wait for an idle CPU before its next step (`IdleGate::wait`), its naps counted
    /// in `busy_cpu_naps` (the lock is taken only when it napped).
    pub(crate) fn wait_for_idle_cpu(&self, w: &Worker, gate: &mut worker::IdleGate, max_wait_ns: u64) {
        let naps = gate.wait(w, max_wait_ns);
        if naps > 0 {
            self.heap.lock().reclaim.busy_cpu_naps += naps;
        }
    }

    /// Set up at `dst` the shared state of a new allocator with no arena yet (`grow` installs
    /// the first), with one handle. `cache_id` and `cache_orders` (served, stacked) describe its
    /// per-thread caches (cache layer); `entries` its workers' threads. In place: built by
    /// value (12 KiB, the heap in it 6.6 KiB) and moved into its `Arc`, it took 36 KiB more of
    /// the stack of the thread that made the allocator (the main thread's, for the preload:
    /// resident for the process's life; `tests/thread_stack.rs`).
    ///
    /// # Safety
    /// `dst` is valid for writes of a `Shared` and aligned for it; whatever it held is
    /// overwritten without being dropped.
    pub(crate) unsafe fn init(dst: *mut Shared, config: Config, cache_id: u64, cache_orders: (u32, u32), entries: WorkerEntries) {
        let tunables = config.tunables.clamped(&config);
        let heap_init = |h: *mut Heap| {
            // SAFETY: `h` is the place of the lock's data, valid for writes and aligned
            // (`Locked::init_in`); every field of `Heap` is written (`write_every_field!`).
            unsafe {
                write_every_field!(h, Heap {
                    arenas: Vec::with_capacity(MAX_ARENAS),
                    counters: Counters::default(),
                    tunables: tunables,
                    reclaim: ReclaimCounters::default(),
                    inflight: [Inflight::default(); INFLIGHT],
                    isolation_waiters: 0,
                    trimming: false,
                    caches: CacheList { head: core::ptr::null_mut(), remote_drain: false },
                })
            }
        };
        // SAFETY: `dst` is valid for writes of a `Shared` (the caller's contract), so its
        // `heap` place is valid for a `Locked<Heap>`; `heap_init` writes every field of the
        // `Heap`.
        unsafe { Locked::init_in(&raw mut (*dst).heap, lock::SPIN_NS_LONG, heap_init) };
        // SAFETY: `dst` is valid for writes (the caller's contract); the place of a field.
        let views = unsafe { &raw mut (*dst).views };
        for i in 0..MAX_ARENAS {
            // SAFETY: `i < MAX_ARENAS`, within the array's place in `*dst`.
            unsafe { (views as *mut ArenaView).add(i).write(ArenaView::empty()) };
        }
        // SAFETY: as above; every other field is written here (`write_every_field!` names
        // `heap` and `views`, written above, after the `;`).
        unsafe {
            write_every_field!(dst, Shared {
                gap: HitGap::uninit(),
                hit: HitPath::new(cache_id, cache_orders.0, cache_orders.1),
                epoch_ns: os::now_ns(),
                reporter: Worker::new(b"fallow-report"),
                zeroer: Worker::new(b"fallow-zero"),
                handles: AtomicUsize::new(1),
                pidfd: AtomicI32::new(-1),
                pidfd_refused: AtomicBool::new(false),
                entries: entries,
                zero_requested: AtomicBool::new(false),
                large_cached: AtomicBool::new(false),
                large_generation: AtomicU64::new(0),
                squeezed: AtomicBool::new(false),
                pressure_injected: AtomicBool::new(false),
                slack_held: SlackHeld::default(),
                slack_blocks_min: os::online_cpus() as u64,
                caches_registered: AtomicU64::new(0),
                config: config;
                heap, views
            })
        }
    }
}

/// A live block as `alloc` placed it: where, how long, and the states its pages had.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Placed {
    pub arena: usize,
    pub taken: Taken,
    pub addr: usize,
    /// A `ZERO` request that memsets only the dirty pages the program wrote
    /// (`clears_written_only`); its memset is counted after it, by `Shared::prepare`.
    pub clear_written_only: bool,
}

/// Fewest pages of a `ZERO` request whose dirty pages are memset only where the program wrote
/// them (`os::for_each_clearing_run`, from `/proc/self/pagemap`): 32 MiB, glibc's largest mmap
/// threshold (`DEFAULT_MMAP_THRESHOLD_MAX`), from which glibc's `calloc` always maps fresh pages.
/// A page is `Dirty` once handed out and freed, written or not; a memset of one never written
/// (nothing behind it, or the shared zero page: an `np.zeros` whose result was only tested, a
/// sparse table) makes it resident and costs ~115 ms/GiB here for nothing. Reading the entries
/// costs 8 bytes a page; below this size a block's memset is short and its pages mostly written.
pub(crate) const CLEAR_WRITTEN_MIN_PAGES: u32 = 8192;

/// Whether a `ZERO` request of `npages` in arena `a` memsets only its written dirty pages:
/// large enough, and private anonymous memory (a memfd arena's pages are shared).
fn clears_written_only(a: &Buddy, npages: u32, zero: bool) -> bool {
    zero && npages >= CLEAR_WRITTEN_MIN_PAGES && a.fd < 0
}

impl Heap {
    pub(crate) fn arena(&self, ai: usize) -> &Buddy {
        &self.arenas[ai]
    }

    /// Take `npages` pages aligned to `align` pages (a power of two; `order` covers both) for a
    /// request that needs zeros or not. Without `fault_in`, only the placements that look for
    /// resident memory are tried (the caller has resident memory to give back first).
    fn take(&mut self, npages: u32, order: u8, align: u32, zero: bool, fault_in: bool) -> Option<Placed> {
        for ai in 0..self.arenas.len() {
            let a = &mut self.arenas[ai];
            let got = if order <= a.max_order {
                // Resident memory first: the best-fitting run of free blocks beside a resident
                // one (`buddy/span.rs`), else an aligned block (the smallest order that fits),
                // and only then memory the kernel must fault in. The pages a request prefers
                // (zeroed ones for ZERO) only break ties of fit: a ZERO request that took an
                // aligned zeroed block first split large blocks a best fit keeps whole (under
                // random 64 KiB-4 MiB `calloc`s in two threads, 10-15% more peak resident memory
                // than with the zeroing worker off; docs/design.md, "Placement").
                let (resident, reported) = (&resident_preference(zero), &[Class::Reported]);
                let size_order = npages.next_power_of_two().trailing_zeros() as u8;
                a.take_best_run(npages, size_order, align, resident, zero)
                    .or_else(|| a.take_aligned(npages, order, resident, zero))
                // Memory to fault in: a request below `BIG_ORDER` goes right after the arena's
                // used part (as glibc's top chunk: aligned blocks of reported memory left a gap
                // of reported pages beside each, which later runs faulted in), then any aligned
                // reported block.
                .or_else(|| if fault_in { a.take_top(npages, align, 1 << BIG_ORDER) } else { None })
                .or_else(|| if fault_in { a.take_aligned(npages, order, reported, zero) } else { None })
            } else {
                a.take_run(npages)
            };
            if let Some(t) = got {
                return Some(self.placed(ai, t, zero));
            }
        }
        None
    }

    /// The block `t` just taken off arena `ai`'s lists, live.
    fn placed(&mut self, ai: usize, t: Taken, zero: bool) -> Placed {
        let a = &mut self.arenas[ai];
        a.mark_live(t.pfn, t.npages, 0);
        a.mark_used(t.pfn + t.npages);
        let addr = a.addr(t.pfn);
        let clear_written_only = clears_written_only(a, t.npages, zero);
        self.account_taken(&t, zero, clear_written_only);
        Placed { arena: ai, taken: t, addr, clear_written_only }
    }

    fn account_taken(&mut self, t: &Taken, zero: bool, clear_written_only: bool) {
        let c = &mut self.counters;
        c.alloc_calls += 1;
        c.in_use_pages = c.in_use_pages.wrapping_add(t.npages as u64);
        c.live_blocks = c.live_blocks.wrapping_add(1);
        c.reused_reported_bytes += ((t.counts.reported + t.counts.lazy) as u64) << PAGE_SHIFT;
        if zero {
            let dirty = t.counts.needs_zeroing(t.npages) as u64;
            // Memset or found unwritten: counted once known (`Shared::prepare`).
            if !clear_written_only {
                c.zeroed_on_alloc_bytes += dirty << PAGE_SHIFT;
            }
            c.zero_skipped_bytes += (t.npages as u64 - dirty) << PAGE_SHIFT;
        } else {
            c.zeroed_wasted_bytes += (t.counts.zeroed as u64) << PAGE_SHIFT;
        }
        if t.counts.reported + t.counts.lazy > 0 {
            c.reported_blocks_reused += 1;
        }
    }

    pub(crate) fn arena_index(&self, addr: usize) -> Option<usize> {
        self.arenas.iter().position(|a| a.contains(addr))
    }

    /// Find the live block that starts at `addr`, or say precisely why there is none.
    pub(crate) fn live_block(&self, addr: usize) -> Result<(usize, u32, u32), Error> {
        let ai = self.arena_index(addr).ok_or(Error::InvalidPointer { addr })?;
        let a = &self.arenas[ai];
        let pfn = a.pfn(addr);
        let m = a.meta(pfn).get();
        let aligned = addr & (PAGE_SIZE - 1) == 0;
        match m.tag {
            Tag::Alloc if aligned => return Ok((ai, pfn, m.npages)),
            Tag::Alloc => return Err(Error::InteriorPointer { addr, block: a.addr(pfn) }),
            Tag::None => {}
            // The first page of a free, cached or isolated block.
            _ if aligned && m.flags & META_FREED_START != 0 => return Err(Error::DoubleFree { addr }),
            _ => return Err(Error::InvalidPointer { addr }),
        }
        // Not the first page of any block: the nearest first page below says whose page it is.
        // Records only, never the state bytes, which a live block's owner writes without the
        // lock. The walk ends at the nearest block, at most one block's length away.
        let mut q = pfn;
        while q > 0 {
            q -= 1;
            let mq = a.meta(q);
            let w = mq.word();
            match mq.tag() {
                Tag::None => continue,
                Tag::Alloc if q + w.npages() > pfn => return Err(Error::InteriorPointer { addr, block: a.addr(q) }),
                // The slack of a live block: its records may be stale, flags included.
                Tag::Alloc if w.flags() & META_SLACK != 0 && q + (1u32 << w.order()) > pfn => return Err(Error::InvalidPointer { addr }),
                _ => break,
            }
        }
        // A block that started here was freed, and merged into the free block below.
        if aligned && m.flags & META_FREED_START != 0 {
            return Err(Error::DoubleFree { addr });
        }
        Err(Error::InvalidPointer { addr })
    }
}
