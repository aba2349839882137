//! Background pre-zeroing (issue 4): idle dirty memory becomes Zeroed (state and contents) and
//! serves ZERO without a memset; concurrency with the worker in tight loops; zeroing off zeroes
//! nothing; populated_reserve. No timing is asserted: waits are bounded polls for liveness.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::wait_for;
use std::time::{Duration, Instant};

use common::os;
use fallow::{Allocator, Config, Flags, PageState, Tunables};

const PAGE: usize = 4096;

/// 16 MiB blocks on 4 KiB pages (no huge pages: these tests count resident and reported pages one
/// by one, below a huge page too).
/// Caches up to 2 MiB: the 3-8 MiB blocks these tests free go to the lists, where the worker
/// sees them.
fn config(t: Tunables) -> Config {
    Config { arena_size: 256 << 20, max_order: 12, thp: false, cache_max_order: 9, tunables: t, ..Config::default() }
}

fn zeroing(reserve: usize) -> Tunables {
    Tunables { report: false, zeroing: true, zeroed_reserve: reserve, ..Tunables::default() }
}

/// A `ZERO` request, so that the allocator has seen demand for zeroed memory (without any, the
/// worker zeroes nothing but the populated reserve).
fn ask_for_zeroed_memory(a: &Allocator) {
    let z = a.alloc(PAGE, PAGE, Flags::ZERO).unwrap();
    a.free(z.as_ptr()).unwrap();
}

/// Whether the `len` bytes at `p` all equal `byte`.
///
/// # Safety
/// `p` is valid for reads of `len` bytes (a live block, or free arena memory of an allocator that
/// is alive), and no thread writes them during the call.
unsafe fn all_bytes(p: *const u8, len: usize, byte: u8) -> bool {
    // SAFETY: the caller guarantees that `[p, p + len)` is readable and not written meanwhile.
    unsafe { std::slice::from_raw_parts(p, len) }.iter().all(|&b| b == byte)
}

/// Bytes of `[lo, lo + len)` whose recorded free state is `state`.
fn bytes_in_state(a: &Allocator, lo: usize, len: usize, state: PageState) -> usize {
    a.free_runs()
        .iter()
        .filter(|r| r.2 == state)
        .map(|&(s, l, _)| (s + l).min(lo + len).saturating_sub(s.max(lo)))
        .sum()
}

#[test]
fn idle_dirty_memory_becomes_zeroed_and_zero_allocs_skip_the_memset() {
    let a = Allocator::new(config(zeroing(64 << 20))).unwrap();
    assert!(a.workers_running().1);
    ask_for_zeroed_memory(&a);
    let len = 32 << 20;
    let p = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `p` is a live block of `len` bytes from `alloc` above, not yet freed.
    unsafe { core::ptr::write_bytes(p, 0xcd, len) };
    a.free(p).unwrap();
    wait_for("32 MiB zeroed", || bytes_in_state(&a, p as usize, len, PageState::Zeroed) == len);
    a.check_invariants().unwrap();
    // The contents, read straight from the (free) arena memory.
    // SAFETY: `[p, p + len)` is free memory of `a`'s arena, mapped while `a` lives; no thread allocates
    // from `a` meanwhile, and the zeroing worker writes only blocks it has isolated (these are
    // listed Zeroed, so not isolated; reporting is off).
    assert!(unsafe { all_bytes(p, len, 0) }, "pages marked zeroed are not zero");
    let s = a.stats();
    assert!(s.zeroed_background_bytes >= len as u64);
    assert_eq!(os::resident_pages(p as usize, len).unwrap() * PAGE, len, "zeroing dropped pages");

    let before = a.stats().zeroed_on_alloc_bytes;
    let q = a.alloc(len, PAGE, Flags::ZERO).unwrap().as_ptr();
    assert_eq!(q, p, "the zeroed block was not the one chosen");
    // SAFETY: `q` is a live block of `len` bytes from `alloc` above, used by this thread only.
    assert!(unsafe { all_bytes(q, len, 0) });
    assert_eq!(a.stats().zeroed_on_alloc_bytes, before, "pre-zeroed memory was memset again");
    a.free(q).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn demand_drives_the_amount_zeroed() {
    // No reserve: only ZERO requests make the worker zero.
    let a = Allocator::new(config(zeroing(0))).unwrap();
    let len = 32 << 20;
    let p = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `p` is a live block of `len` bytes from `alloc` above, not yet freed.
    unsafe { core::ptr::write_bytes(p, 1, len) };
    a.free(p).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(a.stats().zeroed_background_bytes, 0, "zeroed without any demand");
    // Demand: 16 MiB of ZERO requests.
    let z = a.alloc(16 << 20, PAGE, Flags::ZERO).unwrap().as_ptr();
    a.free(z).unwrap();
    wait_for("demand-driven zeroing", || a.stats().zeroed_background_bytes > 0);
    assert!(a.stats().zero_demand_bytes > 0);
    a.check_invariants().unwrap();
}

/// Allocate `len` bytes, write them with `byte`, free them, and wait until the zeroing worker has
/// looked at the lists `scans` more times (it runs only on idle CPU), so that a test asserting
/// that nothing was zeroed cannot pass before the worker had its chance. The block's address.
fn free_a_written_block_and_let_the_worker_scan(a: &Allocator, len: usize, byte: u8, scans: u64) -> *mut u8 {
    let p = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `p` is a live block of `len` bytes.
    unsafe { core::ptr::write_bytes(p, byte, len) };
    let before = a.stats().zero_scans;
    a.free(p).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    wait_for("the worker to scan after the free", || a.stats().zero_scans >= before + scans);
    p
}

#[test]
fn without_any_zero_request_nothing_is_zeroed() {
    // The default reserve, but the program only ever asks for plain memory.
    let t = Tunables { zero_delay_ms: 0, ..zeroing(Tunables::default().zeroed_reserve) };
    let a = Allocator::new(config(t)).unwrap();
    // Two scans: the one the free wakes, and one after the nap (1 s) that found nothing wanted.
    free_a_written_block_and_let_the_worker_scan(&a, 32 << 20, 1, 2);
    assert_eq!(a.stats().zeroed_background_bytes, 0, "zeroed for a program that never asked for zeros");
    // The first ZERO request switches the reserve on.
    ask_for_zeroed_memory(&a);
    wait_for("zeroing after a ZERO request", || a.stats().zeroed_background_bytes > 0);
    a.check_invariants().unwrap();
}

#[test]
fn a_block_freed_less_than_zero_delay_ago_is_left_alone() {
    // A delay far longer than the test: the freed block must stay dirty (and keep its contents)
    // however long the worker has had to look at it.
    let t = Tunables { zero_delay_ms: 600_000, ..zeroing(64 << 20) };
    let a = Allocator::new(config(t)).unwrap();
    ask_for_zeroed_memory(&a);
    let len = 8 << 20;
    // One scan: the free wakes the worker, which then naps until the block would be old enough.
    let p = free_a_written_block_and_let_the_worker_scan(&a, len, 0x5a, 1);
    assert_eq!(a.stats().zeroed_background_bytes, 0, "the worker zeroed a block freed within zero_delay");
    assert_eq!(bytes_in_state(&a, p as usize, len, PageState::Dirty), len);
    // SAFETY: `[p, p + len)` is a free block of `a`'s arena, mapped while `a` lives; no thread allocates
    // from `a`, and the worker leaves a block younger than `zero_delay` (ten minutes) alone.
    assert!(unsafe { all_bytes(p, len, 0x5a) }, "the young block's contents were touched");
    // With no delay, the same block is zeroed.
    a.set_tunables(Tunables { zero_delay_ms: 0, ..a.tunables() }).unwrap();
    wait_for("zeroing once the delay is gone", || bytes_in_state(&a, p as usize, len, PageState::Zeroed) == len);
    // SAFETY: `[p, p + len)` is free memory of `a`'s arena, now listed Zeroed: no thread allocates from
    // `a`, and the worker writes only dirty blocks it has isolated (reporting is off).
    assert!(unsafe { all_bytes(p, len, 0) });
    a.check_invariants().unwrap();
}

#[test]
fn a_hot_loop_does_not_wake_the_worker_at_every_free() {
    // Blocks above the caches' orders, freed and taken back at once on the locked path: none
    // stays free `zero_delay`, so the worker has nothing to do, and must not look at every free
    // (each look takes the lock the loop needs). It looks at most about once per `zero_delay`.
    let a = Allocator::new(config(zeroing(64 << 20))).unwrap();
    ask_for_zeroed_memory(&a);
    let delay_ms = a.tunables().zero_delay_ms as u64;
    let before = a.stats().zero_scans;
    let t0 = Instant::now();
    let mut pairs = 0;
    // Long enough for many looks at every free (a loop bound, not a timing asserted).
    while t0.elapsed() < Duration::from_millis(300) {
        let len = (3 << 20) + (pairs % 7) * PAGE;
        let p = a.alloc(len, PAGE, Flags::NONE).unwrap();
        // Written whole, as a program would: the block is live most of the time.
        // SAFETY: `p` is a live block of `len` bytes, this thread's alone.
        unsafe { p.as_ptr().write_bytes(1, len) };
        a.free(p.as_ptr()).unwrap();
        pairs += 1;
    }
    let elapsed_ms = t0.elapsed().as_millis() as u64;
    let scans = a.stats().zero_scans - before;
    let bound = 5 + 2 * elapsed_ms / delay_ms;
    assert!(scans <= bound, "{scans} looks in {elapsed_ms} ms of {pairs} pairs (at most {bound}: one per {delay_ms} ms)");
    a.check_invariants().unwrap();
}

/// Of two blocks as good fits, a dirty block the program has just freed (hot) and one the worker
/// zeroed earlier (cold), which a `ZERO` request takes: (the hot one, the cold one).
fn zero_request_takes(len: usize) -> (bool, bool) {
    let t = Tunables { zero_delay_ms: 0, zero_order: 0, ..zeroing(256 << 20) };
    // Caches off: a 1 MiB block freed into this thread's cache would be on no list, invisible to
    // the worker.
    let a = Allocator::new(Config { arena_size: 512 << 20, max_order: 16, tunables: t, cache: false, ..Config::default() })
        .unwrap();
    ask_for_zeroed_memory(&a);
    let hot = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
    let cold = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `cold` is a live block of `len` bytes.
    unsafe { core::ptr::write_bytes(cold, 0x11, len) };
    a.free(cold).unwrap();
    wait_for("the cold block zeroed", || bytes_in_state(&a, cold as usize, len, PageState::Zeroed) == len);
    // From now on the worker leaves every block alone: the hot one stays dirty.
    a.set_tunables(Tunables { zero_delay_ms: 600_000, ..a.tunables() }).unwrap();
    // SAFETY: `hot` is a live block of `len` bytes.
    unsafe { core::ptr::write_bytes(hot, 0x22, len) };
    a.free(hot).unwrap();
    let q = a.alloc(len, PAGE, Flags::ZERO).unwrap().as_ptr();
    // SAFETY: `q` is a live block of `len` bytes from `alloc` above, used by this thread only.
    assert!(unsafe { all_bytes(q, len, 0) }, "a ZERO block is not zero");
    a.free(q).unwrap();
    a.check_invariants().unwrap();
    (q == hot, q == cold)
}

/// Zeroed pages break ties of fit: between two blocks as good, a `ZERO` request takes the zeroed
/// one (no memset), at every size (a rule that took the hot block first for requests that fit
/// in the CPU cache took it whatever the fit; see docs/design.md, "Reuse-aware zeroing").
#[test]
fn a_zero_request_takes_the_zeroed_one_of_two_blocks_as_good() {
    for len in [1 << 20, 32 << 20] {
        assert_eq!(zero_request_takes(len), (false, true), "a ZERO request of {len} bytes did not take the zeroed block");
    }
}

#[test]
fn zeroing_off_zeroes_nothing() {
    let t = Tunables { zeroing: false, ..zeroing(64 << 20) };
    let a = Allocator::new(config(t)).unwrap();
    assert!(!a.workers_running().1);
    let len = 32 << 20;
    for _ in 0..3 {
        let p = a.alloc(len, PAGE, Flags::ZERO).unwrap().as_ptr();
        // SAFETY: `p` is a live block of `len` bytes from `alloc` above, not yet freed.
        unsafe { core::ptr::write_bytes(p, 0xee, len) };
        a.free(p).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1500));
    let s = a.stats();
    assert_eq!(s.zeroed_background_bytes, 0);
    assert_eq!(s.free_zeroed_pages, 0);
    assert!(a.free_runs().iter().all(|r| r.2 != PageState::Zeroed));
    a.check_invariants().unwrap();
}

#[test]
fn concurrent_allocs_while_zeroing_and_reporting_in_tight_loops() {
    let t = Tunables {
        report: true,
        // Short enough for the reporter to run all the time, long enough for blocks to be
        // young (zeroable) for a moment.
        report_delay_ms: 30,
        report_order: 3,
        report_batch: 4,
        zeroing: true,
        zero_order: 0,
        zero_chunk: 64 << 10,
        zero_delay_ms: 0,
        zeroed_reserve: 200 << 20,
        ..Tunables::default()
    };
    let a = Allocator::new(config(t)).unwrap();
    let threads: Vec<_> = (0..4u64)
        .map(|id| {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut seed = 0x2545f4914f6cdd1du64 ^ (id << 32);
                let mut live: Vec<(usize, usize, u64)> = Vec::new();
                let t0 = Instant::now();
                for i in 0.. {
                    if i >= 3000 && i % 64 == 0 {
                        // Run until the workers have run beside us (they get idle time only).
                        let s = a.stats();
                        if (s.zeroed_background_bytes > 0 && s.report_batches > 0) || t0.elapsed() > Duration::from_secs(180) {
                            break;
                        }
                        // The workers step only while a CPU is idle: leave one idle now and then.
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let len = (1 + (seed % 64) as usize) * PAGE;
                    let zero = seed & 0x200 != 0;
                    let p = a.alloc(len, PAGE, if zero { Flags::ZERO } else { Flags::NONE }).unwrap().as_ptr() as usize;
                    // SAFETY: `p` is a live block of `len` bytes (a multiple of 8, page-aligned) just allocated, which
                    // only this thread uses; no other reference to it exists.
                    let words = unsafe { std::slice::from_raw_parts_mut(p as *mut u64, len / 8) };
                    if zero {
                        assert!(words.iter().all(|&w| w == 0), "ZERO block not zero");
                    }
                    let pat = (id << 56) | ((i as u64) << 8);
                    for (k, w) in words.iter_mut().enumerate() {
                        *w = pat ^ k as u64;
                    }
                    live.push((p, len, pat));
                    if i % 16 == 0 {
                        // Leave idle time: the workers run only while a CPU is idle.
                        std::thread::sleep(Duration::from_micros(300));
                    }
                    if live.len() > 6 || seed & 3 == 0 {
                        let (q, l, pat) = live.swap_remove((seed as usize >> 11) % live.len());
                        // SAFETY: `q` came from `live`: a block of `l` bytes (page-aligned) this thread allocated and has not
                        // freed, with no other reference to it.
                        let words = unsafe { std::slice::from_raw_parts(q as *const u64, l / 8) };
                        for (k, w) in words.iter().enumerate() {
                            assert_eq!(*w, pat ^ k as u64, "allocated block overwritten at word {k}");
                        }
                        a.free(q as *mut u8).unwrap();
                    }
                }
                for (q, l, pat) in live {
                    // SAFETY: as above: a live block of `l` bytes this thread holds, page-aligned.
                    let words = unsafe { std::slice::from_raw_parts(q as *const u64, l / 8) };
                    assert!(words.iter().enumerate().all(|(k, w)| *w == pat ^ k as u64));
                    a.free(q as *mut u8).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    a.check_invariants().unwrap();
    let s = a.stats();
    assert!(s.zeroed_background_bytes > 0, "the zeroing worker never ran");
}

#[test]
fn populated_reserve_is_kept_resident_and_zeroed() {
    let reserve = 16 << 20;
    let t = Tunables {
        report: true,
        report_delay_ms: 0,
        zeroing: true,
        zeroed_reserve: 0,
        populated_reserve: reserve,
        ..Tunables::default()
    };
    let a = Allocator::new(config(t)).unwrap();
    wait_for("populated reserve", || a.stats().free_zeroed_pages as usize * PAGE >= reserve);
    // It stays: the reporter must not take it back.
    std::thread::sleep(Duration::from_millis(300));
    assert!(a.stats().free_zeroed_pages as usize * PAGE >= reserve);
    let before = a.stats().zeroed_on_alloc_bytes;
    let p = a.alloc(reserve, PAGE, Flags::ZERO | Flags::POPULATE).unwrap().as_ptr();
    assert_eq!(os::resident_pages(p as usize, reserve).unwrap() * PAGE, reserve);
    // SAFETY: `p` is a live block of `reserve` bytes from `alloc` above, used by this thread only.
    assert!(unsafe { all_bytes(p, reserve, 0) });
    assert_eq!(a.stats().zeroed_on_alloc_bytes, before);
    a.free(p).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn fork_child_takes_back_blocks_in_flight() {
    let t = Tunables { zero_order: 0, zero_chunk: 64 << 10, zero_delay_ms: 0, ..zeroing(256 << 20) };
    let a = Allocator::new(config(t)).unwrap();
    ask_for_zeroed_memory(&a);
    let len = 128 << 20;
    for round in 0..40 {
        // Keep the worker busy: dirty memory to zero.
        let p = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
        // SAFETY: `p` is a live block of `len` bytes from `alloc` above, not yet freed.
        unsafe { core::ptr::write_bytes(p, round as u8 | 1, len) };
        a.free(p).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        a.before_fork();
        // SAFETY: `a.before_fork()` was called just above, so that the child (one thread) can take `a` over
        // with `after_fork_child`; it uses nothing else and leaves by `_exit`.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: the child of the `fork` just after `before_fork`, with one thread.
            unsafe { a.after_fork_child() };
            let s = a.stats();
            let ok = s.isolated_pages == 0
                && a.check_invariants().is_ok()
                // SAFETY: in the child, with one thread and no worker running, `a`'s free runs are mapped memory
                // that no one writes.
                && a.free_runs().iter().all(|&(addr, l, st)| st != PageState::Zeroed || unsafe { all_bytes(addr as *const u8, l, 0) });
            // SAFETY: leaves the child at once, without running the parent's test harness.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        // SAFETY: this thread called `before_fork` just before the `fork`.
        unsafe { a.after_fork_parent() };
        let mut status = 0;
        // SAFETY: `pid` is the child forked above, not yet waited for; `status` is writable.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child {round} failed: {status}");
    }
    // Whether a given fork caught a chunk in flight varies; the child's checks hold either way.
    a.check_invariants().unwrap();
}

#[test]
fn frees_before_any_zero_request_do_not_wake_the_worker() {
    // Nothing would be zeroed for a program that never asked for zeroed memory: its frees leave
    // the worker asleep after its first look. The first ZERO request wakes it.
    let a = Allocator::new(config(zeroing(64 << 20))).unwrap();
    wait_for("the worker's first look", || a.stats().zero_scans >= 1);
    let looks = a.stats().zero_scans;
    for _ in 0..20 {
        // 8 MiB, above the caches' orders here: each free lists a dirty block.
        let p = a.alloc(8 << 20, PAGE, Flags::NONE).unwrap().as_ptr();
        // SAFETY: `p` is a live block of 8 MiB, this thread's alone.
        unsafe { p.write_bytes(1, 8 << 20) };
        a.free(p).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(a.stats().zero_scans, looks, "a free woke the worker before any ZERO request");
    ask_for_zeroed_memory(&a);
    wait_for("a look after the first ZERO request", || a.stats().zero_scans > looks);
}

/// Allocate a block of `len` bytes, write its first half, read its third quarter (the shared zero
/// page), leave its last quarter untouched, and free it; its address.
fn free_a_half_written_block(a: &Allocator, len: usize) -> *mut u8 {
    let p = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `p` is a live block of `len` bytes from `alloc` above, this thread's alone until the
    // free below.
    unsafe {
        core::ptr::write_bytes(p, 0xcd, len / 2);
        assert!(all_bytes(p.add(len / 2), len / 4, 0));
    }
    a.free(p).unwrap();
    p
}

/// A `ZERO` request of 32 MiB or more memsets only the dirty pages the program wrote: those it
/// only read (the shared zero page) or never touched read zero already, and a memset would make
/// them resident. A smaller one memsets every dirty page. Workers off: nothing zeroes or reports
/// in between.
#[test]
fn a_large_zero_request_memsets_only_the_written_pages_and_a_smaller_one_all() {
    let off = Tunables { report: false, zeroing: false, ..Tunables::default() };
    let a = Allocator::new(Config { max_order: 14, tunables: off, ..config(off) }).unwrap();
    let pagemap = std::fs::File::open("/proc/self/pagemap").is_ok();
    for (len, written_only) in [(32usize << 20, pagemap), (16 << 20, false)] {
        let p = free_a_half_written_block(&a, len);
        let (half, quarter) = (len / 2, len / 4);
        let before = a.stats();
        let q = a.alloc(len, PAGE, Flags::ZERO).unwrap().as_ptr();
        assert_eq!(q, p, "{len}: the dirty block was not reused");
        let s = a.stats();
        let (memset, unwritten) =
            (s.zeroed_on_alloc_bytes - before.zeroed_on_alloc_bytes, s.zero_unwritten_bytes - before.zero_unwritten_bytes);
        let untouched = os::resident_pages(q as usize + half + quarter, quarter).unwrap() * PAGE;
        if written_only {
            assert_eq!((memset, unwritten), (half as u64, half as u64), "{s}");
            assert_eq!(untouched, 0, "{len}: the untouched pages were made resident");
        } else {
            assert_eq!((memset, unwritten), (len as u64, 0), "{s}");
            assert_eq!(untouched, quarter, "{len}: the memset block lost pages");
        }
        // SAFETY: `q` is a live block of `len` bytes from `alloc` above, used by this thread only.
        assert!(unsafe { all_bytes(q, len, 0) }, "{len}: a ZERO block is not zero");
        a.free(q).unwrap();
        a.check_invariants().unwrap();
    }
}

/// The worker zeroes only the pages the program wrote: a page it only read (the kernel's shared
/// zero page) or never touched reads zero already, and is listed `Reported` (not resident)
/// instead of being made resident by a store.
#[test]
fn the_worker_zeroes_written_pages_and_lists_unwritten_ones_reported() {
    let a = Allocator::new(config(zeroing(64 << 20))).unwrap();
    ask_for_zeroed_memory(&a);
    let len = 8 << 20;
    let p = free_a_half_written_block(&a, len);
    let half = len / 2;
    let settled = || bytes_in_state(&a, p as usize, len, PageState::Dirty) == 0;
    wait_for("the freed block zeroed or listed reported", settled);
    a.check_invariants().unwrap();
    if std::fs::File::open("/proc/self/pagemap").is_err() {
        // No pagemap to read here: every page was zeroed with stores.
        assert_eq!(bytes_in_state(&a, p as usize, len, PageState::Zeroed), len);
        return;
    }
    assert_eq!(bytes_in_state(&a, p as usize, half, PageState::Zeroed), half, "written pages not zeroed");
    let rest = p as usize + half;
    assert_eq!(bytes_in_state(&a, rest, half, PageState::Reported), half, "unwritten pages not listed reported");
    assert_eq!(os::resident_pages(rest, half).unwrap(), 0, "unwritten pages made resident");
    assert!(a.stats().zeroing_unwritten_bytes >= half as u64);
    let q = a.alloc(len, PAGE, Flags::ZERO).unwrap().as_ptr();
    // SAFETY: `q` is a live block of `len` bytes from `alloc` above, used by this thread only.
    assert!(unsafe { all_bytes(q, len, 0) }, "a ZERO block is not zero");
    a.free(q).unwrap();
    a.check_invariants().unwrap();
}

/// Pages shared with a `fork` child are not this process's alone, as the zero page is not: a
/// large `ZERO` request reads them before leaving one without a memset, so written pages shared
/// with a living child are still memset.
#[test]
fn a_large_zero_request_memsets_written_pages_shared_with_a_fork_child() {
    let off = Tunables { report: false, zeroing: false, ..Tunables::default() };
    let a = Allocator::new(Config { max_order: 14, tunables: off, ..config(off) }).unwrap();
    let len = 32 << 20;
    let p = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `p` is a live block of `len` bytes from `alloc` above, this thread's alone.
    unsafe { core::ptr::write_bytes(p, 0xab, len) };
    a.free(p).unwrap();
    // SAFETY: the child only sleeps (async-signal-safe) and leaves by `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: as above: the child of the fork, which touches nothing.
        unsafe {
            libc::sleep(5);
            libc::_exit(0)
        }
    }
    let q = a.alloc(len, PAGE, Flags::ZERO).unwrap().as_ptr();
    // SAFETY: `q` is a live block of `len` bytes from `alloc` above, used by this thread only.
    let zero = unsafe { all_bytes(q, len, 0) };
    // SAFETY: `pid` is the child forked above, not yet waited for.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, core::ptr::null_mut(), 0);
    }
    assert!(zero, "a ZERO block over pages shared with a child is not zero");
    a.free(q).unwrap();
}

/// Where a `ZERO` request of `len` bytes goes when a zeroed block at least four times its size
/// (and of at least 32 MiB: taken aligned, so listed whole once freed, not as the pieces of a
/// block placed at the arena's used part) and a dirty block of its size are free: (the dirty
/// block's address, the request's, whether the zeroed block is still zeroed and free whole
/// afterwards). `len` above
/// the caches' largest order takes the locked path; at or below it, a refill of the cache
/// (one block a refill, so that the request gets the block the refill chose).
fn zero_request_between_a_dirty_fit_and_a_larger_zeroed_block(len: usize) -> (usize, usize, bool) {
    let big = (4 * len).max(32 << 20);
    let t = Tunables { zero_delay_ms: 0, zero_order: 0, ..zeroing(big) };
    let a = Allocator::new(Config {
        arena_size: 512 << 20,
        max_order: 14,
        thp: false,
        cache_max_order: 9,
        cache_batch_pages: 1,
        tunables: t,
        ..Config::default()
    })
    .unwrap();
    // Demand for zeroed memory, its page kept live: freed and drained below, it would merge with
    // the zeroed block and make it dirty.
    let demand = a.alloc(PAGE, PAGE, Flags::ZERO).unwrap().as_ptr();
    // Live neighbours above the caches' orders (taken on the locked path, never cached) keep the
    // dirty block from merging with anything.
    let zeroed = a.alloc(big, PAGE, Flags::NONE).unwrap().as_ptr();
    let before = a.alloc(3 << 20, PAGE, Flags::NONE).unwrap().as_ptr();
    let dirty = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
    let after = a.alloc(3 << 20, PAGE, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `zeroed` is a live block of `big` bytes.
    unsafe { core::ptr::write_bytes(zeroed, 0x11, big) };
    a.free(zeroed).unwrap();
    wait_for("the large block zeroed", || bytes_in_state(&a, zeroed as usize, big, PageState::Zeroed) == big);
    // From now on the worker leaves every block alone: the dirty one stays dirty.
    a.set_tunables(Tunables { zero_delay_ms: 600_000, ..a.tunables() }).unwrap();
    // SAFETY: `dirty` is a live block of `len` bytes.
    unsafe { core::ptr::write_bytes(dirty, 0x22, len) };
    a.free(dirty).unwrap();
    // Freed into this thread's cache when cached: back to the lists, where a refill looks.
    a.drain_thread_cache();
    assert_eq!(bytes_in_state(&a, dirty as usize, len, PageState::Dirty), len);
    let q = a.alloc(len, PAGE, Flags::ZERO).unwrap().as_ptr();
    // SAFETY: `q` is a live block of `len` bytes from `alloc` above, used by this thread only.
    assert!(unsafe { all_bytes(q, len, 0) }, "a ZERO block is not zero");
    let whole = bytes_in_state(&a, zeroed as usize, big, PageState::Zeroed) == big;
    for p in [q, before, after, demand] {
        a.free(p).unwrap();
    }
    a.check_invariants().unwrap();
    (dirty as usize, q as usize, whole)
}

/// Best fit before the pages a request prefers: a `ZERO` request takes the free block of its
/// size, dirty (a memset), rather than split a larger zeroed one, whose rest would be left where
/// a larger request needed the block whole.
#[test]
fn a_zero_request_above_the_caches_takes_a_dirty_fit_before_splitting_a_zeroed_block() {
    let (dirty, q, whole) = zero_request_between_a_dirty_fit_and_a_larger_zeroed_block(16 << 20);
    assert_eq!(q, dirty, "the 16 MiB ZERO request did not take the free 16 MiB block");
    assert!(whole, "the 64 MiB zeroed block was split");
}

#[test]
fn a_cache_refill_for_a_zero_request_takes_a_dirty_fit_before_splitting_a_zeroed_block() {
    let (dirty, q, whole) = zero_request_between_a_dirty_fit_and_a_larger_zeroed_block(1 << 20);
    assert_eq!(q, dirty, "the 1 MiB ZERO request did not take the free 1 MiB block");
    assert!(whole, "the 32 MiB zeroed block was split");
}

/// Below the groups' order a refill takes an aligned block of the request's order (no check of
/// how resident it is): the smallest order that fits among the resident classes, not a zeroed
/// block of any order first.
#[test]
fn a_small_refill_for_a_zero_request_takes_a_dirty_fit_before_splitting_a_zeroed_block() {
    let (dirty, q, whole) = zero_request_between_a_dirty_fit_and_a_larger_zeroed_block(64 << 10);
    assert_eq!(q, dirty, "the 64 KiB ZERO request did not take the free 64 KiB block");
    assert!(whole, "the 32 MiB zeroed block was split");
}
