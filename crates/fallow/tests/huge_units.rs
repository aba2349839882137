//! Huge-page units (`buddy/units.rs`): in an arena on transparent huge pages (the default), a
//! 2 MiB unit holds `Reported` pages only if it is wholly free and reported, since the kernel
//! backs a whole unit at the first touch of any page of it. A block cut from a reported unit, a
//! 2 MiB block handed out with slack, and the tail of a run of several units leave the rest of
//! their unit `Zeroed` (reading zero, counted resident); on 4 KiB pages the same requests leave
//! it `Reported`. `check_free_states` then checks, with the memory touched, that every reported
//! run is not resident and every zeroed run reads zero.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::check_free_states;
use fallow::{Allocator, Config, Flags, PageState, Tunables};

const PAGE: usize = 4096;
const UNIT: usize = 2 << 20;

fn allocator(thp: bool) -> Allocator {
    // Workers off: the states are the takes' alone. Caches off: a request takes its own block.
    Allocator::new(Config { arena_size: 64 << 20, thp, cache: false, tunables: Tunables::off(), ..Config::default() })
        .unwrap()
}

/// The states of the free pages of the unit at `unit`, by runs: `(start, len, state)`.
fn unit_runs(a: &Allocator, unit: usize) -> Vec<(usize, usize, PageState)> {
    let mut runs: Vec<_> = a
        .free_runs()
        .into_iter()
        .filter(|&(s, l, _)| s < unit + UNIT && s + l > unit)
        .map(|(s, l, st)| (s.max(unit), (s + l).min(unit + UNIT) - s.max(unit), st))
        .collect();
    runs.sort_by_key(|r| r.0);
    runs
}

/// Write every page of `[p, p + len)` (the kernel backs the unit) and check the free states.
fn touch_and_check(a: &Allocator, p: *mut u8, len: usize) {
    // SAFETY: `p` is a live block of at least `len` bytes of `a`, this thread's alone.
    unsafe { core::ptr::write_bytes(p, 7, len) };
    a.check_invariants().unwrap();
    // SAFETY: `a` is used by this thread only.
    unsafe { check_free_states(a) }.unwrap();
}

#[test]
fn a_block_cut_from_a_reported_unit_leaves_the_unit_zeroed() {
    for thp in [true, false] {
        let a = allocator(thp);
        let p = a.alloc(300 << 10, PAGE, Flags::NONE).unwrap().as_ptr();
        let unit = p as usize & !(UNIT - 1);
        let want = if thp { PageState::Zeroed } else { PageState::Reported };
        let runs = unit_runs(&a, unit);
        let free: usize = runs.iter().map(|r| r.1).sum();
        assert_eq!(free, UNIT - (300 << 10), "thp {thp}: {runs:?}");
        assert!(runs.iter().all(|r| r.2 == want), "thp {thp}: {runs:?}");
        touch_and_check(&a, p, 300 << 10);
        // A zeroed request from the rest of the unit skips the memset.
        let before = a.stats();
        let z = a.alloc(256 << 10, PAGE, Flags::ZERO).unwrap().as_ptr();
        assert_eq!(z as usize & !(UNIT - 1), unit, "thp {thp}");
        let s = a.stats();
        assert_eq!(s.zeroed_on_alloc_bytes, before.zeroed_on_alloc_bytes, "thp {thp}: {s}");
        touch_and_check(&a, z, 256 << 10);
        a.free(z).unwrap();
        a.free(p).unwrap();
    }
}

#[test]
fn a_unit_with_slack_and_the_tail_of_a_run_leave_no_reported_page_beside_live_ones() {
    // Caches up to 2 MiB: a 3 MiB request takes a run on the locked path; up to 8 MiB (the
    // default): a cached 4 MiB block with 1 MiB of slack.
    for cache_max_order in [9, 11] {
        let cfg = Config { arena_size: 64 << 20, cache_max_order, thp: true, tunables: Tunables::off(), ..Config::default() };
        let a = Allocator::new(cfg).unwrap();
        // 1.5 MiB: a cached 2 MiB block with 128 pages of slack.
        let p = a.alloc(3 << 19, PAGE, Flags::NONE).unwrap().as_ptr();
        touch_and_check(&a, p, 3 << 19);
        // 3 MiB: a 4 MiB block whose last 1 MiB, beside the live part of its second unit, is
        // free (the tail of a run) or slack.
        let q = a.alloc(3 << 20, PAGE, Flags::NONE).unwrap().as_ptr();
        let tail_unit = (q as usize + (3 << 20)) & !(UNIT - 1);
        let runs = unit_runs(&a, tail_unit);
        if cache_max_order == 9 {
            assert!(!runs.is_empty() && runs.iter().all(|r| r.2 == PageState::Zeroed), "{runs:?}");
        } else {
            assert!(runs.is_empty(), "slack is on no list: {runs:?}");
        }
        touch_and_check(&a, q, 3 << 20);
        a.free(q).unwrap();
        // Freed into the cache, the block comes back whole: its slack kept the states it was
        // given, never `Reported` in a unit the live part touched.
        let runs = unit_runs(&a, tail_unit);
        assert!(runs.iter().all(|r| r.2 != PageState::Reported), "order {cache_max_order}: {runs:?}");
        a.check_invariants().unwrap();
        // SAFETY: `a` is used by this thread only.
        unsafe { check_free_states(&a) }.unwrap();
        a.free(p).unwrap();
        a.drain_thread_cache();
        a.check_invariants().unwrap();
    }
}
