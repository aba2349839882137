//! Arena options: growth past the first arena, blocks larger than the largest order, memfd
//! backing shared with another mapping, transparent huge pages.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::*;
use fallow::{Allocator, Backing, Config, Flags, PageState};

#[test]
fn grows_new_arenas_and_serves_runs_larger_than_a_block() {
    let a = small(); // 16 MiB arenas, 1 MiB blocks
    let mut ps = Vec::new();
    for _ in 0..40 {
        ps.push(a.alloc(1 << 20, 4096, Flags::NONE).unwrap().as_ptr());
    }
    assert!(a.stats().arenas >= 3);
    // 40 MiB: larger than an arena: a new arena sized for it, as a run of top-level blocks.
    let big = a.alloc((40 << 20) + 123, 4096, Flags::ZERO).unwrap().as_ptr();
    assert_eq!(a.usable_size(big), Some((40 << 20) + 4096));
    // SAFETY: `big` is a live block of `(40 << 20) + 4096` usable bytes (asserted above), not yet freed.
    unsafe { std::ptr::write_bytes(big, 7, 40 << 20) };
    for p in ps {
        a.free(p).unwrap();
    }
    a.free(big).unwrap();
    a.check_invariants().unwrap();
    // Everything merges back into top-level blocks (but for one deferred merge per arena).
    let s = a.stats();
    assert_eq!(s.free_pages() * 4096, s.reserved_bytes);
    assert!(merged_to_top(&s, 8), "{s}");
}

#[test]
fn never_touched_memory_is_reported_and_not_resident() {
    let a = small();
    let s = a.stats();
    assert_eq!(s.free_reported_pages * 4096, s.reserved_bytes);
    let p = a.alloc(64 << 10, 4096, Flags::ZERO).unwrap().as_ptr();
    // Reported pages read zero: no memset needed.
    assert_eq!(a.stats().zero_skipped_bytes, 64 << 10);
    assert_eq!(a.stats().zeroed_on_alloc_bytes, 0);
    // SAFETY: `p` is a live 64 KiB block from `alloc` above, used by this thread only.
    assert!(unsafe { all_zero(p, 64 << 10) });
    // SAFETY: `p` is still that live 64 KiB block.
    unsafe { std::ptr::write_bytes(p, 1, 64 << 10) };
    a.free(p).unwrap();
    assert_eq!(a.stats().free_dirty_pages, 16);
    // A ZERO request now prefers the dirty pages (a memset of resident memory) over reported
    // memory (a page fault, ~20x dearer here), and zeroes exactly those pages...
    let q = a.alloc(64 << 10, 4096, Flags::ZERO).unwrap().as_ptr();
    assert_eq!(q, p);
    assert_eq!(a.stats().zeroed_on_alloc_bytes, 64 << 10);
    // SAFETY: `q` is a live 64 KiB block from `alloc` above, used by this thread only.
    assert!(unsafe { all_zero(q, 64 << 10) });
    assert_eq!(a.stats().free_dirty_pages, 0);
    // ...and a plain request, with no dirty or zeroed memory left, takes reported memory.
    let r = a.alloc(64 << 10, 4096, Flags::NONE).unwrap().as_ptr();
    assert_eq!(a.stats().reused_reported_bytes, 2 * (64 << 10));
    a.free(q).unwrap();
    a.free(r).unwrap();
    // SAFETY: `a` is this test's own allocator and no other thread allocates from it.
    unsafe { check_free_states(&a) }.unwrap();
}

#[test]
fn zero_request_memsets_only_dirty_pages() {
    let a = small();
    // Fill the whole first arena so the next ZERO request must take dirty memory.
    let all = a.alloc(16 << 20, 4096, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `all` is a live 16 MiB block from `alloc` above, not yet freed.
    unsafe { std::ptr::write_bytes(all, 9, 16 << 20) };
    a.free(all).unwrap();
    let before = a.stats();
    assert_eq!(before.free_dirty_pages * 4096, 16 << 20);
    let p = a.alloc(8 << 20, 4096, Flags::ZERO).unwrap().as_ptr();
    let after = a.stats();
    // SAFETY: `p` is a live 8 MiB block from `alloc` above, used by this thread only.
    assert!(unsafe { all_zero(p, 8 << 20) });
    // Either a fresh (reported) arena or a memset of dirty pages; never garbage, and counted.
    assert_eq!(
        (after.zeroed_on_alloc_bytes - before.zeroed_on_alloc_bytes)
            + (after.zero_skipped_bytes - before.zero_skipped_bytes),
        8 << 20
    );
    a.free(p).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn memfd_backing_is_visible_through_the_descriptor() {
    let a = Allocator::new(Config {
        arena_size: 8 << 20,
        max_order: 8,
        thp: false,
        backing: Backing::Memfd,
        ..Config::default()
    })
    .unwrap();
    let fds = a.arena_fds();
    assert_eq!(fds.len(), 1);
    let (base, fd) = fds[0];
    let p = a.alloc(3 * 4096, 4096, Flags::ZERO).unwrap().as_ptr();
    // SAFETY: `p` is a live block of three pages from `alloc` above.
    unsafe { std::ptr::write_bytes(p, 0x5a, 3 * 4096) };
    // A second mapping of the same file (as a VMM would map guest memory) sees the data.
    let off = p as usize - base;
    let mut buf = [0u8; 16];
    // SAFETY: `buf` is writable for the 16 bytes read; `fd` is the arena's memfd, open while `a` lives.
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr() as *mut _, 16, (off + 4096) as libc::off_t) };
    assert_eq!(n, 16);
    assert_eq!(buf, [0x5a; 16]);
    a.free(p).unwrap();
}

#[test]
fn thp_arena_allocates() {
    let a = Allocator::new(Config { arena_size: 64 << 20, max_order: 10, thp: true, ..Config::default() })
        .unwrap();
    let p = a.alloc(4 << 20, 2 << 20, Flags::ZERO | Flags::POPULATE).unwrap().as_ptr();
    assert_eq!(p as usize % (2 << 20), 0);
    // SAFETY: `p` is a live 4 MiB block from `alloc` above, used by this thread only.
    assert!(unsafe { all_zero(p, 4 << 20) });
    a.free(p).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn free_page_states_after_merge_never_claim_too_much() {
    let a = small();
    // A zero-reading (reported) half and a dirty half merge into a dirty-class block whose pages
    // keep their own states.
    let x = a.alloc(4 << 12, 4 << 12, Flags::NONE).unwrap().as_ptr();
    let y = a.alloc(4 << 12, 4 << 12, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `x` is a live block of four pages from `alloc` above, not yet freed.
    unsafe { std::ptr::write_bytes(x, 1, 4 << 12) };
    a.free(x).unwrap();
    a.free(y).unwrap(); // y never touched, but was handed out: dirty as far as we know
    let runs = a.free_runs();
    let dirty: usize = runs.iter().filter(|r| r.2 == PageState::Dirty).map(|r| r.1).sum();
    assert_eq!(dirty, 8 << 12);
    // SAFETY: `a` is this test's own allocator and no other thread allocates from it.
    unsafe { check_free_states(&a) }.unwrap();
    a.check_invariants().unwrap();
}
