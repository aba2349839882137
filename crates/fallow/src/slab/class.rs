//! Size classes of small objects: which class a request falls in, each class's object size, and
//! the span (a power-of-two block of pages) its objects are cut from.
//!
//! 16-byte steps up to 128 bytes, then four classes per doubling (160, 192, 224, 256, 320, ...)
//! up to `TABLE_MAX` (16 KiB), eight per doubling up to `SMALL_MAX` (18, 20, 22 KiB, ..., 32 KiB
//! in 2 KiB steps, 36, 40, 44 KiB, ..., 64 KiB in 4 KiB steps, `SMALL_MAX`): 52 classes. A
//! request wastes at most 25% of its object (129 bytes in 160), 12.5-20% above 256 bytes, as
//! jemalloc's and mimalloc's classes, and less than an eighth in 16-64 KiB (16 KiB + 1 in 18
//! KiB), where a uniformly random request is rounded up by about 4.2% on average rather than
//! 8.3%. Larger requests are page blocks at their real size (below).
//!
//! Spans are 64 KiB for objects up to 4 KiB, 128 KiB up to 16 KiB and 256 KiB above, so that a
//! span's tail past its last whole object is at most 2.3% of it up to 4 KiB (a 2,560-byte
//! class: 25 objects and 1,536 bytes), at most 6.25% up to 16 KiB (12 objects of 10 KiB) and at
//! most an eighth above (4 objects of 56 KiB, 224 KiB), but
//! for 44 and 52 KiB (5 objects of 44 KiB, 220 KiB; 4 of 52 KiB, 208 KiB: 14% and 19%); in
//! 16-64 KiB not always whole pages (9 objects of 26 KiB and 22 KiB). Nothing writes past the
//! last object's end: the tail's pages past the one that object ends in hold memory only when
//! the page layer handed the span out dirty. 512 KiB spans for 44 and 52 KiB (tails of 28 and 44
//! KiB, within an eighth) held as much or 1-2 MiB more on every shape of blocks of 16-256 KiB
//! replaced at random that was measured (docs/measurements.md): as much where those classes
//! alone were live, more in mixes, where one span size for every class of 4-64 KiB lets a span
//! one class gave back serve the next span of any other. Every span is trimmed by pages (a
//! span's given-back pages are one bit each of a word: `SPAN_MAX` is at most 64 pages).
//!
//! One 64 KiB size for every class up to 16 KiB (4 objects of 14 KiB a span) held 15% fewer
//! span bytes at the peak of `examples/slab_cross.rs`, where a 64 KiB block one class gave back
//! served no 256 KiB span, but halved `fallow bench small`'s random shape (sizes up to 16 KiB in
//! two threads: 2.1-2.4x glibc's operations per CPU-second against 4.1x) for no change in the
//! benchmarks' max RSS. 128 KiB for 4-16 KiB (256 KiB before), once spans gave back their
//! never-used tails (tail.rs): mimalloc-bench's rptest without its cross-thread frees, whose
//! two threads keep 25 or so objects in each of about 40 classes, held 9.9-10.1 MB against
//! 11.0-11.2 (mimalloc 9.3), each class and thread keeping part of a span it does not use; the
//! random shape lost a quarter of its operations per CPU-second in one comparison of 5 rounds
//! (25.4 -> 18.6 M) and nothing in two later rounds (23.2-27.7 -> 25.3-25.7 M; mimalloc 11-17
//! M, TCMalloc 26-38 M), and held less (15.4 -> 14.4 MiB; mimalloc 14.8).
//!
//! Every class size is a multiple of 16, and a power-of-two class size (16 bytes to 64 KiB)
//! divides its span's size: an object of such a class is aligned to its size, which serves
//! aligned requests up to 16 KiB (`aligned_class`).
//!
//! The classes above 16 KiB (`TABLE_MAX`) came later: as page blocks, requests of 16-256 KiB
//! took power-of-two blocks with slack from the page caches or exact runs from the locked path's
//! sampled search, and 12,800 live blocks of 16-64 KiB replaced at random held 893 MiB where
//! glibc held 515, 3,200 of 64-256 KiB 617 where glibc held 517; as objects of four classes per
//! doubling 565 and 570. Eight per doubling took 16-64 KiB to 549. Above 64 KiB they were
//! measured too and not kept: each class's count of a random mix varies, a class keeps the
//! spans its highest count filled until they empty, and with twice the classes the free objects
//! those high-water marks leave grow by about the square root of two, while the rounding saved
//! grows with the count. With 800 live blocks of 64-256 KiB eight held 159 MiB against four's
//! 151, with 3,200 as much (569, 570), less only with more objects a class (6,400: 1,101
//! against 1,126; 2,000 of 128-256 KiB: 422 against 429), and 176 and 208 KiB needed 2 MiB
//! spans. The hot path's table stops at 16 KiB, so that a thread heap with its copy fits in a
//! page; above it the class is computed on the slow path.
//!
//! Four classes of 80-256 KiB in 1 MiB spans served requests above 64 KiB until the page
//! layer found its free runs by a map (`arena/free_map/`): each class of each heap kept a
//! reservoir of free objects for that class alone (mstress: 17.5 MB against jemalloc's 13.8,
//! its 10 to 30 objects of 64-256 KiB an iteration and thread leaving two 1 MiB spans of the
//! 128 KiB class resident for one live object), where page blocks share one pool of free runs.
//! As page blocks, mstress holds 14.5 MB, and 3,200 live objects of 64-256 KiB replaced at
//! random 560 MiB against those classes' 571 (glibc 517; docs/measurements.md).

/// The largest small object (the last of the classes of eight per doubling above
/// `TABLE_MAX`); larger requests are page blocks.
pub(crate) const SMALL_MAX: usize = 64 << 10;
/// The largest request the class table covers (the hot path's); the classes above it, up to
/// `SMALL_MAX`, are found by arithmetic on the slow path (a table to `SMALL_MAX` would not fit
/// a thread heap's page).
pub(crate) const TABLE_MAX: usize = 16 << 10;
/// The alignment every small object has.
pub(crate) const MIN_ALIGN: usize = 16;
/// Number of size classes: the table's and 2 doublings of eight.
pub(crate) const CLASSES: usize = TABLE_CLASSES + 16;
/// The page map has one entry per `1 << GRANULE_SHIFT` bytes (64 KiB, the smallest span).
pub(crate) const GRANULE_SHIFT: u32 = 16;
/// The spans of objects above 4 KiB up to `TABLE_MAX`, in bytes.
pub(crate) const SPAN_MID: usize = 128 << 10;
/// The largest span, in bytes: the spans of objects above `TABLE_MAX`.
pub(crate) const SPAN_MAX: usize = 256 << 10;

/// Classes up to `TABLE_MAX` (the table's): 8 of 16-byte steps and 7 doublings of four.
pub(crate) const TABLE_CLASSES: usize = 36;

/// The object size of class `c`.
pub(crate) const fn class_size(c: usize) -> usize {
    if c < 8 {
        (c + 1) * 16
    } else if c < TABLE_CLASSES {
        stepped(128, 4, c - 8)
    } else {
        stepped(TABLE_MAX, 8, c - TABLE_CLASSES)
    }
}

/// The `i`-th size of a run of classes `per` per doubling above `start`: with `b` the power of
/// two `start << (i / per)`, `b` and `i % per + 1` of its `per`-ths.
const fn stepped(start: usize, per: usize, i: usize) -> usize {
    let base = start << (i / per);
    base + (i % per + 1) * (base / per)
}

/// The span size of class `c`, in bytes (a power of two, at least one granule): 64 KiB up to
/// 4 KiB, `SPAN_MID` (128 KiB) up to `TABLE_MAX` (16 KiB), `SPAN_MAX` (256 KiB) above.
pub(crate) const fn span_bytes(c: usize) -> usize {
    if class_size(c) <= 4096 {
        1 << GRANULE_SHIFT
    } else if class_size(c) <= TABLE_MAX {
        SPAN_MID
    } else {
        SPAN_MAX
    }
}

/// log2 of the pages of a span of `bytes` that one bit of its page states stands for
/// (`GranuleStates`: at most 64 granules): a page for every span (at most 64 pages), as the
/// page layer's interface for spans (`alloc_span_uncached`) allows larger ones.
pub(crate) const fn granule_shift(bytes: usize) -> u32 {
    (bytes >> crate::os::PAGE_SHIFT).trailing_zeros().saturating_sub(6)
}

/// Colours a span can take: its first object lies one to `COLOURS` cache lines past the span's
/// start, by class (`colour`).
pub(crate) const COLOURS: usize = 8;
/// A cache line.
const LINE: usize = 64;

/// How far past its span's start the first object of class `c` lies (its colour, as Linux's
/// SLAB colours its slabs). Every span starts on a page boundary (aligned to its size), so
/// without colours the first object of every class falls in the same sets of a set-indexed
/// cache (the address bits below the page are the L1's set index), and those first objects are
/// the hot ones: the owner pops the object it freed last first, and a class with few live
/// objects keeps reusing its span's first one. With a page-aligned word of the program's and of
/// the allocator's own in the same set, a program using eight or more classes at once loses
/// those lines on every reuse: cfrac under cachegrind (32 KiB 8-way L1) missed 15 times as often
/// as under mimalloc, all but a few of the misses in set 0, and as often as mimalloc with a
/// 16-way L1. A class's colour is `c % COLOURS + 1` lines, so the first objects of the classes
/// up to 512 bytes, eight consecutive ones at a time, lie in eight different sets, none in the
/// set of page-aligned words; above, where the bound below caps a colour or a power-of-two size
/// rounds it, two classes of eight may share a line, or lie in set 0.
///
/// What it costs: the span holds `colour / size` fewer objects, at most a 64th of them beyond
/// the tail past its last object (`span_bytes % size`), which takes part of the colour first;
/// a class whose 64th is no whole object and whose tail is less than a line stays uncoloured.
/// The colour is a multiple of the line and of a power-of-two class's size, so that every object
/// keeps `MIN_ALIGN` and such a class its alignment (`aligned_class`).
pub(crate) const fn colour(c: usize) -> usize {
    let (size, span) = (class_size(c), span_bytes(c));
    let step = if size.is_power_of_two() && size > LINE { size } else { LINE };
    let want = (c % COLOURS + 1) * LINE;
    let want = want.div_ceil(step) * step;
    let budget = span % size + span / size / 64 * size;
    let most = budget / step * step;
    if want < most {
        want
    } else {
        most
    }
}

/// How many objects a span of the class of a request of `size` bytes (1 to `SMALL_MAX`) holds:
/// its bytes past the class's colour, in whole objects. For tests and tools (the class is found
/// by a walk, in a constant expression if need be).
pub const fn objects_per_span(size: usize) -> usize {
    let mut c = 0;
    while class_size(c) < size {
        c += 1;
    }
    (span_bytes(c) - colour(c)) / class_size(c)
}

/// Entries of `CLASS_TABLE`: one per 16 bytes of request, 0 to `TABLE_MAX`.
pub(crate) const SIZE_SLOTS: usize = TABLE_MAX / 16 + 1;

/// `CLASS_TABLE[(size + 15) / 16]` is the class of a request of `size` bytes (1..=TABLE_MAX).
/// Every thread heap has a copy (`ThreadHeap::class_of`), which the hot path of `malloc` reads
/// beside the heap's heads: in a shared object a static's address is one more load (its GOT
/// word).
pub(crate) const CLASS_TABLE: [u8; SIZE_SLOTS] = {
    let mut t = [0u8; SIZE_SLOTS];
    let mut i = 0;
    let mut c = 0;
    while i < t.len() {
        while class_size(c) < i * 16 {
            c += 1;
        }
        t[i] = c as u8;
        i += 1;
    }
    t
};

/// `CLASS_TABLE` for the slow paths.
static CLASS_OF: [u8; SIZE_SLOTS] = CLASS_TABLE;

/// `class_size` of every class, for the hot path (a load rather than `class_size`'s branches).
static OBJECT_SIZE: [u32; CLASSES] = {
    let mut t = [0u32; CLASSES];
    let mut c = 0;
    while c < CLASSES {
        t[c] = class_size(c) as u32;
        c += 1;
    }
    t
};

/// `class_size(c)` from a table.
///
/// # Safety
/// `c < CLASSES` (read without a bounds check).
#[inline(always)]
pub(crate) unsafe fn object_size(c: usize) -> usize {
    debug_assert!(c < CLASSES);
    // SAFETY: `c < CLASSES` (the caller's contract), the table's length.
    unsafe { *OBJECT_SIZE.get_unchecked(c) as usize }
}

/// The class of a request of `size` bytes (0 is the smallest class's).
///
/// # Safety
/// `size <= SMALL_MAX` (the table is read without a bounds check up to `TABLE_MAX`).
#[inline(always)]
pub(crate) unsafe fn class_of(size: usize) -> usize {
    debug_assert!(size <= SMALL_MAX);
    if size > TABLE_MAX {
        return large_class_of(size);
    }
    // SAFETY: `size <= TABLE_MAX`, tested above, so the index is at most `TABLE_MAX / 16`,
    // the table's last.
    unsafe { *CLASS_OF.get_unchecked((size + 15) >> 4) as usize }
}

/// The class of a request of `TABLE_MAX + 1..=SMALL_MAX` bytes: with `b` the power of two
/// below it, the `k`-th of the eight classes of `(b, 2b]` (`b + k * b / 8`), as `class_size`
/// numbers them.
#[cold]
fn large_class_of(size: usize) -> usize {
    let b = 1usize << (usize::BITS - 1 - (size - 1).leading_zeros());
    let k = (size - b).div_ceil(b / 8);
    TABLE_CLASSES + 8 * (b.trailing_zeros() - TABLE_MAX.trailing_zeros()) as usize + k - 1
}

/// The class that serves `size` bytes aligned to `align` (a power of two above `MIN_ALIGN`):
/// the power-of-two class of at least both, whose objects are aligned to their size; `None`
/// when that is above `TABLE_MAX` (16 KiB). Above it a page block serves better: it is
/// page-aligned and wastes less than a page, where a power-of-two class of 32-64 KiB would
/// waste up to half (40 KiB aligned to 64 bytes, or 100 bytes aligned to 64 KiB).
pub(crate) fn aligned_class(size: usize, align: usize) -> Option<usize> {
    let s = size.max(align).checked_next_power_of_two()?;
    // SAFETY: `s <= TABLE_MAX <= SMALL_MAX`, tested first.
    (s <= TABLE_MAX).then(|| unsafe { class_of(s) })
}

/// `(inv, shift)` for a class size: `size = 2^shift * odd`, `inv * odd = 1` modulo 2^64 (the
/// odd factor's inverse, by Newton's iteration: each step doubles the bits that are right, and
/// an odd number is its own inverse modulo 8).
pub(crate) const fn divider(size: usize) -> (u64, u32) {
    let shift = size.trailing_zeros();
    let odd = (size >> shift) as u64;
    let mut inv = odd;
    let mut i = 0;
    while i < 5 {
        inv = inv.wrapping_mul(2u64.wrapping_sub(odd.wrapping_mul(inv)));
        i += 1;
    }
    (inv, shift)
}

/// The index of the object that starts at offset `off` of a span, with `(inv, shift)` its
/// class's `divider`; for an offset that is not an object's start, a number of at least
/// `2^64 / size`, above every index (the divisibility test by a modular inverse, as compilers
/// test `x % d == 0`). For `off = idx * size`, `off * inv = idx * 2^shift` modulo 2^64, which
/// the rotation turns into `idx`. Otherwise: if `off` is not a multiple of `2^shift`, neither
/// is the product (`inv` is odd), and the rotation moves its low set bits to the top (the
/// result is at least `2^(64 - shift)`); if it is, `off = m * 2^shift` with `odd` not dividing
/// `m`, and the result `y` has `y * odd = m` modulo `2^(64 - shift)`, which for `y` below
/// `2^(64 - shift) / odd` would hold without the modulo, and `odd` would divide `m`. So one
/// compare of the result against the index of the first never-handed-out object (`fresh`)
/// tells both that `off` is an object's start and that the object was handed out: one
/// multiplication, a rotation and a compare on `free`'s path, no division. Exact for every
/// `off` (wrapped differences included).
#[inline(always)]
pub(crate) fn object_index(off: usize, inv: u64, shift: u32) -> u64 {
    (off as u64).wrapping_mul(inv).rotate_right(shift)
}

const _: () = {
    assert!(class_size(TABLE_CLASSES - 1) == TABLE_MAX);
    assert!(class_size(CLASSES - 1) == SMALL_MAX);
    // A span's pages given back by a trim are one bit each of a word (`Span::given`), and one
    // bit of its page states stands for one page (`granule_shift` is 0): every span is trimmed.
    assert!(SPAN_MAX / crate::os::PAGE_SIZE <= u64::BITS as usize && granule_shift(SPAN_MAX) == 0);
    assert!(span_bytes(CLASSES - 1) == SPAN_MAX);
    let mut c = 0;
    while c < CLASSES {
        assert!(class_size(c).is_multiple_of(MIN_ALIGN));
        // Spans are aligned to their size (a power-of-two class's objects to theirs); the
        // objects of a span are one bit each of a 4,096-bit map on the stack (trim.rs, check.rs).
        assert!(span_bytes(c).is_power_of_two() && span_bytes(c) >= 1 << GRANULE_SHIFT);
        assert!(span_bytes(c) / class_size(c) <= 4096);
        c += 1;
    }
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_bound_the_waste_and_the_span_tails() {
        for size in 1..=SMALL_MAX {
            // SAFETY: `size <= SMALL_MAX`.
            let c = unsafe { class_of(size) };
            let (s, waste) = (class_size(c), class_size(c) - size);
            assert!(s >= size && (c == 0 || class_size(c - 1) < size), "size {size}");
            // At most 25% of the object is waste (16 bytes below 64); in (16 KiB, 64 KiB], less
            // than an eighth (eight classes per doubling: four would waste up to a fifth, 16 KiB
            // + 1 in 20 KiB).
            assert!(waste <= (s / 4).max(15), "size {size} class {s}");
            assert!(size <= TABLE_MAX || waste < s / 8, "size {size} class {s}");
        }
        // Above 16 KiB: 2 KiB steps to 32 KiB and 4 KiB steps to 64 KiB, the last.
        let above: Vec<usize> = (TABLE_CLASSES..CLASSES).map(|c| class_size(c) >> 10).collect();
        let fine: Vec<usize> = (18..=32).step_by(2).chain((36..=64).step_by(4)).collect();
        assert_eq!(above, fine);
        assert_eq!(class_size(CLASSES - 1), SMALL_MAX);
        let mut wide_tails = Vec::new();
        for c in 0..CLASSES {
            let (s, span) = (class_size(c), span_bytes(c));
            // Up to 4 KiB at most 2.3% of the span; above (never written past the last object's
            // end, not always whole pages: 22 KiB past 9 objects of 26 KiB), at most 3/16 (48
            // KiB past 4 objects of 52 KiB), an eighth but for 44 and 52 KiB.
            let tail = span % s;
            assert!(tail <= span * 3 / 128 || (s > 4096 && tail <= span * 3 / 16), "class {s}: tail {tail} of {span}");
            if tail > span / 8 {
                wide_tails.push(s >> 10);
            }
            let (inv, shift) = divider(s);
            assert_eq!((inv.wrapping_mul((s >> shift) as u64), s >> shift & 1), (1, 1), "class {s}");
            // Every offset in the span and around it, and wrapped ones (a pointer below the
            // span's start): an object's index for an object's start, above any index else.
            let bound = (span / s) as u64;
            let offs = (0..span + 2 * s).chain((1..4 * s).map(|k| 0usize.wrapping_sub(k)));
            for off in offs {
                let i = object_index(off, inv, shift);
                if off.is_multiple_of(s) && off < span + 2 * s {
                    assert_eq!(i, (off / s) as u64, "class {s} offset {off}");
                } else {
                    assert!(i > bound, "class {s} offset {off:#x}: {i}");
                }
            }
        }
        assert_eq!(wide_tails, [44, 52]);
    }

    #[test]
    fn colours_spread_the_first_objects_and_keep_alignment() {
        let line_of_first = |c: usize| colour(c) / LINE;
        for c in 0..CLASSES {
            let (s, span, k) = (class_size(c), span_bytes(c), colour(c));
            assert!(k.is_multiple_of(LINE) && k < span, "class {s}: colour {k}");
            if s.is_power_of_two() {
                assert!(k.is_multiple_of(s), "class {s}: colour {k} breaks its alignment");
            }
            // At most a 64th of the objects lost (none where the tail takes the colour).
            let (n, kept) = (span / s, (span - k) / s);
            assert!(n - kept <= n / 64, "class {s}: {kept} of {n} objects kept");
        }
        // The classes of up to 128 bytes (16-byte steps) each start in a set of their own, none
        // in that of page-aligned words (a colour of at least a line).
        let lines: Vec<usize> = (0..8).map(line_of_first).collect();
        assert_eq!(lines, [1, 2, 3, 4, 5, 6, 7, 8]);
        // So do the next eight (160-512 B).
        let lines: Vec<usize> = (8..16).map(line_of_first).collect();
        assert_eq!(lines, [1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn aligned_classes_are_powers_of_two_that_divide_their_span() {
        assert_eq!(class_size(aligned_class(100, 64).unwrap()), 128);
        assert_eq!(class_size(aligned_class(10, 4096).unwrap()), 4096);
        assert_eq!(class_size(aligned_class(10, 16 << 10).unwrap()), 16 << 10);
        assert_eq!(aligned_class(10, 32 << 10), None);
        assert_eq!(aligned_class(20 << 10, 64), None);
        for c in 0..CLASSES {
            let s = class_size(c);
            if s.is_power_of_two() {
                assert_eq!(span_bytes(c) % s, 0);
            }
        }
    }
}
