//! A per-thread cache's refill of a small order takes resident memory before it faults memory in:
//! a group of 64 pages only while one is mostly resident, else the free dirty blocks of the order.
//! Workers off: nothing but these calls changes the lists.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::take_written;
use fallow::{Allocator, Config, Tunables};

const PAGE: usize = 4096;

/// Dirty free blocks of 8 pages between live ones, and a block listed `Dirty` that merged a
/// few dirty pages with the never-used memory after them: a refill of 8-page blocks takes the
/// dirty blocks, not a group of the merged block (mostly memory to fault in).
#[test]
fn a_small_refill_takes_the_dirty_blocks_before_a_group_of_mostly_reported_memory() {
    // Orders up to 3 (8 pages) cached: larger requests take the locked path.
    let c = Config { arena_size: 64 << 20, max_order: 12, thp: false, tunables: Tunables::off(), cache_max_order: 3, ..Config::default() };
    let a = Allocator::new(c).unwrap();
    // 32 blocks of 8 pages (four refills of a group each), every other one freed: 128 dirty
    // pages in blocks of 8 between live ones, listed once the cache is drained.
    let blocks: Vec<*mut u8> = (0..32).map(|i| take_written(&a, 8 * PAGE, false, i + 1)).collect();
    let freed: Vec<usize> = blocks.iter().step_by(2).map(|&p| p as usize).collect();
    for &p in &freed {
        a.free(p as *mut u8).unwrap();
    }
    a.drain_thread_cache();
    // 20 pages on the locked path, right after the used part, written and freed: they merge
    // with the never-used pages after them into a block listed `Dirty` (20 dirty pages, the
    // rest never used).
    let end = blocks.iter().map(|&p| p as usize).max().unwrap() + 8 * PAGE;
    let big = take_written(&a, 20 * PAGE, false, 99);
    assert_eq!(big as usize, end, "not right after the used part");
    a.free(big).unwrap();
    a.check_invariants().unwrap();
    // The first request after a drain takes the locked path (a run the request fills); the
    // second refills the cache, and the block handed out is one of the dirty ones.
    let first = take_written(&a, 8 * PAGE, false, 7) as usize;
    assert!(freed.contains(&first), "the locked path passed over the dirty blocks");
    let p = take_written(&a, 8 * PAGE, false, 8) as usize;
    assert!(freed.contains(&p), "the refill took a group of mostly never-used memory ({p:#x}) while dirty blocks were free");
    a.check_invariants().unwrap();
}
