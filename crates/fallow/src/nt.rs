//! Zeroing memory without evicting the caller's cache: non-temporal stores (`movntdq` through
//! `_mm_stream_si128`, then one `sfence`) on x86-64 for large ranges, plain `write_bytes`
//! (`rep stosb` / vector stores through the cache) for small ones and on other targets.
//!
//! Ranges from `THRESHOLD` (256 KiB) up stream: the zeroing worker's chunks (2 MiB) always do, as
//! the design rules ask. `calibrate` times both methods for sizes from 64 KiB to 4 MiB and keeps
//! the smallest size from which streaming wins (64 KiB on the development machine, so 256 KiB is
//! on the right side of it). It is a measurement (`examples/reclaim_measure.rs`), not run at
//! start-up: it costs 32 MiB of scratch memory and 50-100 ms of CPU, which every process using
//! fallow would pay (a guest of the density experiment, in a 30 MiB memory cgroup, was killed
//! for it before it started).
//!
//! Ordering: streaming stores are weakly ordered; `zero` ends with `sfence`, so that the zeros are
//! visible to any thread that later acquires the allocator lock (which the zeroing worker takes
//! before it marks the pages `Zeroed`).

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::os;

static THRESHOLD: AtomicUsize = AtomicUsize::new(256 << 10);
static CALIBRATED: AtomicBool = AtomicBool::new(false);

/// Smallest length zeroed with streaming stores (`usize::MAX`: never).
pub fn threshold() -> usize {
    THRESHOLD.load(Ordering::Relaxed)
}

/// Zero `[addr, addr + len)` with the faster method for this length.
///
/// # Safety
/// The range is writable memory that nobody else accesses meanwhile.
pub unsafe fn zero(addr: usize, len: usize) {
    if len >= threshold() {
        // SAFETY: the caller's range, under the same contract.
        unsafe { zero_streaming(addr, len) }
    } else {
        // SAFETY: the caller's range, under the same contract.
        unsafe { zero_cached(addr, len) }
    }
}

/// # Safety
/// As `zero`.
pub unsafe fn zero_cached(addr: usize, len: usize) {
    // SAFETY: the caller's range is writable and nobody else accesses it (the contract of `zero`).
    unsafe { core::ptr::write_bytes(addr as *mut u8, 0, len) };
}

/// # Safety
/// As `zero`.
#[cfg(target_arch = "x86_64")]
pub unsafe fn zero_streaming(addr: usize, len: usize) {
    use core::arch::x86_64::{__m128i, _mm_setzero_si128, _mm_sfence, _mm_stream_si128};
    let start = (addr + 15) & !15;
    let end = (addr + len) & !15;
    if start >= end {
        // SAFETY: the caller's whole range, under the same contract.
        return unsafe { zero_cached(addr, len) };
    }
    // SAFETY: `[addr, start)` is the head of the caller's range (`start < end <= addr + len`).
    unsafe { zero_cached(addr, start - addr) };
    // SAFETY: SSE2 is part of the x86-64 baseline: every x86-64 CPU has the instruction.
    let z = unsafe { _mm_setzero_si128() };
    let mut p = start;
    while p + 64 <= end {
        // SAFETY: `[p, p + 64)` lies in `[start, end)`, inside the caller's writable, unshared range;
        // `p` is 16-aligned (`start` is, and `p` moves by 64), as `movntdq` requires; SSE2 is baseline.
        unsafe {
            _mm_stream_si128(p as *mut __m128i, z);
            _mm_stream_si128((p + 16) as *mut __m128i, z);
            _mm_stream_si128((p + 32) as *mut __m128i, z);
            _mm_stream_si128((p + 48) as *mut __m128i, z);
        }
        p += 64;
    }
    while p < end {
        // SAFETY: `[p, p + 16)` lies in `[start, end)` (`end` is 16-aligned too), inside the caller's
        // range; `p` is 16-aligned; SSE2 is baseline.
        unsafe { _mm_stream_si128(p as *mut __m128i, z) };
        p += 16;
    }
    // SAFETY: SSE2 is baseline on x86-64; the fence has no memory-safety precondition.
    unsafe { _mm_sfence() };
    // SAFETY: `[end, addr + len)` is the tail of the caller's range (`end <= addr + len`).
    unsafe { zero_cached(end, addr + len - end) };
}

/// # Safety
/// As `zero`.
#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn zero_streaming(addr: usize, len: usize) {
    // SAFETY: the caller's range, under the same contract.
    unsafe { zero_cached(addr, len) }
}

/// Time both methods once per process and set `THRESHOLD` (a measurement: see the top). Costs
/// some 50-100 ms of CPU and 32 MiB of scratch memory, given back. The buffer
/// is larger than a last-level cache and is walked in order, so that, like the free memory the
/// worker zeroes, it is cold when zeroed.
pub fn calibrate() {
    if CALIBRATED.swap(true, Ordering::AcqRel) || !cfg!(target_arch = "x86_64") {
        return;
    }
    const BUF: usize = 32 << 20;
    let Ok(buf) = os::scratch(BUF) else { return };
    // SAFETY: `buf` is a private scratch mapping of `BUF` bytes that only this function uses.
    unsafe { zero_cached(buf, BUF) }; // fault it in
    let time = |f: unsafe fn(usize, usize), size: usize| {
        let reps = (BUF / size).max(1);
        let mut best = u64::MAX;
        for _ in 0..3 {
            let t0 = os::now_ns();
            for i in 0..reps {
                // SAFETY: `i * size + size <= BUF`: inside the private scratch mapping.
                unsafe { f(buf + i * size, size) };
            }
            best = best.min(os::now_ns() - t0);
        }
        best
    };
    let mut chosen = usize::MAX;
    let mut size = 64 << 10;
    while size <= 4 << 20 {
        let cached = time(zero_cached, size);
        let streaming = time(zero_streaming, size);
        if streaming <= cached {
            if chosen == usize::MAX {
                chosen = size;
            }
        } else {
            chosen = usize::MAX; // streaming must win from here up
        }
        size *= 4;
    }
    THRESHOLD.store(chosen, Ordering::Relaxed);
    // SAFETY: the scratch mapping made above, used no more.
    unsafe { os::unmap(buf, BUF) };
}
