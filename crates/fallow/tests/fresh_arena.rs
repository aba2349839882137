//! A fresh arena writes the record of its lowest top-level block only: the others are counted
//! and listed without a record until a take reaches them (`buddy/tops.rs`). Their records lie
//! a block's worth of pages apart in the metadata, so writing them all made a page of metadata
//! resident per top-level block in every process (96 KiB for an arena of 24 GiB). One test in
//! this file, so that no other test's memory moves the process's resident size meanwhile.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::os::resident_set_bytes as resident_bytes;
use common::Rng;
use fallow::{Allocator, Config, Flags, Tunables};

#[test]
fn top_level_blocks_are_written_as_takes_reach_them() {
    // 1 GiB of 1 MiB top-level blocks: 1,024 records 8 KiB apart in the metadata.
    let cfg = Config { arena_size: 1 << 30, max_order: 8, thp: false, tunables: Tunables::off(), cache: false, ..Config::default() };
    let before = resident_bytes();
    let a = Allocator::new(cfg).unwrap();
    let made = resident_bytes() - before;
    assert!(made < 1 << 20, "a fresh arena of 1,024 top-level blocks made {} KiB resident", made >> 10);
    let s = a.stats();
    assert_eq!(s.free_pages() * 4096, s.reserved_bytes, "every page of the fresh arena counted free");
    a.check_invariants().unwrap();
    // Takes of every kind past the written ones: whole blocks (the reported list, each empty
    // list writing the next block), runs longer than a block (`take_run`), and sizes that go
    // after the used part (`take_top`); freed in a random order, all merges back.
    let mut rng = Rng(7);
    let mut live = Vec::new();
    for i in 0..600 {
        let size = match i % 3 {
            0 => 1 << 20,
            1 => (3 << 20) + 4096 * (i % 7),
            _ => 4096 * (1 + rng.below(300)),
        };
        live.push(a.alloc(size, 4096, Flags::NONE).unwrap().as_ptr());
        if i % 50 == 0 {
            a.check_invariants().unwrap();
        }
    }
    rng.shuffle(&mut live);
    for p in live {
        a.free(p).unwrap();
    }
    a.check_invariants().unwrap();
    let s = a.stats();
    assert_eq!(s.free_pages() * 4096, s.reserved_bytes);
}
