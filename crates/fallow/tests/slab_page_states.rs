//! Spans and the states of their pages (slab/trim.rs, "Back to the page layer"): the pages of a
//! span that no object was ever handed out on go back to the page layer in the states they had
//! when the span was taken (`Reported`: not resident; `Zeroed`: resident zeros), not `Dirty`;
//! and a span taken without `ZERO` from pages that all read zero serves `calloc` from its
//! never-used objects without a memset.

mod common;

use common::os::resident_pages;
use common::wait_for;
use fallow::{Allocator, Config, Flags, PageState, Tunables};

const PAGE: usize = 4096;
/// 1 KiB objects: 64 KiB spans (16 pages), a page's worth of objects linked at the first take.
const SIZE: usize = 1024;
const SPAN: usize = 64 << 10;

fn cfg(tunables: Tunables) -> Config {
    Config { arena_size: 64 << 20, max_order: 12, thp: false, cache: false, tunables, small_objects: true, ..Config::default() }
}

/// The state of the free page at `addr`, if it is free.
fn state_of(a: &Allocator, addr: usize) -> Option<PageState> {
    a.free_runs().iter().find(|r| r.0 <= addr && addr < r.0 + r.1).map(|r| r.2)
}

/// The span's first pages, `Dirty`: those its first page's worth of objects (linked at the
/// first take, past the class's colour) lies on, one or two.
fn written_pages(a: &Allocator, base: usize) -> usize {
    let n = (0..SPAN / PAGE).take_while(|k| state_of(a, base + k * PAGE) == Some(PageState::Dirty)).count();
    assert!((1..=2).contains(&n), "{n} dirty pages: {:?}", a.free_runs());
    n
}

/// One object taken and freed: its span (64 KiB, its first page written) goes back to the page
/// layer at `drain_thread_cache`. Returns the span's start.
fn span_taken_and_given_back(a: &Allocator) -> usize {
    let p = a.malloc(SIZE, 16, Flags::NONE).unwrap().as_ptr();
    // SAFETY: a live object of `SIZE` bytes.
    unsafe { p.write_bytes(9, SIZE) };
    let base = p as usize & !(SPAN - 1);
    assert_eq!(a.stats().small_spans, 1);
    a.free_any(p).unwrap();
    a.drain_thread_cache();
    assert_eq!(a.stats().small_spans, 0);
    a.check_invariants().unwrap();
    base
}

#[test]
fn a_spans_pages_no_object_was_handed_out_on_go_back_reported() {
    let a = Allocator::new(cfg(Tunables::off())).unwrap();
    // A fresh arena: the span is cut from never-used memory, `Reported`.
    let before = a.stats();
    let base = span_taken_and_given_back(&a);
    let written = written_pages(&a, base);
    let dirty_before = before.free_dirty_pages;
    // The pages never written are still never-used memory, not memory given back after use.
    assert_eq!(a.stats().never_used_pages + written as u64, before.never_used_pages);
    for k in written..SPAN / PAGE {
        assert_eq!(state_of(&a, base + k * PAGE), Some(PageState::Reported), "page {k}: {:?}", a.free_runs());
    }
    assert_eq!(a.stats().free_dirty_pages, dirty_before + written as u64);
    assert!(resident_pages(base, SPAN).unwrap() <= written);
    // SAFETY: `a` is used by this thread only.
    unsafe { common::check_free_states(&a) }.unwrap();
}

#[test]
fn a_spans_pages_no_object_was_handed_out_on_go_back_zeroed_if_they_came_zeroed() {
    let t = Tunables { zeroing: true, zero_order: 0, zero_delay_ms: 0, ..Tunables::off() };
    let a = Allocator::new(cfg(t)).unwrap();
    // The zeroing worker starts at the first `ZERO` request.
    let z = a.alloc(PAGE, PAGE, Flags::ZERO).unwrap();
    a.free(z.as_ptr()).unwrap();
    // 256 KiB written and freed: dirty, then zeroed by the worker.
    let b = a.alloc(256 << 10, 256 << 10, Flags::NONE).unwrap().as_ptr();
    // SAFETY: a live block of 256 KiB.
    unsafe { b.write_bytes(5, 256 << 10) };
    a.free(b).unwrap();
    wait_for("the 256 KiB block to be zeroed", || a.stats().free_dirty_pages == 0 && a.stats().free_zeroed_pages >= 64);
    a.set_tunables(Tunables { zeroing: false, ..a.tunables() }).unwrap();
    // A plain request takes resident memory first: the span is cut from the zeroed pages.
    let base = span_taken_and_given_back(&a);
    assert!(base >= b as usize && base < b as usize + (256 << 10), "the span was cut from the zeroed block");
    let written = written_pages(&a, base);
    for k in written..SPAN / PAGE {
        assert_eq!(state_of(&a, base + k * PAGE), Some(PageState::Zeroed), "page {k}: {:?}", a.free_runs());
    }
    assert_eq!(a.stats().free_dirty_pages, written as u64);
    // SAFETY: `a` is used by this thread only (its worker is off).
    unsafe { common::check_free_states(&a) }.unwrap();
}

#[test]
fn calloc_from_a_span_of_never_used_pages_taken_by_malloc_needs_no_memset() {
    let a = Allocator::new(cfg(Tunables::off())).unwrap();
    // 16 KiB objects (128 KiB spans): the first one, taken by `malloc`, makes the span.
    const BIG: usize = 16 << 10;
    let first = a.malloc(BIG, 16, Flags::NONE).unwrap().as_ptr();
    // SAFETY: a live object of `BIG` bytes.
    unsafe { first.write_bytes(3, BIG) };
    let z = a.malloc(BIG, 16, Flags::ZERO).unwrap().as_ptr() as usize;
    assert_eq!(z & !((128 << 10) - 1), first as usize & !((128 << 10) - 1), "one span");
    // Never handed out before, on pages that read zero: handed out with no memset, so none of
    // the pages wholly inside it is resident (looked at before reading it, which maps them).
    let (lo, hi) = (z.next_multiple_of(PAGE), (z + BIG) & !(PAGE - 1));
    assert!(hi > lo);
    assert_eq!(resident_pages(lo, hi - lo).unwrap(), 0, "the object was memset");
    // SAFETY: a live object of `BIG` bytes, this thread's.
    assert!(unsafe { common::all_zero(z as *const u8, BIG) });
    a.free_any(z as *mut u8).unwrap();
    a.free_any(first).unwrap();
    a.check_invariants().unwrap();
}
