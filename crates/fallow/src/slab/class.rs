//! Size classes of small objects: which class a request falls in, each class's object size, and
//! the span (a power-of-two block of pages) its objects are cut from.
//!
//! 16-byte steps up to 128 bytes, then four classes per doubling (160, 192, 224, 256, 320, ...)
//! up to `SMALL_MAX` (16 KiB): 36 classes, a request wasting at most 25% of its object (129 bytes
//! in 160) and 12.5-20% above 256 bytes, as jemalloc's and mimalloc's classes. Spans are 64 KiB
//! for objects up to 4 KiB and 256 KiB above, so that a span's tail past its last whole object
//! is at most 2.3% of it (a 2,560-byte class: 25 objects and 1,536 bytes). One 64 KiB size for
//! every class (4 objects of 14 KiB a span) held 15% fewer span bytes at the peak of
//! `examples/slab_cross.rs`, where a 64 KiB block one class gave back served no 256 KiB span,
//! but halved `fallow bench small`'s random shape (sizes up to 16 KiB in two threads: 2.1-2.4x
//! glibc's operations per CPU-second against 4.1x) for no change in the benchmarks' max RSS.
//! Every class size is a multiple of 16, and a power-of-two class size (16 to 16 KiB) divides its
//! span's size: an object of such a class is aligned to its size, which serves aligned requests
//! (`aligned_class`).

/// The largest small object; larger requests are page blocks.
pub(crate) const SMALL_MAX: usize = 16 << 10;
/// The alignment every small object has.
pub(crate) const MIN_ALIGN: usize = 16;
/// Number of size classes.
pub(crate) const CLASSES: usize = 36;
/// The page map has one entry per `1 << GRANULE_SHIFT` bytes (64 KiB, the smallest span).
pub(crate) const GRANULE_SHIFT: u32 = 16;
/// The largest span, in bytes.
pub(crate) const SPAN_MAX: usize = 256 << 10;

/// The object size of class `c`.
pub(crate) const fn class_size(c: usize) -> usize {
    if c < 8 {
        (c + 1) * 16
    } else {
        let base = 128 << ((c - 8) / 4);
        base + ((c - 8) % 4 + 1) * (base / 4)
    }
}

/// The span size of class `c`, in bytes (a power of two, at least one granule).
pub(crate) const fn span_bytes(c: usize) -> usize {
    if class_size(c) <= 4096 {
        1 << GRANULE_SHIFT
    } else {
        SPAN_MAX
    }
}

/// `CLASS_OF[(size + 15) / 16]` is the class of a request of `size` bytes (1..=SMALL_MAX).
static CLASS_OF: [u8; SMALL_MAX / 16 + 1] = {
    let mut t = [0u8; SMALL_MAX / 16 + 1];
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
/// `size <= SMALL_MAX` (the table is read without a bounds check: the hot path has tested it).
#[inline(always)]
pub(crate) unsafe fn class_of(size: usize) -> usize {
    debug_assert!(size <= SMALL_MAX);
    // SAFETY: `size <= SMALL_MAX` (the caller's contract), so the index is at most
    // `SMALL_MAX / 16`, the table's last.
    unsafe { *CLASS_OF.get_unchecked((size + 15) >> 4) as usize }
}

/// The class that serves `size` bytes aligned to `align` (a power of two above `MIN_ALIGN`):
/// the power-of-two class of at least both, whose objects are aligned to their size; `None`
/// when that is above `SMALL_MAX`.
pub(crate) fn aligned_class(size: usize, align: usize) -> Option<usize> {
    let s = size.max(align).checked_next_power_of_two()?;
    // SAFETY: `s <= SMALL_MAX`, tested first.
    (s <= SMALL_MAX).then(|| unsafe { class_of(s) })
}

/// `ceil(2^32 / size)`: `(off * recip) >> 32` is `off / size` for every offset in a span
/// (`off * size <= 2^32`: offsets below 64 KiB for objects up to 4 KiB, below 256 KiB up to 16 KiB), one multiplication instead
/// of a division on `free`'s path.
pub(crate) const fn reciprocal(size: usize) -> u64 {
    (1u64 << 32).div_ceil(size as u64)
}

/// Whether offset `off` in a span is at an object's start, with `recip` the class's
/// `reciprocal`: `off * recip` is `idx * 2^32 + idx * e + r * recip` for `off = idx * size + r`
/// and `e = recip * size - 2^32 < size`; `idx * e < span <= 2^32 / size <= recip` (the bound
/// below), so its low 32 bits are below `recip` exactly when `r` is 0. One multiplication and a
/// compare on `free`'s path, no division and no load of the size.
#[inline(always)]
pub(crate) fn at_object(off: usize, recip: u64) -> bool {
    ((off as u64).wrapping_mul(recip) as u32) < recip as u32
}

const _: () = {
    assert!(class_size(CLASSES - 1) == SMALL_MAX);
    assert!(span_bytes(CLASSES - 1) == SPAN_MAX);
    let mut c = 0;
    while c < CLASSES {
        assert!(class_size(c).is_multiple_of(MIN_ALIGN));
        assert!((span_bytes(c) as u64) * (class_size(c) as u64) <= 1u64 << 32);
        c += 1;
    }
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::PAGE_SIZE;

    #[test]
    fn classes_bound_the_waste_and_the_span_tails() {
        for size in 1..=SMALL_MAX {
            // SAFETY: `size <= SMALL_MAX`.
            let c = unsafe { class_of(size) };
            assert!(class_size(c) >= size && (c == 0 || class_size(c - 1) < size), "size {size}");
            // At most 25% of the object is waste (16 bytes below 64).
            assert!(class_size(c) - size <= (class_size(c) / 4).max(15), "size {size} class {}", class_size(c));
        }
        for c in 0..CLASSES {
            let (s, span) = (class_size(c), span_bytes(c));
            // Up to 4 KiB at most 2.3% of the span; above, whole pages (never written), at most
            // an eighth.
            let tail = span % s;
            assert!(tail <= span * 3 / 128 || (s > 4096 && tail.is_multiple_of(PAGE_SIZE) && tail <= span / 8), "class {s}: tail {tail} of {span}");
            let r = reciprocal(s);
            for off in (0..span).step_by(16) {
                assert_eq!(((off as u64 * r) >> 32) as usize, off / s, "class {s} offset {off}");
            }
            for off in 0..span {
                assert_eq!(at_object(off, r), off % s == 0, "class {s} offset {off}");
            }
        }
    }

    #[test]
    fn aligned_classes_are_powers_of_two_that_divide_their_span() {
        assert_eq!(class_size(aligned_class(100, 64).unwrap()), 128);
        assert_eq!(class_size(aligned_class(10, 4096).unwrap()), 4096);
        assert_eq!(aligned_class(10, 32 << 10), None);
        for c in 0..CLASSES {
            let s = class_size(c);
            if s.is_power_of_two() {
                assert_eq!(span_bytes(c) % s, 0);
            }
        }
    }
}
