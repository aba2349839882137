//! Background pre-zeroing: a thread that runs only while a CPU is idle zeroes dirty free memory a
//! chunk at a time, as much as `ZERO` requests are likely to ask for soon, so that those requests
//! skip the memset (seed 000, PG_zero). Also keeps the opt-in `populated_reserve` resident and
//! zeroed.
//!
//! State machine of the zeroing worker (`run`):
//!
//! ```text
//!   IDLE --free of a dirty block >= zero_order (or a piece >= PIECE_ORDER below it), once a
//!         ZERO request was made or with a populated reserve; the first ZERO request; a large
//!         block freed into a cache (futex wake)--> GATE
//!   GATE: no CPU idle -> NAP 10 ms .. 100 ms (doubling) -> GATE; else MEASURE
//!   an allocation waits for isolated memory -> NAP 1 ms (the block it waits for comes back whole)
//!   MEASURE: under the lock, fold the ZERO bytes requested since last time (served zeroed or
//!            memset; not those found unwritten) into the demand
//!            (an exponentially decayed sum, time constant DEMAND_TAU_S); target = demand +
//!            zeroed_reserve once any ZERO request was made, else 0 (and at least
//!            populated_reserve).
//!     zeroed free >= target        -> NAP 1 s if dirty blocks remain (demand may grow), else IDLE
//!     no dirty block, but frees since the last look that found none (a hot loop takes its
//!     block back at once)          -> NAP zero_delay instead of IDLE (see `run`)
//!     a dirty block free for >= zero_delay (and < report_delay while reporting is on)
//!                                  -> ISOLATE one chunk of it (the half holding dirty pages at
//!                                     each split), unlock, ZERO its Dirty/LazyFree pages that
//!                                     the program wrote with non-temporal stores, relock, RETURN
//!                                     them as Zeroed (the unwritten ones as Reported) -> GATE
//!     only dirty blocks younger than zero_delay -> NAP until the oldest is old enough -> GATE
//!     populated_reserve unmet and no dirty block -> ISOLATE a reported chunk, POPULATE it
//!                                     (MADV_POPULATE_WRITE), RETURN as Zeroed -> GATE
//!     nothing listed to zero, large blocks in threads' caches (`ask_caches`)
//!                                  -> ASK (a request generation), NAP zero_delay, then DRAIN
//!                                     the large blocks of caches whose threads freed none
//!                                     since (the reporter's handshake) -> GATE
//!     a large block freed into a cache since the last look -> NAP zero_delay instead of IDLE
//! ```
//!
//! Invariants:
//! - Only `Dirty` and `LazyFree` pages are written; `Reported` pages read zero already and are
//!   never faulted in (except for `populated_reserve`, which asks for exactly that), `Zeroed`
//!   pages are never zeroed twice: the state is per page and survives split and merge, so there
//!   is no double clearing (Alexander Duyck's objection).
//! - A block whose age passed `report_delay` is left alone while reporting is on: the reporter
//!   is about to give it back, and zeroing it would be wasted work (reviewers' objection). Only
//!   `populated_reserve` zeroes such blocks.
//! - The chunk being zeroed is isolated (`Tag::Isolated`, on no list): no allocation receives it
//!   and none waits for it while other resident memory is free. A request of a chunk or more
//!   that only non-resident memory could serve waits for it if it splits a block of the size
//!   asked for (`Shared::alloc_locked`), and while any request waits no new chunk is isolated
//!   (`Heap::isolation_waiters`). The lock is not held while zeroing.
//! - A block freed less than `zero_delay` ago is never touched: a program that reuses memory at
//!   once (free, then allocate again) keeps its block hot in its CPU cache, and neither waits for
//!   the worker nor pays for its memory traffic (docs/design.md, "Reuse-aware zeroing").
//! - While the memory limit is passed or there is memory pressure (`Shared::squeezed`, set by
//!   the reporter: limit.rs) nothing is zeroed or populated: the target is 0.
//! - The thread zeroes only while a CPU is idle (`worker::IdleGate`), and is scheduled so that
//!   it never holds up the process's exit.
//!
//! Unwritten pages. A page is `Dirty` once it was handed out and freed, whether or not the
//! program wrote it: a large `calloc` read and hardly written (`np.zeros(n).any()`) leaves pages
//! that map the kernel's shared zero page, or nothing at all, and a store into them makes them
//! resident. So in private anonymous arenas without huge-page units the worker first reads the
//! chunk's `/proc/self/pagemap` entries (`os::pagemap`, 8 bytes a page, the file opened for the
//! chunk and closed after it):
//! a page with nothing behind it reads zero as it is; a present page not mapped here alone (the
//! zero page, or a page shared with a `fork` child, which pagemap does not tell apart without
//! privileges) is read, and if it reads zero released with `MADV_DONTNEED`, which frees nothing
//! the process holds alone (reading the zero page over and over stays in the CPU's cache). Both
//! are returned `Reported` (not resident, reads zero: counted in `zeroing_unwritten_bytes`); the
//! other pages are zeroed with stores. Where the file cannot be read, every page is.

use core::sync::atomic::Ordering;
use std::sync::Arc;

use crate::config::Tunables;
use crate::cache::Scope;
use crate::heap::{Shared, ZERO_SLOT};
use crate::os::{self, PAGE_SHIFT};
use crate::page::{Class, PageState};

/// Time constant of the demand estimate: a burst of `ZERO` requests keeps memory zeroed for
/// about this long.
pub const DEMAND_TAU_S: f64 = 5.0;
/// Blocks examined per list per step.
const SCAN_LIMIT: u32 = 256;
const NAP_NS: u64 = 1_000_000_000;
/// How long to stay away when an allocation waits for isolated memory (its waits are 100 us).
const WAITERS_NAP_NS: u64 = 1_000_000;

pub(crate) extern "C" fn thread_main(arg: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: `Allocator::start` passed `Arc::into_raw` of a clone, owned by this thread from now on.
    let shared = unsafe { Arc::from_raw(arg as *const Shared) };
    // Counted as one of fallow's threads until it ends (worker/exit_watch.rs).
    let _own = crate::worker::exit_watch::OwnThread::worker(&shared.zeroer);
    let delay_ms = shared.heap.lock().tunables.zero_delay_ms;
    let Some(mut gate) = shared.zeroer.start_after_nap(delay_ms) else { return core::ptr::null_mut() };
    run(&shared, &mut gate);
    core::ptr::null_mut()
}

/// `e^-x` for `x >= 0` (0 past 708, where it is subnormal, and for NaN), without libm: calling its `exp`
/// loaded libm into every process under the preload, 300-500 KiB of it resident. As
/// `2^-(x log2 e)`: the integer part of the power an exponent, the rest by its series.
fn exp_neg(x: f64) -> f64 {
    let y = x * core::f64::consts::LOG2_E;
    if y.is_nan() || y >= 1022.0 {
        return 0.0;
    }
    let y = if y > 0.0 { y } else { 0.0 };
    let n = y as u64;
    // e^-t, t in [0, ln 2): 16 terms of the series leave an error under 1e-15.
    let t = (y - n as f64) * core::f64::consts::LN_2;
    let (mut term, mut sum) = (1.0f64, 1.0f64);
    for i in 1..=16 {
        term *= -t / i as f64;
        sum += term;
    }
    // 2^-n, a normal number for n < 1022 (its biased exponent 1023 - n).
    sum * f64::from_bits((1023 - n) << 52)
}

/// The rate of `ZERO` requests, as a decayed sum of their bytes.
struct Demand {
    last_total: u64,
    last_ns: u64,
    bytes: f64,
}

enum Next {
    Again,
    /// Sleep this many ns (blocks to age, or demand to grow), unless kicked.
    Nap(u64),
    Idle(u64),
}

fn run(s: &Shared, gate: &mut crate::worker::IdleGate) {
    // Every ZERO request since the allocator began counts once (the thread may start late: it
    // runs only on idle CPU time).
    let mut d = Demand { last_total: 0, last_ns: os::now_ns(), bytes: 0.0 };
    // The free count at the last look that found no dirty block.
    let mut last_idle_frees = None;
    // A drain request to the caches for their large blocks: (generation, when asked, ms).
    let mut asked = None;
    while !s.zeroer.stopping() {
        // Unbounded: zeroing ahead is worth only the idle time it uses.
        s.wait_for_idle_cpu(&s.zeroer, gate, u64::MAX);
        match zero_one_chunk(s, &mut d, &mut asked) {
            Next::Again => {}
            Next::Nap(ns) => s.zeroer.nap(ns),
            Next::Idle(seen_frees) => {
                // Zeroing on: the delay to nap; off, frees do not wake this thread (idle).
                let delay_ms = {
                    let t = s.heap.lock().tunables;
                    t.zeroing.then_some(t.zero_delay_ms.max(1))
                };
                let hot_loop = last_idle_frees.replace(seen_frees).is_some_and(|f| f != seen_frees);
                if let (true, Some(ms)) = (hot_loop, delay_ms) {
                    // Frees since the last look, yet no dirty block: the program frees and
                    // takes its block back at once (a hot loop). Woken by its next free, this
                    // thread would look again at every free, for nothing (a block must stay
                    // free `zero_delay` first) and at the cost of the lock the program takes.
                    // Look again after `zero_delay`, whatever the frees meanwhile.
                    s.zeroer.nap(ms as u64 * 1_000_000);
                } else {
                    // Work: a free on the lists, or (zeroing on) a large block freed into a cache.
                    let cached = |s: &Shared| delay_ms.is_some() && s.large_cached.load(Ordering::SeqCst);
                    s.zeroer.idle(crate::worker::Worker::IDLE_MAX_NS, || cached(s) || s.heap.lock().counters.free_calls != seen_frees);
                }
            }
        }
    }
}

fn zero_one_chunk(s: &Shared, d: &mut Demand, asked: &mut Option<(u64, u32)>) -> Next {
    let now_ms = s.now_ms();
    let now_ns = os::now_ns();
    let mut h = s.heap.lock();
    let t = h.tunables;
    let seen_frees = h.counters.free_calls;
    if !t.zeroing {
        return Next::Idle(seen_frees);
    }
    // An allocation waits for isolated memory: it wants its block back whole (no new chunk, and
    // no scan under the lock meanwhile).
    if h.isolation_waiters > 0 {
        return Next::Nap(WAITERS_NAP_NS);
    }
    // A large block freed into a cache since the last look: look again after `zero_delay`
    // rather than go idle, whose next such free would wake this thread (at most one wake per
    // delay, however hot the loop that frees them).
    let large_freed = s.large_cached.swap(false, Ordering::SeqCst);
    let idle = |seen| if large_freed { Next::Nap(t.zero_delay_ms.max(1) as u64 * 1_000_000) } else { Next::Idle(seen) };
    // MEASURE
    let c = h.counters;
    // Not `zero_unwritten_bytes`: those pages needed no memset that zeroed pages would save.
    let total = c.zero_skipped_bytes + c.zeroed_on_alloc_bytes;
    let dt = now_ns.saturating_sub(d.last_ns) as f64 / 1e9;
    d.bytes = d.bytes * exp_neg(dt / DEMAND_TAU_S) + total.saturating_sub(d.last_total) as f64;
    d.last_total = total;
    d.last_ns = now_ns;
    h.reclaim.zero_demand_bytes = d.bytes as u64;
    h.reclaim.zero_scans += 1;
    let populated_target = (t.populated_reserve >> PAGE_SHIFT) as u64;
    // A program that has never asked for zeroed memory gets none zeroed for it (only the opt-in
    // populated reserve): every byte zeroed would be wasted, and would cost it memory traffic.
    let wanted = if s.zero_requested.load(Ordering::Relaxed) {
        (d.bytes as u64 + t.zeroed_reserve as u64) >> PAGE_SHIFT
    } else {
        0
    };
    // While the memory limit is passed or there is memory pressure, nothing is zeroed or made
    // resident: the reporter is giving free memory back (limit.rs).
    let target = if s.squeezed.load(Ordering::Relaxed) { 0 } else { wanted.max(populated_target) };
    let (_, zeroed) = h.resident_free_pages();
    let dirty_left = h.has_dirty(t.zero_lowest());
    if zeroed >= target {
        // Nap (a free does not wake a napping worker) rather than go idle while dirty blocks
        // remain: idle, every free in a program's hot loop would wake it again.
        return if dirty_left { Next::Nap(NAP_NS) } else { idle(seen_frees) };
    }
    let for_population = zeroed < populated_target;
    let chunk_order = (t.zero_chunk >> PAGE_SHIFT).trailing_zeros() as u8;

    // Find a dirty block that has stayed free for at least `zero_delay` (the program did not
    // reuse it at once, so it is no longer hot in its CPU cache, and zeroing it takes nothing the
    // program is about to use) and, while reporting is on, for less than `report_delay` (older
    // blocks are the reporter's). Oldest first, from the list tails.
    let mut found = None;
    let mut wait_ms = u32::MAX;
    'find: for ai in 0..h.arenas.len() {
        let a = h.arena(ai);
        let report_lowest = t.report_lowest(a.huge_units);
        // The blocks of `zero_order` and up first, then the pieces below it (config::PIECE_ORDER).
        for order in Tunables::scan_orders(t.zero_lowest(), t.zero_order, a.max_order, false) {
            let mut walk = a.oldest_first(Class::Dirty, order);
            let mut scanned = 0;
            while let Some((p, m)) = walk.next(a).filter(|_| scanned < SCAN_LIMIT) {
                scanned += 1;
                let age = now_ms.saturating_sub(m.freed_at_ms);
                if age < t.zero_delay_ms {
                    wait_ms = wait_ms.min(t.zero_delay_ms - age);
                } else if !t.report || order < report_lowest || age < t.report_delay_ms || for_population {
                    found = Some((ai, p, order));
                    break 'find;
                }
            }
        }
    }
    let mut populate = false;
    if found.is_none() && for_population {
        // No dirty memory to zero: make reported memory resident and zero instead.
        'find2: for ai in 0..h.arenas.len() {
            let a = h.arena(ai);
            for order in t.zero_order.min(chunk_order)..=a.max_order {
                if let Some(p) = a.newest(Class::Reported, order) {
                    found = Some((ai, p, order));
                    populate = true;
                    break 'find2;
                }
            }
        }
    }
    let Some((ai, pfn, order)) = found else {
        let held = crate::cache::large_pages_held(&h);
        drop(h);
        if let Some(next) = ask_caches(s, asked, held, now_ms, t.zero_delay_ms) {
            return next;
        }
        return if wait_ms != u32::MAX {
            // Only blocks freed too recently: look again when the oldest of them is old enough.
            Next::Nap((wait_ms as u64 + 1) * 1_000_000)
        } else if dirty_left {
            Next::Nap(NAP_NS)
        } else {
            idle(seen_frees)
        };
    };

    // ISOLATE
    let rec = if order > chunk_order {
        h.isolate_dirty_piece(ZERO_SLOT, ai, pfn, chunk_order)
    } else {
        h.isolate(ZERO_SLOT, ai, pfn)
    };
    if populate {
        // Populated pages are touched: no longer never-used address space.
        h.arenas[ai].mark_used(rec.pfn + (1 << rec.order));
    }
    let a = h.arena(ai);
    let states = a.states();
    let base = a.addr(rec.pfn);
    // Pages of private anonymous memory that the program never wrote need no store (module
    // doc, "Unwritten pages"); a memfd's pages are shared, and a release in a huge page splits it.
    let check_unwritten = !populate && a.fd < 0 && !a.huge_units;
    drop(h);
    // Opened for this chunk and closed after it: no descriptor is held between chunks (a
    // program may count or close its descriptors), and none is kept across a `fork`.
    let pagemap = if check_unwritten { os::Pagemap::open() } else { None };

    // ZERO (or POPULATE), without the lock. The state bytes of an isolated block change only
    // under the lock when it is returned, so reading them here is safe.
    let t0 = os::now_ns();
    let mut zeroed_pages = 0u64;
    let mut populated_pages = 0u64;
    let mut unwritten = Unwritten::new();
    states.for_each_run(rec.pfn, 1 << rec.order, |start, n, st| {
        let addr = base + (((start - rec.pfn) as usize) << PAGE_SHIFT);
        let len = (n as usize) << PAGE_SHIFT;
        match st {
            PageState::Dirty | PageState::LazyFree => {
                // SAFETY: the run lies inside the block this worker isolated (on no list, handed to nobody)
                // until `unisolate` below, so no one else reads or writes it meanwhile.
                zeroed_pages += unsafe { zero_written(pagemap.as_ref(), addr, start, n, &mut unwritten) };
            }
            PageState::Reported if populate => {
                // SAFETY: as the zeroing above: a run of the block this worker isolated, mapped
                // read-write, which no one else touches until `unisolate`.
                unsafe { os::populate_write(addr, len) };
                populated_pages += n as u64;
            }
            _ => {}
        }
    });
    let ns = os::now_ns() - t0;

    // RETURN
    let mut h = s.heap.lock();
    h.unisolate_runs(ZERO_SLOT, unwritten.runs(), |st| match st {
        PageState::Dirty | PageState::LazyFree => PageState::Zeroed,
        PageState::Reported if populate => PageState::Zeroed,
        st => st,
    });
    h.reclaim.zeroed_background_bytes += zeroed_pages << PAGE_SHIFT;
    h.reclaim.zeroing_unwritten_bytes += unwritten.pages << PAGE_SHIFT;
    h.reclaim.populated_bytes += populated_pages << PAGE_SHIFT;
    h.reclaim.zeroing_ns += ns;
    Next::Again
}

/// Large blocks in threads' caches (cache/: 4 and 8 MiB, one of each per thread) are on no list:
/// a thread that frees one and then stays idle would keep it dirty, and a later `ZERO` request
/// would pay its memset. With zeroing to do and no listed block to zero, ask (bump
/// `Shared::large_generation`), wait `zero_delay`, then drain the large blocks of the caches whose
/// threads freed no large block meanwhile (`cache::drain_unanswered`, `Scope::Large`): their
/// blocks come back dated at the request, old enough to be zeroed at once. A thread that frees
/// large blocks notes the generation at each such free, so a hot loop is never drained. A request
/// older than two delays (the worker was away: no idle CPU, zeroing off, nothing to zero) is
/// made again rather than drained for, so that no block comes back dated past `report_delay`.
/// `None`: no large block cached, or none in an idle thread's cache.
fn ask_caches(s: &Shared, asked: &mut Option<(u64, u32)>, held: u64, now_ms: u32, delay_ms: u32) -> Option<Next> {
    if held == 0 {
        *asked = None;
        return None;
    }
    let ms = |ms: u32| (ms.max(1) as u64) * 1_000_000;
    match *asked {
        Some((_, at)) if now_ms.wrapping_sub(at) < delay_ms => Some(Next::Nap(ms(delay_ms - now_ms.wrapping_sub(at)))),
        Some((g, at)) if now_ms.wrapping_sub(at) <= 2 * delay_ms.max(1) => match crate::cache::drain_unanswered(s, Scope::Large, g, at) {
            // The reporter's drain is under way: look again after a delay, with this request.
            None => Some(Next::Nap(ms(delay_ms))),
            Some(0) => {
                *asked = None;
                None
            }
            Some(_) => {
                *asked = None;
                Some(Next::Again)
            }
        },
        _ => {
            let g = s.large_generation.fetch_add(1, Ordering::Relaxed) + 1;
            *asked = Some((g, now_ms));
            Some(Next::Nap(ms(delay_ms)))
        }
    }
}

/// Runs of a chunk's pages found unwritten (`zero_written`): `(pfn, pages)`, in order, at most
/// `MAX_UNWRITTEN_RUNS`; their pages become `Reported` when the chunk is returned.
struct Unwritten {
    runs: [(u32, u32); MAX_UNWRITTEN_RUNS],
    len: usize,
    pages: u64,
}

/// Most runs of unwritten pages noted per chunk: beyond them, pages are zeroed with stores.
const MAX_UNWRITTEN_RUNS: usize = 32;

impl Unwritten {
    fn new() -> Self {
        Unwritten { runs: [(0, 0); MAX_UNWRITTEN_RUNS], len: 0, pages: 0 }
    }

    fn runs(&self) -> &[(u32, u32)] {
        &self.runs[..self.len]
    }

    /// Whether `note` can take a run that does not join the last one.
    fn has_room(&self) -> bool {
        self.len < MAX_UNWRITTEN_RUNS
    }

    /// Note `n` pages from `pfn`, joined to the last run if they follow it; false if full.
    fn note(&mut self, pfn: u32, n: u32) -> bool {
        match self.runs[..self.len].last_mut() {
            Some(last) if last.0 + last.1 == pfn => last.1 += n,
            _ if self.len == MAX_UNWRITTEN_RUNS => return false,
            _ => {
                self.runs[self.len] = (pfn, n);
                self.len += 1;
            }
        }
        self.pages += n as u64;
        true
    }
}

/// Zero the written pages of the `n` free pages from `pfn` at `addr`, as `pagemap` tells them
/// (`os::for_each_clearing_run`): a page with nothing behind it is noted in `unwritten` as it is;
/// a page that maps the shared zero page (or a zero page shared with a `fork` child) is released
/// (`MADV_DONTNEED`, which frees nothing this process holds alone) and noted; either then reads
/// zero without being resident. Anything else, everything without `pm`, and everything once
/// `unwritten` is full, is zeroed with stores. Returns the pages zeroed with stores.
///
/// # Safety
/// The pages are part of a block this worker isolated (on no list, handed to nobody), in a
/// private anonymous mapping when `pm` is given, and no one else reads or writes them until it
/// is returned.
unsafe fn zero_written(pm: Option<&os::Pagemap>, addr: usize, pfn: u32, n: u32, unwritten: &mut Unwritten) -> u64 {
    let mut stored = 0u64;
    let at = |p: usize| pfn + ((p - addr) >> PAGE_SHIFT) as u32;
    let clear = |p: usize, pages: usize, c: os::Clearing| {
        let noted = match c {
            os::Clearing::Store => false,
            os::Clearing::Absent => unwritten.note(at(p), pages as u32),
            os::Clearing::SharedZero => {
                unwritten.has_room()
                    // SAFETY: the caller's contract: pages of the isolated block, in a private
                    // anonymous mapping, whose contents nobody relies on.
                    && unsafe { os::madvise(p, pages << PAGE_SHIFT, os::Advice::DontNeed) }.is_ok()
                    && unwritten.note(at(p), pages as u32)
            }
        };
        if !noted {
            // SAFETY: as above: pages of the isolated block that no one else touches.
            unsafe { crate::nt::zero(p, pages << PAGE_SHIFT) };
            stored += pages as u64;
        }
    };
    // SAFETY: the caller's contract: the worker's isolated pages, mapped, which nobody writes
    // meanwhile.
    unsafe { os::for_each_clearing_run(pm, addr, n as usize, clear) };
    stored
}

#[cfg(test)]
mod exp_tests {
    use super::exp_neg;

    #[test]
    fn exp_neg_matches_exp() {
        let mut x = 0.0f64;
        while x < 700.0 {
            let (got, want) = (exp_neg(x), (-x).exp());
            assert!((got - want).abs() <= want * 1e-13, "e^-{x}: {got} against {want}");
            x = x * 1.01 + 1e-3;
        }
        assert_eq!(exp_neg(0.0), 1.0);
        for x in [1e6, f64::INFINITY, f64::NAN] {
            assert_eq!(exp_neg(x), 0.0);
        }
        assert_eq!(exp_neg(-0.0), 1.0);
    }
}
