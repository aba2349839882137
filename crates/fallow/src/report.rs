//! Free page reporting: one background thread per allocator gives free memory that has stayed
//! idle back to the kernel, in batches (seed 001, page hinting, and its mainline successor
//! `mm/page_reporting.c`; for a process the "host" is the kernel and the report is `madvise`).
//!
//! State machine of the reporter (`run`):
//!
//! ```text
//!            free of a block >= the lowest order while IDLE (futex wake)
//!   IDLE ---------------------------------------------------------> SCAN
//!    ^                                                               |
//!    | nothing unreported >= the lowest order                        | under the lock: walk the
//!    | (or only blocks the floors protect)                           | lists, report_order up,
//!    |                                                               | then the pieces down to
//!    |                                                               | PIECE_ORDER (the lowest),
//!    +----------------------------- SCAN <-------------------+       | oldest first (tails)
//!                                    |  \  only young blocks  |       |
//!                                    |   +--> WAIT (nap until  |       |
//!                                    |        the oldest is    |       |
//!                                    |        report_delay old)+       |
//!                                    v                                 |
//!   isolate <= report_batch blocks (Tag::Isolated, off every list), unlock,
//!   REPORT them (one process_madvise, or one madvise / fallocate per block), relock,
//!   RETURN them as Reported (or LazyFree for MADV_FREE), merging as usual -> SCAN
//!   (after PASS_BUDGET batches in a row, a short nap so one pass never hogs the lock)
//!
//!   SQUEEZED (the memory limit passed, or memory pressure: limit.rs): SCAN also takes blocks
//!   younger than report_delay (past the limit, not hot ones, freed within zero_delay; under
//!   pressure, idle ones, free for min(report_delay / 10, 200 ms)), largest order first,
//!   zeroed before dirty, the floors ignored, until the limit's excess is back (under pressure,
//!   every idle block); no wait for an idle CPU; WAIT naps in limit::PERIOD_NS steps, each
//!   looking at the limit and the PSI stall
//! ```
//!
//! Invariants:
//! - A block is reported only when it has been free for at least `report_delay` (`freed_at_ms`
//!   is the age clock; a merge takes the younger age), a dirty block of 32 MiB or more
//!   (`BIG_ORDER`) for a tenth of it, and only if its order is >= `report_order` (or, for the
//!   pieces below it down to `PIECE_ORDER`, after the whole delay, never in huge-page-unit
//!   arenas; scanned after the blocks of `report_order` and up): memory freed and
//!   reused within the delay stays resident. Big blocks go sooner because glibc gives back every
//!   block of that size at its `free`: a program that freed one and did not take it back within
//!   200 ms (numpy's large temporaries, a phase's buffers) would otherwise hold it for two
//!   seconds where glibc holds nothing; a loop on such a block takes it back within
//!   milliseconds. All dirty blocks go after a twentieth of it while the free dirty memory is
//!   piled up past `pile_bound` (64 MiB, or the memory in use if more), until it is back under
//!   it: seed 001 reports once enough has piled up, and glibc trims its heap's top at the free
//!   past its trim threshold. Free memory under what is in use is the program's own working
//!   room (malloc-large's holes between 20 live buffers, 100-200 MiB, filled again and again):
//!   reported early, it was faulted back in (docs/measurements.md). Zeroed blocks keep the
//!   full delay: the zeroing worker made them for a demand.
//! - WAIT, and the naps while the caches are asked to drain, last at most a tenth of the delay
//!   (`sooner_ms`): a free wakes only an IDLE reporter, and the memory these rules send
//!   back sooner comes from frees during such a nap (a whole delay, before: a pile of 200 MiB
//!   under malloc-large's churn stayed, and a 32 MiB block freed then waited the whole delay).
//! - The lock is never held across a system call. While a block is isolated it is on no list
//!   and tagged `Isolated`: no allocation can take it, no free can merge with it, and an
//!   allocation that finds other memory free never waits for the report.
//! - Reported blocks go to the `Reported` lists, the last class any request looks at.
//! - Page states after the report: `MADV_DONTNEED` (if the start-up check found that it really
//!   zeroes) and hole punching give `Reported` (reads zero); `MADV_FREE`, or `MADV_DONTNEED`
//!   that failed the check, give `LazyFree` (never treated as zeroed). Pages already `Reported`
//!   stay so. A block the kernel refused goes back unchanged.
//! - `resident_free_min` resident free bytes and `populated_reserve` zeroed free bytes are never
//!   reported, but while squeezed (the memory is wanted now).
//! - The limit never fails an allocation: it only makes the reporter hurry.
//! - With THP arenas `report_order >= 9` (validated): only whole, aligned 2 MiB blocks are
//!   reported, so reporting never splits a huge page.

use core::sync::atomic::Ordering;
use std::sync::Arc;

use crate::config::{ReportMode, Tunables, BIG_ORDER};
use crate::heap::Shared;
use crate::stats::ReclaimCounters;
use crate::limit::{Watch, PERIOD_NS};
use crate::worker::Worker;
use crate::os::{self, PAGE_SHIFT};
use crate::page::{Class, PageState};

/// Batches in a row before the reporter pauses (`BUDGET_PAUSE_NS`).
const PASS_BUDGET: u32 = 16;
const BUDGET_PAUSE_NS: u64 = 2_000_000;
/// Under memory pressure a block goes back early once free this long (or a tenth of the delay,
/// if less).
const PRESSURE_IDLE_MS: u32 = 200;
/// Free dirty memory a process keeps for its reuse before the reporter hurries (`pile_bound`):
/// 64 MiB, the most glibc leaves at the top of a heap before trimming it (`M_TRIM_THRESHOLD`
/// with its dynamic thresholds, twice the largest mmap threshold).
const PILE_MIN_PAGES: u64 = (64 << 20) >> PAGE_SHIFT;

/// The free dirty pages beyond which dirty blocks go back after a twentieth of the delay: 64 MiB, or
/// the pages in use if more (a program's own reuse scales with what it holds: a program of many
/// large live buffers replaced at random keeps holes of free memory as large as half of what it
/// holds, which it fills again and again).
fn pile_bound(in_use_pages: u64) -> u64 {
    PILE_MIN_PAGES.max(in_use_pages)
}

/// How long a big dirty block waits: a tenth of the delay, at least the hot time (`zero_delay`)
/// (a pile's blocks wait half of it: `report_one_batch`). Also the longest nap of the reporter
/// while blocks wait for their delay or the caches for a drain: a free wakes only an idle
/// reporter, so a big block freed during a nap of the whole delay, or a pile grown past its
/// bound meanwhile, would otherwise wait for the whole delay too.
fn sooner_ms(t: &crate::config::Tunables) -> u32 {
    (t.report_delay_ms / 10).max(t.zero_delay_ms.min(t.report_delay_ms))
}

/// Blocks examined per (class, order) list per batch: bounds the time under the lock.
const SCAN_LIMIT: u32 = 256;

pub(crate) extern "C" fn thread_main(arg: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: `Allocator::start` passed `Arc::into_raw` of a clone, owned by this thread from now on.
    let shared = unsafe { Arc::from_raw(arg as *const Shared) };
    // Counted as one of fallow's threads until it ends (worker/exit_watch.rs).
    let _own = crate::worker::exit_watch::OwnThread::worker(&shared.reporter);
    let delay_ms = shared.heap.lock().tunables.report_delay_ms;
    let Some(mut gate) = shared.reporter.start_after_nap(delay_ms) else { return core::ptr::null_mut() };
    os::dontneed_zeroes();
    run(&shared, &mut gate);
    core::ptr::null_mut()
}

enum Next {
    /// Report another batch at once.
    Again,
    /// Young blocks only: sleep this many ns, until the oldest is old enough.
    Wait(u64),
    /// Nothing to report: sleep until a free makes work (the free count seen is given, so that
    /// a free between the scan and the sleep is not missed); whether the limit or pressure asks
    /// for memory back (then idle caches are drained sooner).
    Idle(u64, bool),
}

fn run(s: &Shared, gate: &mut crate::worker::IdleGate) {
    let mut budget = PASS_BUDGET;
    // A drain request to the per-thread caches awaiting answers: (generation, when asked, ms).
    let mut asked: Option<(u64, u32)> = None;
    let mut watch = Watch::new();
    // At once, before any wait for an idle CPU: the limit and the signal are known from the
    // start (and the PSI file is chosen at the thread's start, not at some later step).
    watch.refresh(s);
    while !s.reporter.stopping() {
        // Once per pass (PASS_BUDGET batches), and bounded: on a machine that is never idle,
        // memory still goes back, a pass at most a second after its delay (a batch costs system
        // calls, not the program's memory bandwidth).
        // (Not while the limit is passed or there is pressure: memory is wanted now; and watched
        // while a limit or a signal is, so that one passed meanwhile ends the wait.)
        if budget == PASS_BUDGET && !s.squeezed.load(Ordering::Relaxed) {
            watch.wait_for_idle_cpu(s, gate, 1_000_000_000);
        }
        // The limit and the pressure signal, resolved again when the settings changed; what
        // they say is read at its own low rate (limit.rs). After the wait for an idle CPU, whose
        // nap may have taken the kick of `set_tunables`.
        watch.refresh(s);
        watch.sample(s);
        match report_one_batch(s, &mut watch) {
            Next::Again => {
                budget -= 1;
                if budget == 0 {
                    budget = PASS_BUDGET;
                    s.reporter.nap(BUDGET_PAUSE_NS);
                }
            }
            Next::Wait(ns) => {
                budget = PASS_BUDGET;
                watch.nap(s, ns);
            }
            Next::Idle(seen_frees, urgent) => {
                budget = PASS_BUDGET;
                if let Some(timeout_ns) = caches_step(s, &mut asked, urgent, &mut watch) {
                    s.reporter.idle(timeout_ns, || s.heap.lock().counters.free_calls != seen_frees);
                }
            }
        }
    }
}

/// Nothing on the lists to report: memory in per-thread caches is invisible to the scan. Ask the
/// caches to drain (each does at its next free or refill; cache/), give them the reporting delay to
/// answer, then drain those whose threads stayed idle (`cache::drain_unanswered`). Their blocks
/// come back to the lists dated at the request (they were idle since at least then), so they are
/// reported at once. `None`: keep going (a nap was taken, or blocks came back); `Some(ns)`:
/// nothing to do, go idle for at most `ns`. A free into a per-thread cache wakes nobody (the hit
/// path stays free of that), so with caches on the reporter looks again after the delay (at
/// least 1 s) for memory they hold. While the limit is passed or there is pressure (`urgent`),
/// the caches get `limit::PERIOD_NS` to answer instead of the delay. Its naps are watched
/// (`Watch::nap`): a limit passed or a pressure event meanwhile ends them; each is at most
/// `sooner_ms`, after which the lists are scanned again (the request stands).
fn caches_step(s: &Shared, asked: &mut Option<(u64, u32)>, urgent: bool, watch: &mut Watch) -> Option<u64> {
    let (report, mut delay_ms, look_ms, held) = {
        let h = s.heap.lock();
        (h.tunables.report, h.tunables.report_delay_ms, sooner_ms(&h.tunables), crate::cache::pages_held(&h))
    };
    if urgent {
        delay_ms = delay_ms.min((PERIOD_NS / 1_000_000) as u32);
    }
    let idle_ns = if s.hit.cache_orders > 0 && report {
        delay_ms.max(1000) as u64 * 1_000_000
    } else {
        Worker::IDLE_MAX_NS
    };
    if !report {
        *asked = None;
        return Some(idle_ns);
    }
    let now = s.now_ms();
    match *asked {
        None if held > 0 => {
            let g = crate::cache::ask_to_drain(s, &s.heap.lock());
            *asked = Some((g, now));
            watch.nap(s, delay_ms.min(look_ms) as u64 * 1_000_000);
            None
        }
        None => Some(idle_ns),
        Some((_, at)) if now.wrapping_sub(at) < delay_ms => {
            watch.nap(s, (delay_ms - now.wrapping_sub(at)).min(look_ms) as u64 * 1_000_000);
            None
        }
        Some((g, at)) => match crate::cache::drain_unanswered(s, crate::cache::Scope::All, g, at) {
            // The zeroing worker's drain is under way: look again in a moment, same request.
            None => {
                watch.nap(s, PERIOD_NS);
                None
            }
            Some(pages) => {
                *asked = None;
                (pages == 0).then_some(idle_ns)
            }
        },
    }
}

/// A block of the batch, as the system call needs it.
#[derive(Clone, Copy, Default)]
pub(crate) struct Target {
    addr: usize,
    len: usize,
    fd: i32,
    offset: usize,
}

impl Target {
    /// The free block of `order` at `pfn` of the arena `a`.
    pub(crate) fn of(a: &crate::buddy::Buddy, pfn: u32, order: u8) -> Target {
        let addr = a.addr(pfn);
        Target { addr, len: (1usize << order) << PAGE_SHIFT, fd: a.fd, offset: addr - a.base }
    }
}

/// One SCAN -> REPORT -> RETURN round. Normally: blocks free for `report_delay`, smallest
/// order first, dirty before zeroed, the floors kept. While the limit is passed or there is
/// pressure (`Squeeze`): also younger blocks (but not hot ones, freed within `zero_delay`), the
/// largest order first and zeroed before dirty (the zeroed reserve goes first), the floors
/// ignored, until the limit's excess is given back (under pressure, everything idle).
fn report_one_batch(s: &Shared, watch: &mut Watch) -> Next {
    let now = s.now_ms();
    let mut h = s.heap.lock();
    let t = h.tunables;
    let seen_frees = h.counters.free_calls;
    if !t.report {
        // Nothing is watched with reporting off: let the zeroing worker go on.
        s.squeezed.store(false, core::sync::atomic::Ordering::Relaxed);
        return Next::Idle(seen_frees, false);
    }
    // A run freed last and left alone merges now (buddy/deferred.rs), so that its block goes
    // back whole; one the program keeps taking back within `zero_delay` stays as it is.
    let left_since = now.saturating_sub(t.zero_delay_ms.min(t.report_delay_ms));
    // One still too young to merge: look again when it is old enough (idle, the reporter would
    // not look again before the next free, or its idle timeout).
    let mut merge_wait_ms = u32::MAX;
    for a in &mut h.arenas {
        if let Some(ms) = a.merge_deferred_idle(left_since) {
            merge_wait_ms = merge_wait_ms.min(ms + 1);
        }
    }
    let sq = watch.squeeze(s, &mut h);
    let mut excess = sq.excess_pages;
    let mode = t.effective_mode(s.config.backing);
    let (mut resident, mut zeroed) = h.resident_free_pages();
    let floor = (t.resident_free_min >> PAGE_SHIFT) as u64;
    let keep_zeroed = (t.populated_reserve >> PAGE_SHIFT) as u64;
    // How long a block must have been free to go back early: past the limit, only hot blocks
    // (freed within zero_delay, the program reusing them) wait; under pressure a block must be
    // idle, free for a tenth of the delay, at most PRESSURE_IDLE_MS (a block the program takes
    // again every few tens of ms would only be faulted back in, freeing nothing on average).
    let hot_ms = t.zero_delay_ms.min(t.report_delay_ms);
    let idle_ms = (t.report_delay_ms / 10).min(PRESSURE_IDLE_MS).max(hot_ms);
    // A dirty block of BIG_ORDER or more is due after a tenth of the delay, and dirty blocks
    // while dirty memory is piled up past `pile_bound` after a twentieth (module doc).
    let big_ms = sooner_ms(&t);
    let pile_ms = (t.report_delay_ms / 20).max(hot_ms);
    let in_use = (h.counters.in_use_pages as i64).max(0) as u64;
    let mut pile = resident.saturating_sub(zeroed).saturating_sub(pile_bound(in_use));
    let batch = t.report_batch as usize;
    let mut targets = [Target::default(); crate::config::MAX_REPORT_BATCH as usize];
    // Whether each block goes back before the delay (or past a floor) because of the squeeze.
    let mut early = [false; crate::config::MAX_REPORT_BATCH as usize];
    let mut n = 0usize;
    let mut wait_ms = merge_wait_ms;
    let classes = if sq.urgent() { [Class::Zeroed, Class::Dirty] } else { [Class::Dirty, Class::Zeroed] };
    'scan: for ai in 0..h.arenas.len() {
        let (max_order, huge_units) = (h.arena(ai).max_order, h.arena(ai).huge_units);
        let orders = Tunables::scan_orders(t.report_lowest(huge_units), t.report_order, max_order, sq.urgent());
        for order in orders {
            let piece = order < t.report_order;
            let size = 1u64 << order;
            for class in classes {
                let mut walk = h.arena(ai).oldest_first(class, order);
                let mut scanned = 0;
                while let Some((p, m)) = walk.next(h.arena(ai)).filter(|_| scanned < SCAN_LIMIT) {
                    scanned += 1;
                    let a = h.arena(ai);
                    let age = now.saturating_sub(m.freed_at_ms);
                    let need = sq.pressure || excess > 0;
                    let min_age = if excess > 0 { hot_ms } else { idle_ms };
                    let delay = match class {
                        // Pieces wait the whole delay: the early rules are for blocks whole.
                        _ if piece => t.report_delay_ms,
                        Class::Dirty if pile > 0 => pile_ms,
                        Class::Dirty if order >= BIG_ORDER => big_ms,
                        _ => t.report_delay_ms,
                    };
                    let due = age >= delay;
                    if !due && (!need || age < min_age) {
                        let until = if need { min_age.min(delay) - age } else { delay - age };
                        // At most `big_ms`: what no free announces (a big block, a pile) is
                        // seen within a tenth of the delay.
                        wait_ms = wait_ms.min(until).min(big_ms);
                        continue;
                    }
                    let res = size - (m.counts.reported + m.counts.lazy) as u64;
                    let z = m.counts.zeroed as u64;
                    let protected = resident < floor + res || zeroed < keep_zeroed + z;
                    if protected && !need {
                        // Kept by a floor, which a limit passed or pressure would lift: while
                        // either is watched, look again after the watch's period (a wait, which
                        // is watched) rather than go idle, unwatched, until the next free.
                        if watch.watching() {
                            wait_ms = wait_ms.min((watch.period_ns() / 1_000_000) as u32);
                        }
                        continue;
                    }
                    let target = Target::of(a, p, order);
                    resident = resident.saturating_sub(res);
                    zeroed = zeroed.saturating_sub(z);
                    if class == Class::Dirty {
                        pile = pile.saturating_sub(res);
                    }
                    if need {
                        excess = excess.saturating_sub(res);
                    }
                    h.isolate(n, ai, p);
                    targets[n] = target;
                    early[n] = !due || protected;
                    n += 1;
                    if n == batch {
                        break 'scan;
                    }
                }
            }
        }
    }
    if n == 0 {
        drop(h);
        return if wait_ms != u32::MAX {
            Next::Wait(wait_ms as u64 * 1_000_000 + 1_000_000)
        } else {
            Next::Idle(seen_frees, sq.urgent())
        };
    }
    drop(h);
    let bytes = send(s, mode, 0, &targets[..n], &early[..n], |r, early_bytes| {
        // Bytes that went back before their time are the limit's when it was passed, else the
        // pressure's.
        if sq.excess_pages > 0 {
            r.limit_reported_bytes += early_bytes;
        } else {
            r.pressure_reported_bytes += early_bytes;
        }
    });
    watch.reported(bytes);
    Next::Again
}

/// REPORT the blocks isolated in the in-flight slots `base..base + targets.len()` (slot
/// `base + i` holds `targets[i]`), without the lock, then RETURN them under it: `Reported`
/// (or `LazyFree` for `MADV_FREE`), merging as usual; a block the kernel refused goes back
/// unchanged. Counts the batch in the reclaim counters, and hands `file_early` the bytes of the
/// blocks that went back before their time (`early[i]`), under the same hold of the lock.
/// Returns the bytes given back that were resident.
pub(crate) fn send(
    s: &Shared,
    mode: ReportMode,
    base: usize,
    targets: &[Target],
    early: &[bool],
    file_early: impl FnOnce(&mut ReclaimCounters, u64),
) -> u64 {
    let n = targets.len();
    let mut ok = [false; crate::config::MAX_REPORT_BATCH as usize];
    let t0 = os::now_ns();
    // SAFETY: every target is a block its caller isolated (`Tag::Isolated`, on no list, in an
    // in-flight slot): no allocation, cache or other worker touches it until `unisolate` below.
    let calls = unsafe {
        match mode {
            ReportMode::Punch => punch(targets, &mut ok[..n]),
            ReportMode::Free => advise(s, targets, os::Advice::Free, &mut ok[..n]),
            _ => advise(s, targets, os::Advice::DontNeed, &mut ok[..n]),
        }
    };
    let ns = os::now_ns() - t0;
    let reads_zero = match mode {
        ReportMode::Punch => true,
        ReportMode::Free => false,
        _ => os::dontneed_zeroes(),
    };

    let mut h = s.heap.lock();
    let (mut bytes, mut early_bytes) = (0u64, 0u64);
    let mut zeroed_lost = 0u64;
    let mut failures = 0u64;
    for (i, &done) in ok[..n].iter().enumerate() {
        let slot = base + i;
        if !done {
            h.unisolate(slot, |st| st);
            failures += 1;
            continue;
        }
        let pages = 1u64 << h.inflight[slot].order;
        let before = h.unisolate(slot, |st| match st {
            PageState::Reported => PageState::Reported,
            _ if reads_zero => PageState::Reported,
            _ => PageState::LazyFree,
        });
        let b = (pages - (before.reported + before.lazy) as u64) << PAGE_SHIFT;
        bytes += b;
        if early[i] {
            early_bytes += b;
        }
        zeroed_lost += (before.zeroed as u64) << PAGE_SHIFT;
    }
    let r = &mut h.reclaim;
    r.reported_bytes += bytes;
    r.zeroed_then_reported_bytes += zeroed_lost;
    r.report_calls += calls;
    r.report_batches += 1;
    r.report_ns += ns;
    r.report_failures += failures;
    file_early(r, early_bytes);
    bytes
}

/// The pidfd of this process for `process_madvise`, or -1 when it cannot be used.
fn pidfd(s: &Shared) -> i32 {
    if s.pidfd_refused.load(Ordering::Relaxed) {
        return -1;
    }
    let fd = s.pidfd.load(Ordering::Relaxed);
    if fd != -1 {
        return fd.max(-1);
    }
    match os::pidfd_self() {
        Ok(fd) => {
            if s.pidfd.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                // SAFETY: the pidfd opened just above, which lost the race and was published nowhere.
                unsafe { os::close(fd) };
            }
            s.pidfd.load(Ordering::Relaxed).max(-1)
        }
        Err(_) => {
            s.pidfd.store(-2, Ordering::Relaxed);
            -1
        }
    }
}

/// `madvise` the batch: one `process_madvise` on this process where the kernel accepts the
/// advice (Linux 6.13 and later accept every advice on oneself), else one `madvise` per block.
/// Returns the system calls made; `ok[i]` says whether block `i` was advised.
///
/// # Safety
/// Every target is a block this worker isolated (on no list, handed to nobody) until it is
/// returned: `advice` may replace its contents with zeros.
unsafe fn advise(s: &Shared, targets: &[Target], advice: os::Advice, ok: &mut [bool]) -> u64 {
    let mut calls = 0;
    let fd = if targets.len() > 1 { pidfd(s) } else { -1 };
    if fd >= 0 {
        let mut iov = [libc::iovec { iov_base: core::ptr::null_mut(), iov_len: 0 }; crate::config::MAX_REPORT_BATCH as usize];
        for (v, t) in iov.iter_mut().zip(targets) {
            *v = libc::iovec { iov_base: t.addr as *mut libc::c_void, iov_len: t.len };
        }
        // The kernel advises at most MAX_RW_COUNT (2 GiB - 4 KiB) per call: go on from where
        // it stopped, the partly advised iovec trimmed.
        let (mut first, mut n) = (0usize, targets.len());
        while first < n {
            calls += 1;
            // SAFETY: the iovecs name the targets (or their unadvised tails), isolated blocks nobody
            // else uses (this function's contract).
            match unsafe { os::process_madvise(fd, &iov[first..n], advice) } {
                Ok(0) => break,
                Ok(mut done) => {
                    while first < n && done >= iov[first].iov_len {
                        done -= iov[first].iov_len;
                        ok[first] = true;
                        first += 1;
                    }
                    if first < n && done > 0 {
                        iov[first].iov_base = (iov[first].iov_base as usize + done) as *mut libc::c_void;
                        iov[first].iov_len -= done;
                    }
                }
                Err(e) if calls == 1 && (e == libc::EINVAL || e == libc::ENOSYS || e == libc::EPERM || e == libc::EBADF) => {
                    // This kernel does not take this advice through process_madvise: stop trying.
                    // The descriptor stays open (a trim in another thread may be using it) until
                    // `close_worker_descriptors`.
                    s.pidfd_refused.store(true, Ordering::Relaxed);
                    n = 0;
                }
                Err(_) => n = 0,
            }
        }
        // A block left partly advised is advised again whole below (harmless: done pages cost
        // nothing the second time).
    }
    for (i, t) in targets.iter().enumerate() {
        if !ok[i] {
            calls += 1;
            // SAFETY: an isolated block nobody else uses (this function's contract).
            ok[i] = unsafe { os::madvise(t.addr, t.len, advice) }.is_ok();
        }
    }
    calls
}

/// Punch the batch's holes in the memfd, one `fallocate` per block.
///
/// # Safety
/// As `advise`: every target is an isolated block of the arena whose memfd is `fd`; its pages
/// read zero afterwards.
unsafe fn punch(targets: &[Target], ok: &mut [bool]) -> u64 {
    for (i, t) in targets.iter().enumerate() {
        // SAFETY: the arena's own memfd, and the part of it behind an isolated block nobody else
        // uses (this function's contract).
        ok[i] = t.fd >= 0 && unsafe { os::punch_hole(t.fd, t.offset, t.len) }.is_ok();
    }
    targets.len() as u64
}
