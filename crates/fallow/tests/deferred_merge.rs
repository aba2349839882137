//! The deferred merge of the last dirty run freed (buddy/deferred.rs): a block above the caches'
//! orders freed and asked for again is reused in place, a larger request still finds the memory
//! that merging gives, a second free of it is still a double free, and the lists' invariants
//! (with their one exception) hold at every step. Workers off, 4 KiB pages and caches up to
//! 2 MiB: nothing but these calls changes the lists, and 4-8 MiB blocks take the locked path.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::take_written;

use fallow::{Allocator, Config, Error, Tunables};

const PAGE: usize = 4096;
const MIB: usize = 1 << 20;

fn allocator(arena: usize, max_order: u8) -> Allocator {
    let c = Config { arena_size: arena, max_order, thp: false, tunables: Tunables::off(), cache_max_order: 9, ..Config::default() };
    Allocator::new(c).unwrap()
}

#[test]
fn a_freed_run_is_taken_back_in_place_and_the_lists_stay_sound() {
    let a = allocator(256 * MIB, 16);
    // Requests of 4-8 MiB, above the caches' 2 MiB: the locked path, every one of order 11.
    let sizes = [5 * MIB + 3 * PAGE, 8 * MIB, 6 * MIB, 4 * MIB + PAGE, 7 * MIB + 5 * PAGE, 5 * MIB];
    let first = take_written(&a, sizes[0], false, 1);
    a.free(first).unwrap();
    a.check_invariants().unwrap();
    for (i, &len) in sizes.iter().enumerate().skip(1) {
        let p = take_written(&a, len, i % 2 == 0, i as u8);
        assert_eq!(p, first, "request {i} of {len} bytes did not reuse the block just freed");
        a.check_invariants().unwrap();
        a.free(p).unwrap();
        a.check_invariants().unwrap();
    }
    // The block freed last is still a double free.
    assert!(matches!(a.free(first), Err(Error::DoubleFree { .. })), "a second free of the unmerged block was not caught");
    a.check_invariants().unwrap();
}

#[test]
fn a_larger_request_gets_the_memory_that_merging_gives() {
    // One arena of 16 MiB, a top block of 16 MiB (order 12): a 4 MiB block freed (written
    // whole, so dirty whole) is listed unmerged (order 10); only merging it makes the 16 MiB
    // block that the next request needs.
    let a = allocator(16 * MIB, 12);
    let p = take_written(&a, 4 * MIB, false, 7);
    a.free(p).unwrap();
    a.check_invariants().unwrap();
    let s = a.stats();
    let at = |order: usize| (0..3).map(|c| s.free_blocks[c][order]).sum::<u64>();
    assert_eq!((at(10), at(11), at(12)), (2, 1, 0), "the freed block was not left unmerged beside its buddy");
    let whole = take_written(&a, 16 * MIB, true, 9);
    assert_eq!(whole, p, "the whole arena was not served from the merged blocks");
    assert_eq!(a.stats().arenas, 1, "the heap grew instead of merging");
    a.check_invariants().unwrap();
    a.free(whole).unwrap();
    // A smaller order after a larger one: the unmerged 16 MiB block serves it, in place.
    let q = take_written(&a, 3 * MIB, true, 3);
    assert_eq!(q, p);
    a.free(q).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn blocks_beside_the_unmerged_one_merge_with_it() {
    let a = allocator(64 * MIB, 14);
    // Two neighbours of 4 MiB (order 10), the second freed first: each free that finds the rest
    // of its block listed leaves it unmerged, and the other's free merges the pair.
    let x = take_written(&a, 4 * MIB, false, 1);
    let y = take_written(&a, 3 * MIB, false, 2);
    assert_eq!(y as usize, x as usize + 4 * MIB, "the second block is not the first one's buddy");
    a.free(y).unwrap();
    a.check_invariants().unwrap();
    a.free(x).unwrap();
    a.check_invariants().unwrap();
    // Everything merged back: the whole arena is one block again.
    let whole = take_written(&a, 64 * MIB, false, 4);
    assert_eq!(whole, x);
    a.free(whole).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn a_run_freed_last_and_left_alone_goes_back_whole() {
    // Caches off, so that a 1 MiB block (order 8, below `report_order` 9) takes the locked path
    // and is left unmerged beside its buddy when freed. Left alone, it must merge so that its
    // 2 MiB block is reported with the rest: every free page ends up `Reported`.
    let t = Tunables { report: true, zeroing: false, report_delay_ms: 50, zero_delay_ms: 20, ..Tunables::default() };
    let c = Config { arena_size: 16 * MIB, max_order: 12, thp: false, cache: false, tunables: t, ..Config::default() };
    let a = Allocator::new(c).unwrap();
    let p = take_written(&a, MIB, false, 5);
    a.free(p).unwrap();
    common::wait_for("every free page reported", || {
        let s = a.stats();
        s.free_reported_pages == s.free_pages()
    });
    a.check_invariants().unwrap();
}

#[test]
fn a_run_whose_tail_was_never_written_is_left_unmerged_with_its_half_records() {
    for thp in [false, true] {
        let c = Config { arena_size: 16 * MIB, max_order: 12, thp, tunables: Tunables::off(), ..Config::default() };
        let a = Allocator::new(c).unwrap();
        // 3 MiB and a page (order 10): the rest of the 4 MiB block is never written, so it stays
        // `Reported` (4 KiB pages) or `Zeroed` (huge pages: the part of the unit the run shares).
        // The free leaves the block unmerged all the same, a mixed block whose half records
        // `check_invariants` reads against its state bytes.
        let p = take_written(&a, 3 * MIB + PAGE, false, 7);
        a.free(p).unwrap();
        a.check_invariants().unwrap();
        let s = a.stats();
        let at = |order: usize| (0..3).map(|c| s.free_blocks[c][order]).sum::<u64>();
        assert_eq!((at(10), at(11), at(12)), (2, 1, 0), "thp {thp}: a block with an unwritten tail was merged");
        // Taken back in place for a `ZERO` request: the written part is cleared, the rest reads
        // zero as it is (`take` checks every byte).
        let q = take_written(&a, 4 * MIB, true, 3);
        assert_eq!(q, p, "thp {thp}: the unmerged block was not reused");
        a.free(q).unwrap();
        a.check_invariants().unwrap();
        let whole = take_written(&a, 16 * MIB, true, 9);
        assert_eq!(whole, p, "thp {thp}: the whole arena was not served from the merged blocks");
        a.free(whole).unwrap();
        a.check_invariants().unwrap();
    }
}
