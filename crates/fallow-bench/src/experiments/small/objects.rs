//! The small objects of the small-object shapes (and of burst): their sizes, and how a program
//! uses one. Every object comes from the C library's `malloc` and goes back by its `free` (in the
//! child, the peer's library: `experiments/preloaded.rs`).
//!
//! An object describes itself, so that whichever thread frees it can check it without a side
//! table: its first 8 bytes hold its length and the byte it was written with; then its bytes up to
//! the 16th, one byte of each further 4 KiB page and its last byte are that value (`write`).
//! `check` reads the header and the last byte: an object handed out twice while live, or
//! overwritten by the allocator, shows as a mismatch. Every size is at least `MIN` (the header).

use crate::measure::XorShift;
use crate::peers::PAGE;

/// The smallest object (its header).
pub const MIN: usize = 8;

/// churn's sizes, the shape of cfrac's and espresso's: 7 in 8 uniform in [16, 512] bytes, the
/// rest in [513, 4096].
pub fn churn_size(rng: &mut XorShift) -> usize {
    if rng.next().is_multiple_of(8) {
        rng.range(513, 4096)
    } else {
        rng.range(16, 512)
    }
}

/// server's sizes, larson's: uniform in [8, 1000] bytes.
pub fn server_size(rng: &mut XorShift) -> usize {
    rng.range(MIN, 1000)
}

/// queue's size, xmalloc-test's.
pub const QUEUE_SIZE: usize = 64;

/// random's sizes, rptest's small shape: uniform in [16, 16 KiB].
pub fn random_size(rng: &mut XorShift) -> usize {
    rng.range(16, 16 << 10)
}

/// `malloc(len)`, or an error naming the size.
pub fn alloc(len: usize) -> Result<*mut u8, String> {
    // SAFETY: `malloc` takes any size; null on failure, checked below.
    let p = unsafe { libc::malloc(len) } as *mut u8;
    if p.is_null() {
        Err(format!("malloc({len}) failed"))
    } else {
        Ok(p)
    }
}

/// `malloc(len)` and `write(.., value)`.
pub fn new(len: usize, value: u8) -> Result<*mut u8, String> {
    let p = alloc(len)?;
    // SAFETY: `p` is a fresh live object of `len` bytes from `malloc`, this thread's alone.
    unsafe { write(p, len, value) };
    Ok(p)
}

/// Write an object as a program starts to use it (see the top of the file).
///
/// # Safety
/// `p` is a live object of `len >= MIN` bytes that nobody else accesses meanwhile.
pub unsafe fn write(p: *mut u8, len: usize, value: u8) {
    debug_assert!(len >= MIN);
    let header = len as u64 | (value as u64) << 56;
    // SAFETY: `len >= MIN` = 8 bytes are writable at `p` (the contract above); unaligned store.
    unsafe { p.cast::<u64>().write_unaligned(header) };
    let mut off = MIN;
    while off < len.min(16) {
        // SAFETY: `off < len`, inside the object.
        unsafe { p.add(off).write_volatile(value) };
        off += 1;
    }
    let mut off = PAGE;
    while off < len {
        // SAFETY: `off < len`, inside the object.
        unsafe { p.add(off).write_volatile(value) };
        off += PAGE;
    }
    if len > MIN {
        // SAFETY: `len - 1 < len`, inside the object.
        unsafe { p.add(len - 1).write_volatile(value) };
    }
}

/// An object's length and value as `write` left them, or what is wrong.
///
/// # Safety
/// `p` is a live object written by `write`, not written meanwhile by anyone else.
pub unsafe fn check(p: *mut u8) -> Result<(usize, u8), String> {
    // SAFETY: the object is at least `MIN` bytes (the contract above).
    let header = unsafe { p.cast::<u64>().read_unaligned() };
    let (len, value) = ((header & ((1 << 56) - 1)) as usize, (header >> 56) as u8);
    if !(MIN..=1 << 40).contains(&len) {
        return Err(format!("an object at {p:?} has a bad header {header:#x}"));
    }
    if len > MIN {
        // SAFETY: `len - 1` is inside the object, whose length its header gives.
        let last = unsafe { p.add(len - 1).read_volatile() };
        if last != value {
            return Err(format!("an object of {len} bytes ends in {last}, not {value}"));
        }
    }
    Ok((len, value))
}

/// `check`, then `free`.
///
/// # Safety
/// `p` is a live object from `malloc` written by `write`, freed once here and not used after.
pub unsafe fn release(p: *mut u8) -> Result<(usize, u8), String> {
    // SAFETY: the contract above.
    let got = unsafe { check(p) };
    // SAFETY: `p` came from `malloc` and is freed once (the contract above).
    unsafe { libc::free(p as *mut libc::c_void) };
    got
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_stay_in_their_ranges() {
        let mut rng = XorShift::new(3);
        let churn: Vec<usize> = (0..80_000).map(|_| churn_size(&mut rng)).collect();
        assert!(churn.iter().all(|n| (16..=4096).contains(n)));
        let big = churn.iter().filter(|&&n| n > 512).count();
        assert!((8_000..12_000).contains(&big), "{big} of 80000 above 512");
        assert!((0..10_000).map(|_| server_size(&mut rng)).all(|n| (8..=1000).contains(&n)));
        assert!((0..10_000).map(|_| random_size(&mut rng)).all(|n| (16..=16384).contains(&n)));
    }

    #[test]
    fn an_object_written_checks_and_a_changed_one_does_not() {
        for len in [8, 9, 16, 17, 4096, 4097, 9000] {
            let p = new(len, 0xa5).unwrap();
            // SAFETY: `p` is this test's live object of `len` bytes, written by `new`.
            assert_eq!(unsafe { check(p) }, Ok((len, 0xa5)));
            if len > MIN {
                // SAFETY: as above; `len - 1` is inside the object.
                unsafe { p.add(len - 1).write(1) };
            }
            // SAFETY: as above, freed once.
            let got = unsafe { release(p) };
            assert_eq!(got.is_err(), len > MIN, "{len}: {got:?}");
        }
    }
}
