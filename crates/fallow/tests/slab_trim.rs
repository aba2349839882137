//! Trimming live spans (slab/trim.rs): the owner of a span freed down to its low mark gives the
//! pages no live object touches back to the kernel (read with `mincore` and the statistics),
//! keeps the live objects' contents, hands the objects of given-back pages out again reading
//! zero, trims every span at `drain_thread_cache` and spans other threads freed down at the
//! owner's sweep, does not trim a span again until it has been full again, waits at the mark
//! before a span's first trim when the allocator has a report delay, and lists the
//! given-back pages of a span that empties `Reported` in the page layer; a random test with
//! trimming on accounts for every object.

mod common;

use common::os::resident_pages;
use common::Rng;
use fallow::{Allocator, Config, Flags, PageState, Tunables};

const SPAN: usize = 64 << 10;
const PAGE: usize = 4096;
/// 1 KiB objects: 63 to a 64 KiB span (the first one at the class's colour, 1 KiB in), 4 a
/// page but the first (3), none across a page boundary.
const SIZE: usize = 1024;
const PER_SPAN: usize = fallow::binding_support::objects_per_span(SIZE);
/// Objects on the span's first page (past the colour).
const PAGE_0: usize = (PAGE - (SPAN - PER_SPAN * SIZE)) / SIZE;

/// No report delay: a span at its mark is trimmed at once (it waits a two-hundredth of the delay).
fn cfg() -> Config {
    let tunables = Tunables { report_delay_ms: 0, ..Tunables::off() };
    Config { arena_size: 256 << 20, max_order: 12, tunables, small_objects: true, ..Config::default() }
}


fn fill(p: usize, len: usize, v: u8) {
    // SAFETY: a live object of at least `len` bytes, the caller's.
    unsafe { (p as *mut u8).write_bytes(v, len) };
}

fn holds(p: usize, len: usize, v: u8) -> bool {
    // SAFETY: as in `fill`.
    unsafe { std::slice::from_raw_parts(p as *const u8, len) }.iter().all(|&b| b == v)
}

/// One full span of `SIZE`-byte objects, armed (one request more found it full and took a second
/// span, which that object's free leaves empty and current): its objects in address order, each
/// filled with its index.
fn one_full_span(a: &Allocator) -> Vec<usize> {
    let mut objs: Vec<usize> = (0..=PER_SPAN).map(|_| a.malloc(SIZE, 16, Flags::NONE).unwrap().as_ptr() as usize).collect();
    let extra = objs.pop().unwrap();
    a.free_any(extra as *mut u8).unwrap();
    objs.sort();
    let base = objs[0] & !(SPAN - 1);
    assert!(objs.iter().all(|&o| o & !(SPAN - 1) == base), "one span");
    for (i, &o) in objs.iter().enumerate() {
        fill(o, SIZE, i as u8 + 1);
    }
    objs
}

/// Free, in a random order, every object of `objs` but those of the span's first page.
fn free_all_but_page_0(a: &Allocator, objs: &[usize], seed: u64) -> Vec<usize> {
    let base = objs[0] & !(SPAN - 1);
    let mut gone: Vec<usize> = objs.iter().copied().filter(|&o| o - base >= PAGE).collect();
    Rng(seed).shuffle(&mut gone);
    for &o in &gone {
        a.free_any(o as *mut u8).unwrap();
    }
    gone
}

#[test]
fn a_spans_free_pages_go_back_when_its_objects_are_freed_down_to_the_mark() {
    let a = Allocator::new(cfg()).unwrap();
    let objs = one_full_span(&a);
    let base = objs[0] & !(SPAN - 1);
    assert_eq!(resident_pages(base, SPAN).unwrap(), SPAN / PAGE);
    free_all_but_page_0(&a, &objs, 7);
    a.check_invariants().unwrap();
    // The objects of page 0 are live: every other page went back, by the kernel's count and the
    // statistics'.
    assert_eq!(resident_pages(base, SPAN).unwrap(), 1);
    let s = a.stats();
    assert_eq!(s.small_trimmed_pages, (SPAN / PAGE - 1) as u64, "{s}");
    assert!(s.small_trims >= 1 && s.small_trimmed_pages_total == s.small_trimmed_pages, "{s}");
    assert_eq!(s.small_live_objects, PAGE_0 as u64);
    // The live objects kept their contents.
    for (i, &o) in objs.iter().enumerate().take(PAGE_0) {
        assert!(holds(o, SIZE, i as u8 + 1), "object {i}");
    }
    for &o in &objs[..PAGE_0] {
        a.free_any(o as *mut u8).unwrap();
    }
    a.drain_thread_cache();
    a.check_invariants().unwrap();
    let s = a.stats();
    assert_eq!((s.small_spans, s.small_trimmed_pages, s.bytes_in_use), (0, 0, 0), "{s}");
}

/// With a report delay, a span at its mark waits a two-hundredth of it before its first trim (a
/// program that empties or refills its spans within that pays no `madvise` and no page fault);
/// the owner's first free into it after the wait trims it.
#[test]
fn a_span_at_its_mark_waits_before_its_first_trim() {
    // A wait of a second: the few frees below take microseconds (a liveness margin, not a
    // timing asserted).
    let tunables = Tunables { report_delay_ms: 200_000, ..Tunables::off() };
    let a = Allocator::new(Config { tunables, ..cfg() }).unwrap();
    let objs = one_full_span(&a);
    let base = objs[0] & !(SPAN - 1);
    // Pages 0 and 1 live (7 objects, below the mark of 15), the rest freed: due, not yet trimmed.
    let mut gone: Vec<usize> = objs.iter().copied().filter(|&o| o - base >= 2 * PAGE).collect();
    Rng(5).shuffle(&mut gone);
    for &o in &gone {
        a.free_any(o as *mut u8).unwrap();
    }
    assert_eq!(resident_pages(base, SPAN).unwrap(), SPAN / PAGE, "trimmed before its wait");
    assert_eq!(a.stats().small_trims, 0);
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    a.free_any(objs[4] as *mut u8).unwrap();
    a.check_invariants().unwrap();
    assert_eq!(resident_pages(base, SPAN).unwrap(), 2, "not trimmed after its wait");
    assert_eq!(a.stats().small_trimmed_pages, (SPAN / PAGE - 2) as u64);
    for (i, &o) in objs.iter().enumerate().take(PAGE_0 + PAGE / SIZE) {
        assert!(i == 4 || holds(o, SIZE, i as u8 + 1), "object {i}");
    }
}

/// A trimmed span that empties goes back to the page layer with its given-back pages listed
/// `Reported` (they read zero and are not resident) and the others `Dirty`: none is counted
/// resident that is not, and none would be zeroed (faulted back in) by the zeroing worker.
#[test]
fn an_emptied_spans_given_back_pages_go_back_to_the_page_layer_reported() {
    let a = Allocator::new(cfg()).unwrap();
    let objs = one_full_span(&a);
    let base = objs[0] & !(SPAN - 1);
    free_all_but_page_0(&a, &objs, 11);
    assert_eq!(a.stats().small_trimmed_pages, (SPAN / PAGE - 1) as u64);
    let dirty_before = a.stats().free_dirty_pages;
    for &o in &objs[..PAGE_0] {
        a.free_any(o as *mut u8).unwrap();
    }
    a.drain_thread_cache();
    a.check_invariants().unwrap();
    assert_eq!(a.stats().small_spans, 0);
    let runs = a.free_runs();
    let state = |addr: usize| runs.iter().find(|r| r.0 <= addr && addr < r.0 + r.1).map(|r| r.2);
    assert_eq!(state(base), Some(PageState::Dirty), "page 0, written and not given back: {runs:?}");
    for k in 1..SPAN / PAGE {
        assert_eq!(state(base + k * PAGE), Some(PageState::Reported), "page {k}: {runs:?}");
    }
    // Dirty free memory: page 0 of this span, and the pages of the second span
    // (`one_full_span`'s) its one object's first take wrote (one or two; its other pages, never
    // written, go back as they came: slab_page_states.rs), not the fifteen pages given back.
    let dirty = a.stats().free_dirty_pages - dirty_before;
    assert!((2..=3).contains(&dirty), "{dirty} pages");
    assert_eq!(resident_pages(base, SPAN).unwrap(), 1);
    // SAFETY: `a` is used by this thread only.
    unsafe { common::check_free_states(&a) }.unwrap();
}

#[test]
fn objects_on_given_back_pages_are_handed_out_again_reading_zero() {
    let a = Allocator::new(cfg()).unwrap();
    let objs = one_full_span(&a);
    let gone = free_all_but_page_0(&a, &objs, 11);
    // The second span (current, empty) serves the first `PER_SPAN` requests; then the trimmed span's
    // objects come back, plain ones and zeroed ones.
    let mut got = Vec::new();
    for i in 0..PER_SPAN + gone.len() {
        let flags = if i % 3 == 0 { Flags::ZERO } else { Flags::NONE };
        got.push((a.malloc(SIZE, 16, flags).unwrap().as_ptr() as usize, flags));
    }
    a.check_invariants().unwrap();
    let base = objs[0] & !(SPAN - 1);
    let mut again: Vec<usize> = got.iter().map(|g| g.0).filter(|&o| o & !(SPAN - 1) == base).collect();
    again.sort();
    let mut want = gone.clone();
    want.sort();
    assert_eq!(again, want, "the freed objects of the trimmed span, each once");
    for &(o, flags) in &got {
        if o & !(SPAN - 1) != base {
            continue;
        }
        // A plain request's object was a list's link in its first word; the rest of it, on a
        // page given back, reads zero (it held its index before the trim). A zeroed one reads
        // zero whole.
        let from = if flags == Flags::ZERO { 0 } else { 8 };
        assert!(holds(o + from, SIZE - from, 0), "object {:#x} ({flags:?}) does not read zero", o - base);
    }
    for (i, &o) in objs.iter().enumerate().take(PAGE_0) {
        assert!(holds(o, SIZE, i as u8 + 1), "object {i}");
    }
    // No object twice.
    let mut all: Vec<usize> = got.iter().map(|g| g.0).chain(objs[..PAGE_0].iter().copied()).collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), got.len() + PAGE_0);
    assert_eq!(a.stats().small_trimmed_pages, 0);
    for o in all {
        a.free_any(o as *mut u8).unwrap();
    }
    a.drain_thread_cache();
    a.check_invariants().unwrap();
    assert_eq!(a.stats().small_spans, 0);
}

#[test]
fn draining_the_thread_cache_trims_every_span_whatever_its_marks() {
    let a = Allocator::new(cfg()).unwrap();
    let objs = one_full_span(&a);
    let base = objs[0] & !(SPAN - 1);
    // Half freed (pages 8-15): above the low mark, nothing given back yet.
    for &o in &objs[PER_SPAN / 2..] {
        a.free_any(o as *mut u8).unwrap();
    }
    assert_eq!(resident_pages(base, SPAN).unwrap(), SPAN / PAGE);
    assert_eq!(a.stats().small_trimmed_pages, 0);
    a.drain_thread_cache();
    a.check_invariants().unwrap();
    assert_eq!(resident_pages(base, SPAN).unwrap(), SPAN / PAGE / 2);
    assert_eq!(a.stats().small_trimmed_pages, (SPAN / PAGE / 2) as u64);
    for (i, &o) in objs[..PER_SPAN / 2].iter().enumerate() {
        assert!(holds(o, SIZE, i as u8 + 1), "object {i}");
        a.free_any(o as *mut u8).unwrap();
    }
    a.drain_thread_cache();
    assert_eq!(a.stats().small_spans, 0);
}

#[test]
fn a_trimmed_span_is_not_trimmed_again_until_full_and_then_at_a_lower_mark() {
    let a = Allocator::new(cfg()).unwrap();
    let objs = one_full_span(&a);
    let base = objs[0] & !(SPAN - 1);
    // Down to 12 live (below the first mark, 15): one trim.
    let mut live: Vec<usize> = objs.clone();
    Rng(3).shuffle(&mut live);
    for o in live.drain(12..) {
        a.free_any(o as *mut u8).unwrap();
    }
    assert!(a.stats().small_trims >= 1, "trimmed at the mark");
    assert!(resident_pages(base, SPAN).unwrap() < SPAN / PAGE);
    // Enough requests to fill the current span and reach into the trimmed one past its kept
    // free objects without filling it (45 of its 51 free: its refill links, so faults in, every
    // page again), all freed again, down to 12 live:
    // its empty pages stay (the other span, found full, is trimmed: not this one).
    let more: Vec<usize> = (0..PER_SPAN + 45).map(|_| a.malloc(SIZE, 16, Flags::NONE).unwrap().as_ptr() as usize).collect();
    assert_eq!(more.iter().filter(|&&o| o & !(SPAN - 1) == base).count(), 45, "the trimmed span served 45");
    for o in more {
        a.free_any(o as *mut u8).unwrap();
    }
    a.check_invariants().unwrap();
    assert_eq!(resident_pages(base, SPAN).unwrap(), SPAN / PAGE, "trimmed again without being full");
    // Filled up (the span found full), then freed down again: armed again, at half its first
    // mark (7: the trim before gave pages back and the span filled again), so not trimmed at
    // 12 live, trimmed at 7 or fewer.
    let more: Vec<usize> = (0..2 * PER_SPAN).map(|_| a.malloc(SIZE, 16, Flags::NONE).unwrap().as_ptr() as usize).collect();
    let mut mine: Vec<usize> = more.iter().copied().filter(|&o| o & !(SPAN - 1) == base).collect();
    assert_eq!(mine.len(), PER_SPAN - 12, "the span is full");
    let others: Vec<usize> = more.iter().copied().filter(|&o| o & !(SPAN - 1) != base).collect();
    let extra = a.malloc(SIZE, 16, Flags::NONE).unwrap().as_ptr() as usize;
    Rng(5).shuffle(&mut mine);
    for o in mine {
        a.free_any(o as *mut u8).unwrap();
    }
    assert_eq!(resident_pages(base, SPAN).unwrap(), SPAN / PAGE, "at 12 live, above the halved mark");
    for o in live.drain(6..) {
        a.free_any(o as *mut u8).unwrap();
    }
    assert!(resident_pages(base, SPAN).unwrap() < SPAN / PAGE, "trimmed again after being full");
    for o in others.into_iter().chain(live).chain([extra]) {
        a.free_any(o as *mut u8).unwrap();
    }
    a.drain_thread_cache();
    a.check_invariants().unwrap();
    assert_eq!(a.stats().small_spans, 0);
}

#[test]
fn a_span_other_threads_freed_down_is_trimmed_at_the_owners_sweep() {
    let a = Allocator::new(cfg()).unwrap();
    let objs = one_full_span(&a);
    let base = objs[0] & !(SPAN - 1);
    let rest: Vec<usize> = objs.iter().copied().filter(|&o| o - base >= PAGE).collect();
    let b = a.clone();
    std::thread::spawn(move || {
        for o in rest {
            b.free_any(o as *mut u8).unwrap();
        }
    })
    .join()
    .unwrap();
    // Other threads' frees: nothing given back until the owner looks.
    assert_eq!(resident_pages(base, SPAN).unwrap(), SPAN / PAGE);
    // New spans of another class: the owner sweeps before one of them, collects the span and
    // trims it.
    let other: Vec<usize> = (0..6 * 32).map(|_| a.malloc(2048, 16, Flags::NONE).unwrap().as_ptr() as usize).collect();
    a.check_invariants().unwrap();
    assert_eq!(resident_pages(base, SPAN).unwrap(), 1);
    for (i, &o) in objs.iter().enumerate().take(PAGE_0) {
        assert!(holds(o, SIZE, i as u8 + 1), "object {i}");
    }
    for o in other.into_iter().chain(objs[..PAGE_0].iter().copied()) {
        a.free_any(o as *mut u8).unwrap();
    }
    a.drain_thread_cache();
    a.check_invariants().unwrap();
    assert_eq!(a.stats().small_spans, 0);
}

#[test]
fn random_sizes_frees_and_refills_with_trimming_account_for_every_object() {
    let a = Allocator::new(cfg()).unwrap();
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    // (address, size asked, tag)
    let mut live: Vec<(usize, usize, u8)> = Vec::new();
    let mut tag = 0u8;
    for round in 0..12 {
        // Fill up to a few thousand objects, then free all but a random 5-30%.
        let target = 2000 + r.below(3000);
        while live.len() < target {
            let size = match r.below(10) {
                0..=4 => 1 + r.below(256),
                5..=8 => 1 + r.below(4096),
                _ => 1 + r.below(Allocator::SMALL_MAX),
            };
            let zero = r.below(4) == 0;
            let p = a.malloc(size, 16, if zero { Flags::ZERO } else { Flags::NONE }).unwrap().as_ptr() as usize;
            if zero {
                assert!(holds(p, size, 0), "round {round}: a zeroed object of {size} bytes does not read zero");
            }
            tag = tag.wrapping_add(1).max(1);
            fill(p, size, tag);
            live.push((p, size, tag));
        }
        r.shuffle(&mut live);
        let keep = live.len() * (5 + r.below(26)) / 100;
        for (p, size, t) in live.drain(keep..) {
            assert!(holds(p, size, t), "round {round}: object {p:#x} lost its contents");
            a.free_any(p as *mut u8).unwrap();
        }
        a.check_invariants().unwrap();
        let mut spans: Vec<(usize, usize)> = live.iter().map(|&(p, s, _)| (p, p + s)).collect();
        spans.sort();
        assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "round {round}: live objects overlap");
        for &(p, size, t) in &live {
            assert!(holds(p, size, t), "round {round}: object {p:#x} lost its contents");
        }
        assert_eq!(a.stats().small_live_objects, live.len() as u64, "round {round}");
    }
    let s = a.stats();
    assert!(s.small_trims > 0 && s.small_trimmed_pages_total > 0, "trimming took part: {s}");
    for (p, size, t) in live {
        assert!(holds(p, size, t));
        a.free_any(p as *mut u8).unwrap();
    }
    a.drain_thread_cache();
    a.check_invariants().unwrap();
    let s = a.stats();
    assert_eq!((s.small_live_objects, s.small_spans, s.small_trimmed_pages, s.bytes_in_use), (0, 0, 0, 0), "{s}");
}
