//! Never-used tails of live spans (slab/tail.rs): a span taken from dirty pages gives back the
//! pages no object was ever handed out on at the owner's second sweep that finds that
//! no slow path took an object from it since the first, and at `drain_thread_cache`; a span its
//! class is filling keeps them, and so do a class's spans once one of them grew into its tail
//! given back; the objects keep their contents, the span hands out objects on those pages
//! again, and the pages go back to the page layer `Reported` (read with `mincore`, the
//! statistics and the page layer's lists).

mod common;

use common::os::resident_pages;
use fallow::{Allocator, Config, Flags, PageState, Tunables};

const SPAN: usize = 64 << 10;
const PAGE: usize = 4096;
/// Objects whose spans make the page layer's blocks dirty: 1 KiB, 63 to a 64 KiB span.
const DIRTY_SIZE: usize = 1024;
/// Objects of the spans whose tails are looked at: 16 bytes (a page of them is 256).
const TINY: usize = 16;
/// Pages a span of `TINY` objects has written after its first object: the first batch of
/// never-used objects (a page of them, linked) starts at the class's colour, so it ends on the
/// second page.
const WRITTEN: usize = 2;
/// New spans between two sweeps (slab/sweep.rs: at least 4).
const SWEEP_EVERY: usize = 4;

fn cfg() -> Config {
    Config { arena_size: 256 << 20, max_order: 12, tunables: Tunables::off(), small_objects: true, ..Config::default() }
}

fn malloc(a: &Allocator, size: usize) -> usize {
    a.malloc(size, 16, Flags::NONE).unwrap().as_ptr() as usize
}

fn span_of(p: usize) -> usize {
    p & !(SPAN - 1)
}

/// `spans` spans of 1 KiB objects written whole and freed, given back to the page layer by a
/// drain: the page layer's free pages are then dirty and resident, and it hands them out first.
fn dirty_the_page_layer(a: &Allocator, spans: usize) {
    let per = fallow::binding_support::objects_per_span(DIRTY_SIZE);
    let objs: Vec<usize> = (0..spans * per).map(|_| malloc(a, DIRTY_SIZE)).collect();
    for &o in &objs {
        // SAFETY: a live object of `DIRTY_SIZE` bytes, this test's.
        unsafe { (o as *mut u8).write_bytes(0x5a, DIRTY_SIZE) };
    }
    for o in objs {
        a.free_any(o as *mut u8).unwrap();
    }
    a.drain_thread_cache();
    assert_eq!(a.stats().small_spans, 0);
}

/// A 16-byte object in a span taken from dirty pages: every page of the span resident.
fn tiny_in_a_dirty_span(a: &Allocator) -> usize {
    let p = malloc(a, TINY);
    // SAFETY: a live object of `TINY` bytes, this test's.
    unsafe { (p as *mut u8).write_bytes(7, TINY) };
    assert_eq!(resident_pages(span_of(p), SPAN).unwrap(), SPAN / PAGE, "the span came from dirty pages");
    p
}

fn holds(p: usize, len: usize, v: u8) -> bool {
    // SAFETY: a live object of at least `len` bytes, the caller's.
    unsafe { std::slice::from_raw_parts(p as *const u8, len) }.iter().all(|&b| b == v)
}

/// The page layer's free runs that overlap `[start, start + len)`, by state.
fn free_states_in(a: &Allocator, start: usize, len: usize) -> Vec<(usize, usize, PageState)> {
    a.free_runs().into_iter().filter(|&(s, l, _)| s < start + len && start < s + l).collect()
}

#[test]
fn draining_the_thread_cache_gives_back_a_dirty_spans_never_used_pages() {
    let a = Allocator::new(cfg()).unwrap();
    dirty_the_page_layer(&a, 4);
    let p = tiny_in_a_dirty_span(&a);
    let base = span_of(p);
    let before = a.stats();
    a.drain_thread_cache();
    a.check_invariants().unwrap();
    // The pages of the first batch of objects stay; the other fourteen went back.
    assert_eq!(resident_pages(base, SPAN).unwrap(), WRITTEN);
    assert!(holds(p, TINY, 7));
    let s = a.stats();
    assert!(s.small_trims > before.small_trims, "{s}");
    assert_eq!(s.small_trimmed_pages_total, before.small_trimmed_pages_total + (SPAN / PAGE - WRITTEN) as u64, "{s}");
    assert_eq!(s.small_trimmed_pages, 0, "never-used pages are not freed objects' pages: {s}");
    // A drain again finds nothing more to give back.
    a.drain_thread_cache();
    assert_eq!(a.stats().small_trimmed_pages_total, s.small_trimmed_pages_total);
    // Objects on the given-back pages are handed out again (the kernel faults them in zeroed).
    let more: Vec<usize> = (0..3 * PAGE / TINY).map(|_| malloc(&a, TINY)).collect();
    assert!(more.iter().all(|&o| span_of(o) == base), "one span");
    for &o in &more {
        // SAFETY: a live object of `TINY` bytes, this test's.
        unsafe { (o as *mut u8).write_bytes(9, TINY) };
    }
    a.check_invariants().unwrap();
    assert!(resident_pages(base, SPAN).unwrap() <= 5);
    // Back to the page layer: the pages past the objects handed out are listed `Reported`.
    for o in more.into_iter().chain([p]) {
        a.free_any(o as *mut u8).unwrap();
    }
    a.drain_thread_cache();
    a.check_invariants().unwrap();
    let runs = free_states_in(&a, base, SPAN);
    let reported: usize = runs.iter().filter(|r| r.2 == PageState::Reported).map(|&(s, l, _)| (s + l).min(base + SPAN) - s.max(base)).sum();
    assert!(reported >= SPAN - 5 * PAGE, "{runs:x?}");
}

#[test]
fn the_sweeps_give_back_the_tail_of_a_span_whose_fresh_stalled_and_keep_a_filling_ones() {
    let a = Allocator::new(cfg()).unwrap();
    dirty_the_page_layer(&a, 16);
    // Two spans from dirty pages: one whose class takes one object, one whose class goes on.
    let stalled = tiny_in_a_dirty_span(&a);
    let filling = malloc(&a, 2 * TINY);
    assert_eq!(resident_pages(span_of(filling), SPAN).unwrap(), SPAN / PAGE, "the span came from dirty pages");
    let mut filled = vec![filling];
    // New spans of a class of their own (4 KiB objects, 16 a span), a page of 32-byte objects
    // between two of them: sweeps come before new spans, every `SWEEP_EVERY` of them.
    let mut big = Vec::new();
    for _ in 0..3 * SWEEP_EVERY {
        big.extend(new_spans(&a, 1));
        filled.extend((0..PAGE / (2 * TINY)).map(|_| malloc(&a, 2 * TINY)));
    }
    a.check_invariants().unwrap();
    assert_eq!(resident_pages(span_of(stalled), SPAN).unwrap(), WRITTEN, "the stalled span's tail went back");
    assert!(holds(stalled, TINY, 7));
    // The span being filled kept its pages (the 32-byte class's spans hold 2,000 objects: the
    // first one is the filling one still).
    assert_eq!(resident_pages(span_of(filling), SPAN).unwrap(), SPAN / PAGE, "the filling span kept its tail");
    for o in big.into_iter().chain(filled).chain([stalled]) {
        a.free_any(o as *mut u8).unwrap();
    }
    a.drain_thread_cache();
    a.check_invariants().unwrap();
    assert_eq!(a.stats().small_spans, 0);
}

/// Objects of a class of their own (4 KiB, 16 a span) filling `n` new spans: the owner sweeps
/// before every `SWEEP_EVERY`-th.
fn new_spans(a: &Allocator, n: usize) -> Vec<usize> {
    (0..n * fallow::binding_support::objects_per_span(4096)).map(|_| malloc(a, 4096)).collect()
}

#[test]
fn a_class_whose_span_grew_into_its_given_back_tail_keeps_its_tails() {
    let a = Allocator::new(cfg()).unwrap();
    dirty_the_page_layer(&a, 32);
    let first = tiny_in_a_dirty_span(&a);
    let mut big = new_spans(&a, 3 * SWEEP_EVERY);
    assert_eq!(resident_pages(span_of(first), SPAN).unwrap(), WRITTEN, "the stalled span's tail went back");
    // The class grows into the pages given back, then fills its span and takes a second one.
    let per = fallow::binding_support::objects_per_span(TINY);
    let mut tiny: Vec<usize> = (1..per).map(|_| malloc(&a, TINY)).collect();
    assert!(tiny.iter().all(|&o| span_of(o) == span_of(first)), "one span");
    let second = malloc(&a, TINY);
    assert_ne!(span_of(second), span_of(first));
    assert_eq!(resident_pages(span_of(second), SPAN).unwrap(), SPAN / PAGE, "the span came from dirty pages");
    // Its tail stalls as the first one's did, and stays.
    big.extend(new_spans(&a, 3 * SWEEP_EVERY));
    a.check_invariants().unwrap();
    assert_eq!(resident_pages(span_of(second), SPAN).unwrap(), SPAN / PAGE, "the class keeps its tails");
    tiny.extend([first, second]);
    for o in big.into_iter().chain(tiny) {
        a.free_any(o as *mut u8).unwrap();
    }
    a.drain_thread_cache();
    a.check_invariants().unwrap();
    assert_eq!(a.stats().small_spans, 0);
}
