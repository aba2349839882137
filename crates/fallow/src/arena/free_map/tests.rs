//! Tests of the free-page map: the sweep against a plain walk over random marks, the
//! summaries of words, partial last units, the run that reaches the limit.

use super::*;

const CHUNK: u32 = unit_pages(1);
const GROUP: u32 = unit_pages(3);
const TOP: u32 = unit_pages(LEVELS);

/// A map over `npages` pages in a zeroed buffer.
fn map(npages: u32) -> (Vec<u64>, FreeMap) {
    let mut mem = vec![0u64; FreeMap::bytes(npages) / 8];
    // SAFETY: the buffer is zero, 8-aligned and `bytes(npages)` long, used by this map only
    // (it outlives the map in every test: returned beside it).
    let m = unsafe { FreeMap::from_raw(mem.as_mut_ptr(), npages) };
    (mem, m)
}

/// `FreeMap::check` with the free pages of `free` as the listed blocks.
fn check_against(m: &FreeMap, free: &[bool]) -> Result<(), String> {
    let pages = free.iter().filter(|&&f| f).count() as u64;
    m.check(
        |f| {
            for (p, _) in free.iter().enumerate().filter(|(_, &f)| f) {
                f(p as u32, 1);
            }
        },
        pages,
    )
}

/// The runs of at least `n` free pages starting below `limit`, as the sweep reports them,
/// from a plain array: one that reaches `limit` ends at its first page not free, at most
/// `2 * n` pages past its start.
fn naive(free: &[bool], limit: u32, n: u32) -> Vec<(u32, u32)> {
    let mut runs = Vec::new();
    let mut p = 0u32;
    let len = free.len() as u32;
    while p < limit {
        if !free[p as usize] {
            p += 1;
            continue;
        }
        let start = p;
        while p < len && free[p as usize] && (p < limit || p < start + 2 * n) {
            p += 1;
        }
        if p - start >= n {
            runs.push((start, p));
        }
    }
    runs
}

#[test]
fn words_summarize_their_runs() {
    assert_eq!(Summary::of_word(0), Summary::full(64));
    assert_eq!(Summary::of_word(!0), Summary::NONE);
    // Pages 0-3 used, 4-9 free, 10 used, 11-63 free.
    let w = 0b1111 | 1 << 10;
    assert_eq!(Summary::of_word(w), Summary { start: 0, inner: 6, end: 53 });
    assert_eq!(Summary::of_word(1 << 63), Summary { start: 63, inner: 0, end: 0 });
    assert_eq!(Summary::of_word(!(0b111u64 << 20)), Summary { start: 0, inner: 3, end: 0 });
}

#[test]
fn a_fresh_map_whose_last_units_are_partial_checks() {
    let npages = TOP + GROUP + CHUNK + 64;
    let (_mem, m) = map(npages);
    check_against(&m, &vec![true; npages as usize]).unwrap();
}

#[test]
fn a_fresh_map_is_one_free_run() {
    let (_mem, mut m) = map(TOP + 3 * GROUP);
    let mut runs = Vec::new();
    m.for_each_run(1000, 3000, |s, e| {
        runs.push((s, e));
        true
    });
    assert_eq!(runs, vec![(0, 6000)]);
    check_against(&m, &vec![true; (TOP + 3 * GROUP) as usize]).unwrap();
}

#[test]
fn the_sweep_finds_every_long_enough_run_as_a_plain_walk_does() {
    // Random ranges marked used and free over three groups and a part (the map's end is not
    // a whole group), swept at random limits and lengths, checked against a plain array.
    let npages = TOP + 2 * GROUP + 3 * CHUNK + 100;
    let (_mem, mut m) = map(npages);
    let mut free = vec![true; npages as usize];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = move |bound: u32| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % bound as u64) as u32
    };
    for step in 0..3000 {
        let len = [1, 7, 64, 200, 700, 5000, 40000][rand(7) as usize].min(npages);
        let pfn = rand(npages - len + 1);
        let used = rand(3) > 0;
        m.mark(pfn, len, used);
        free[pfn as usize..(pfn + len) as usize].fill(!used);
        if step % 50 == 0 {
            let limit = 1 + rand(npages);
            // Pages from the limit on are free, as past an arena's used part, but for a block
            // a worker holds isolated there at times.
            m.mark(limit - 1, npages - limit + 1, false);
            free[(limit - 1) as usize..].fill(true);
            if step % 100 == 0 && limit + 700 < npages {
                let at = limit + rand(600);
                m.mark(at, 64, true);
                free[at as usize..(at + 64) as usize].fill(false);
            }
            for n in [1, 2, 63, 64, 65, 511, 513, 3000, GROUP + 1, TOP + 1] {
                let mut got = Vec::new();
                m.for_each_run(limit, n, |s, e| {
                    got.push((s, e));
                    true
                });
                assert_eq!(got, naive(&free, limit, n), "step {step}, limit {limit}, n {n}");
            }
            check_against(&m, &free).unwrap();
            // A page marked used that the lists hold, or the other way: seen.
            let q = rand(npages) as usize;
            free[q] = !free[q];
            assert!(check_against(&m, &free).is_err(), "page {q} flipped");
            free[q] = !free[q];
        }
    }
}

#[test]
fn a_run_reaching_the_limit_ends_where_its_free_pages_end() {
    // Free from 100 on, the limit at 110; pages 130-139 held (a worker's isolated block past
    // the limit): the last run ends at 130, and one that would start at the limit is none.
    let (_mem, mut m) = map(4 * CHUNK);
    m.mark(0, 100, true);
    m.mark(130, 10, true);
    let mut got = Vec::new();
    m.for_each_run(110, 8, |s, e| {
        got.push((s, e));
        true
    });
    assert_eq!(got, vec![(100, 116)], "bounded at twice the request past its start");
    got.clear();
    m.for_each_run(110, 20, |s, e| {
        got.push((s, e));
        true
    });
    assert_eq!(got, vec![(100, 130)]);
    got.clear();
    m.for_each_run(110, 40, |s, e| {
        got.push((s, e));
        true
    });
    assert_eq!(got, vec![], "30 free pages do not hold 40");
    m.mark(0, 110, true);
    m.for_each_run(110, 1, |s, e| {
        got.push((s, e));
        true
    });
    assert_eq!(got, vec![], "a run starting at the limit");
}

#[test]
fn a_sweep_stops_when_told() {
    let (_mem, mut m) = map(GROUP);
    for p in (0..GROUP).step_by(100) {
        m.mark(p, 1, true);
    }
    let mut seen = 0;
    m.for_each_run(GROUP, 50, |_, _| {
        seen += 1;
        seen < 3
    });
    assert_eq!(seen, 3);
}
