//! The page state bytes of an arena (`States`): one byte per page, accessed as relaxed byte
//! atomics, and runs of them stored and counted without one instruction per byte where the
//! target allows (`bytewise`).

use core::sync::atomic::{AtomicU8, Ordering};

use crate::page::{GranuleStates, PageState, StateCounts};

/// The state bytes of an arena's pages. Every access is, for the memory model, a relaxed
/// `AtomicU8` load or store of each byte it touches, never a plain access nor a wider atomic: a
/// racing double `free` (a program's fault, but `free` is safe) can leave a thread writing the
/// bytes of a block that meanwhile went elsewhere, so any access may race with any other, and
/// only same-size atomic accesses may race without undefined behaviour (docs/design.md, "Access
/// rules"). Runs of bytes are stored and counted through `bytewise`, whose wide instructions
/// are byte-atomic. Every access is bounds-checked against the arena's page count.
#[derive(Clone, Copy)]
pub struct States {
    p: *const AtomicU8,
    npages: u32,
}

// SAFETY: `States` is a pointer to an arena's array of `AtomicU8`s, and every access through it
// is an atomic byte load or store.
unsafe impl Send for States {}
// SAFETY: as `Send`: shared access is to atomics.
unsafe impl Sync for States {}

impl States {
    /// # Safety
    /// `p` is the state array of an arena of `npages` pages (`States::raw`) that outlives every
    /// use of the result.
    pub unsafe fn from_raw(p: *const AtomicU8, npages: u32) -> States {
        States { p, npages }
    }

    pub fn raw(self) -> *const AtomicU8 {
        self.p
    }

    /// Panics unless `[pfn, pfn + n)` is inside the arena.
    #[inline(always)]
    fn check(self, pfn: u32, n: u32) {
        assert!(pfn as u64 + n as u64 <= self.npages as u64, "pages {pfn}+{n} outside an arena of {} pages", self.npages);
    }

    #[inline]
    pub fn get(self, pfn: u32) -> PageState {
        self.check(pfn, 1);
        // SAFETY: `pfn < npages` (checked), so the byte is inside the state array; the load is atomic.
        PageState::from_byte(unsafe { (*self.p.add(pfn as usize)).load(Ordering::Relaxed) })
    }

    #[inline]
    pub fn set(self, pfn: u32, s: PageState) {
        self.check(pfn, 1);
        // SAFETY: as in `get`: `pfn` is inside the state array; the store is atomic.
        unsafe { (*self.p.add(pfn as usize)).store(s as u8, Ordering::Relaxed) }
    }

    /// Set the state of every page of `[pfn, pfn + n)`: for the memory model one relaxed byte
    /// store per page (`bytewise::store`).
    #[inline(always)]
    pub fn fill(self, pfn: u32, n: u32, s: PageState) {
        self.check(pfn, n);
        if n == 1 {
            return self.set(pfn, s);
        }
        // SAFETY: `[pfn, pfn + n)` is inside the state array (checked).
        unsafe { bytewise::store(self.p.add(pfn as usize), n, s as u8) }
    }

    /// Count the free states of `[pfn, pfn + n)`: eight state bytes at a time (`bytewise::load8`,
    /// eight relaxed byte loads), with shortcuts for eight `Dirty` pages (the common case: a
    /// block freed by a program) and eight `Reported` or `Zeroed` ones (the untouched slack of a
    /// block served with slack, counted at each hand-out and free).
    pub fn count(self, pfn: u32, n: u32) -> StateCounts {
        self.check(pfn, n);
        const ONES: u64 = 0x0101_0101_0101_0101;
        // The number of zero bytes of `v`, whose bytes are all below 0x80 (only states, 0..=4,
        // are ever stored): adding 0x7f to a byte sets its top bit exactly when the byte is not
        // zero, and carries nothing into the next byte; the top bits, moved down to ones and
        // multiplied by `ONES`, sum up in the top byte (no `popcnt`, which the baseline x86-64
        // target lacks: `count_ones` was a dozen instructions, three times a word).
        let zero_bytes = |v: u64| 8 - ((((v + 0x7f * ONES) & (0x80 * ONES)) >> 7).wrapping_mul(ONES) >> 56) as u32;
        let (mut z, mut r, mut l) = (0u32, 0u32, 0u32);
        // SAFETY: `[pfn, pfn + n)` is inside the state array (checked).
        let base = unsafe { self.p.add(pfn as usize) };
        let words = n / 8;
        for i in 0..words as usize {
            // SAFETY: bytes `8i..8i + 8` lie in `[0, n)`, inside the array (above).
            let v = unsafe { bytewise::load8(base.add(8 * i)) };
            if v == PageState::Dirty as u64 * ONES {
                continue;
            }
            if v == PageState::Reported as u64 * ONES {
                r += 8;
                continue;
            }
            if v == PageState::Zeroed as u64 * ONES {
                z += 8;
                continue;
            }
            z += zero_bytes(v ^ (PageState::Zeroed as u64 * ONES));
            r += zero_bytes(v ^ (PageState::Reported as u64 * ONES));
            l += zero_bytes(v ^ (PageState::LazyFree as u64 * ONES));
        }
        let tail = n % 8;
        if tail != 0 && words > 0 {
            // The last `tail` bytes: the range's last eight bytes in one load, the `8 - tail`
            // already counted (its low bytes) set to 0x7f, which is no state (a byte-loop
            // took up to 70 instructions, for the slack of every block served with slack).
            // SAFETY: `n >= 8`, so bytes `n - 8..n` lie in `[0, n)`, inside the array (above).
            let v = unsafe { bytewise::load8(base.add((n - 8) as usize)) };
            let counted = u64::MAX >> (8 * tail);
            let v = (v & !counted) | ((0x7f * ONES) & counted);
            z += zero_bytes(v ^ (PageState::Zeroed as u64 * ONES));
            r += zero_bytes(v ^ (PageState::Reported as u64 * ONES));
            l += zero_bytes(v ^ (PageState::LazyFree as u64 * ONES));
        } else {
            for i in (words * 8)..n {
                // SAFETY: `i < n` (above); the load is atomic.
                let b = unsafe { (*base.add(i as usize)).load(Ordering::Relaxed) };
                z += (b == PageState::Zeroed as u8) as u32;
                r += (b == PageState::Reported as u8) as u32;
                l += (b == PageState::LazyFree as u8) as u32;
            }
        }
        StateCounts { zeroed: z, reported: r, lazy: l }
    }

    /// Visit the maximal runs of equal state in `[pfn, pfn + n)`: `f(start, len, state)`. A run
    /// is measured eight state bytes at a time (`run_end`): a `ZERO` request of 8 MiB walks its
    /// 2,048 bytes in some 256 loads, where a byte at a time cost more than a tenth of the
    /// request's own work outside its memset.
    pub fn for_each_run(self, pfn: u32, n: u32, mut f: impl FnMut(u32, u32, PageState)) {
        self.check(pfn, n);
        let end = pfn + n;
        let mut start = pfn;
        while start < end {
            let s = self.get(start);
            let p = self.run_end(start + 1, end, s);
            f(start, p - start, s);
            start = p;
        }
    }

    /// Record the pages of `[pfn, pfn + n)` whose state is `from` as `to`, by runs; the others
    /// keep theirs. Returns how many there were.
    pub fn replace(self, pfn: u32, n: u32, from: PageState, to: PageState) -> u32 {
        let mut replaced = 0;
        self.for_each_run(pfn, n, |q, len, s| {
            if s == from {
                self.fill(q, len, to);
                replaced += len;
            }
        });
        replaced
    }

    /// The states of `[pfn, pfn + n)` by granules of `2^shift` pages (`n` a multiple of the
    /// granule, at most 64 of them; `GranuleStates`): a granule is `reported` if every page of it
    /// is `Reported`, `zeroed` if every page reads zero and some is not `Reported`.
    pub(crate) fn granules(self, pfn: u32, n: u32, shift: u32) -> GranuleStates {
        let mut g = GranuleStates { shift, ..GranuleStates::default() };
        let size = 1u32 << shift;
        for i in 0..(n >> shift).min(64) {
            let c = self.count(pfn + (i << shift), size);
            if c.reported == size {
                g.reported |= 1 << i;
            } else if c.reported + c.zeroed == size {
                g.zeroed |= 1 << i;
            }
        }
        g
    }

    /// Give `[pfn, pfn + n)` the free states `g` says (`GranuleStates`: `Dirty` where neither
    /// mask has the granule; `Reported` is written last, so it wins where both have it).
    pub(crate) fn fill_granules(self, pfn: u32, n: u32, g: GranuleStates) {
        self.fill(pfn, n, PageState::Dirty);
        for (mask, state) in [(g.zeroed, PageState::Zeroed), (g.reported, PageState::Reported)] {
            let mut bits = mask & GranuleStates::all(n, g.shift);
            while bits != 0 {
                let first = bits.trailing_zeros();
                let run = (bits >> first).trailing_ones();
                self.fill(pfn + (first << g.shift), run << g.shift, state);
                bits &= !((u64::MAX >> (64 - run)) << first);
            }
        }
    }

    /// The first page of `[p, end)` (inside the arena) whose state is not `s`, or `end`.
    #[inline]
    fn run_end(self, mut p: u32, end: u32, s: PageState) -> u32 {
        let pattern = s as u64 * 0x0101_0101_0101_0101;
        while end - p >= 8 {
            // SAFETY: `p + 8 <= end`, inside the arena (the caller's range, checked by
            // `for_each_run`).
            let diff = unsafe { bytewise::load8(self.p.add(p as usize)) } ^ pattern;
            if diff != 0 {
                // The first byte of another state: the lowest non-zero byte (little-endian).
                return p + diff.trailing_zeros() / 8;
            }
            p += 8;
        }
        while p < end && self.get(p) == s {
            p += 1;
        }
        p
    }
}

/// Set the state bytes of an aligned block of `n` pages (a power of two) whose first state byte
/// is at `p` (the per-thread caches' hit path, which has `p` from `ArenaView::state_of`): one
/// byte store for one page, the block a hit serves most often; larger blocks out of line
/// (`bytewise::store_pow2`: one store for 2, 4 or 8 pages, for the memory model one relaxed
/// byte store per page, as everywhere). A branch and a store on the common path, where a switch
/// on the size was a jump table.
///
/// # Safety
/// `p` is the state byte of the first page of a block of `n` pages of a live arena, so
/// `p..p + n` lies in the state array.
#[inline(always)]
pub(crate) unsafe fn fill_block(p: *const AtomicU8, n: u32, s: PageState) {
    debug_assert!(n.is_power_of_two() && (p as usize) & (n as usize - 1) == 0);
    if n == 1 {
        // SAFETY: `p` is a state byte of a live arena (the caller's contract).
        unsafe { (*p).store(s as u8, Ordering::Relaxed) };
        return;
    }
    // SAFETY: `p..p + n` is in the state array (the caller's contract), `n` a power of two.
    unsafe { bytewise::store_pow2(p, n, s as u8 as u64 * 0x0101_0101_0101_0101) }
}

/// Stores and loads of runs of state bytes that are, for the memory model, relaxed `AtomicU8`
/// accesses of each byte (`States`), but not one instruction per byte where the target allows.
///
/// x86-64: an `asm!` load or store of 2 to 16 bytes (`mov`, `movdqu`). The architecture reads or
/// writes each byte of such an access indivisibly (a byte is never torn; a wider access may be
/// split between bytes when it crosses a cache line, so it is byte-atomic, not atomic as a
/// whole), so everything another thread can see of it, and every value it can return, is an
/// outcome of the same bytes accessed one by one with relaxed `AtomicU8` operations, which order
/// nothing between different bytes. An `asm!` block is opaque to the compiler and stands for the
/// Rust operations whose effect it has: here those byte atomics, the portable code below. So it
/// races with any other access to the bytes exactly as relaxed byte atomics do, without undefined
/// behaviour, where a plain `write_bytes` or a wider Rust atomic would be a data race or a
/// mixed-size race. Elsewhere: one `AtomicU8` access per byte.
mod bytewise {
    use core::sync::atomic::{AtomicU8, Ordering};

    /// Store `v` into the `n` bytes from `p`, as glibc's memset does: the smallest width `w`
    /// with `n <= 2w` stores the first and the last `w` bytes (overlapping when `n < 2w`: those
    /// bytes are stored twice with the same value, as a byte loop storing them twice would);
    /// past 64 bytes, 64-byte blocks from the start, then the last 64 bytes.
    ///
    /// # Safety
    /// `p..p + n` lies in a live arena's state array.
    #[cfg(target_arch = "x86_64")]
    #[inline(never)]
    pub(super) unsafe fn store(p: *const AtomicU8, n: u32, v: u8) {
        use core::arch::asm;
        use core::arch::x86_64::__m128i;
        let n = n as usize;
        let v8 = v as u64 * 0x0101_0101_0101_0101;
        // `p + n - w` for a store of the last `w` bytes, `w <= n`.
        let last = |w: usize| p.wrapping_add(n - w);
        // SAFETY (every `asm!` below): each store lies in `p..p + n` (the width chosen from `n`
        // as said above), inside the array (the caller's contract), and is byte-atomic (see the
        // module).
        match n {
            0 => {}
            // SAFETY: `n == 1`: `p` is in the array (the caller's contract); the store is atomic.
            1 => unsafe { (*p).store(v, Ordering::Relaxed) },
            // SAFETY: see above.
            2..=3 => unsafe {
                asm!("mov word ptr [{p}], {v:x}", "mov word ptr [{q}], {v:x}",
                    p = in(reg) p, q = in(reg) last(2), v = in(reg) v8, options(nostack, preserves_flags))
            },
            // SAFETY: see above.
            4..=7 => unsafe {
                asm!("mov dword ptr [{p}], {v:e}", "mov dword ptr [{q}], {v:e}",
                    p = in(reg) p, q = in(reg) last(4), v = in(reg) v8, options(nostack, preserves_flags))
            },
            // SAFETY: see above.
            8..=15 => unsafe {
                asm!("mov qword ptr [{p}], {v}", "mov qword ptr [{q}], {v}",
                    p = in(reg) p, q = in(reg) last(8), v = in(reg) v8, options(nostack, preserves_flags))
            },
            _ => {
                // SAFETY: `[u64; 2]` and `__m128i` are 16 bytes of plain data.
                let x: __m128i = unsafe { core::mem::transmute([v8, v8]) };
                match n {
                    // SAFETY: see above.
                    16..=32 => unsafe {
                        asm!("movdqu xmmword ptr [{p}], {x}", "movdqu xmmword ptr [{q}], {x}",
                            p = in(reg) p, q = in(reg) last(16), x = in(xmm_reg) x,
                            options(nostack, preserves_flags))
                    },
                    // SAFETY: see above.
                    33..=64 => unsafe {
                        asm!("movdqu xmmword ptr [{p}], {x}", "movdqu xmmword ptr [{p} + 16], {x}",
                            "movdqu xmmword ptr [{q}], {x}", "movdqu xmmword ptr [{q} + 16], {x}",
                            p = in(reg) p, q = in(reg) last(32), x = in(xmm_reg) x,
                            options(nostack, preserves_flags))
                    },
                    // SAFETY: see above. `n > 64`, so `q = p + n - 64` is above `p` and the loop
                    // runs while its block starts below `q`, so it ends below `q + 64 = p + n`;
                    // it stops at or past `q`, where the last 64 bytes begin: everything is
                    // covered.
                    _ => unsafe {
                        asm!(
                            "2:",
                            "movdqu xmmword ptr [{p}], {x}",
                            "movdqu xmmword ptr [{p} + 16], {x}",
                            "movdqu xmmword ptr [{p} + 32], {x}",
                            "movdqu xmmword ptr [{p} + 48], {x}",
                            "add {p}, 64",
                            "cmp {p}, {q}",
                            "jb 2b",
                            "movdqu xmmword ptr [{q}], {x}",
                            "movdqu xmmword ptr [{q} + 16], {x}",
                            "movdqu xmmword ptr [{q} + 32], {x}",
                            "movdqu xmmword ptr [{q} + 48], {x}",
                            p = inout(reg) p => _, q = in(reg) last(64), x = in(xmm_reg) x, options(nostack))
                    },
                }
            }
        }
    }

    /// Store `v8`, a byte repeated 8 times, into the `n` bytes from `p`, `n` a power of two:
    /// one store for 2, 4 or 8 bytes (the per-thread caches' hit path), `store` beyond.
    ///
    /// # Safety
    /// `p..p + n` lies in a live arena's state array.
    #[cfg(target_arch = "x86_64")]
    #[inline(never)]
    pub(super) unsafe fn store_pow2(p: *const AtomicU8, n: u32, v8: u64) {
        use core::arch::asm;
        // SAFETY (each arm): the `n` bytes stored lie in the array (the caller's contract); the
        // store is byte-atomic (see the module).
        match n {
            // SAFETY: see above.
            2 => unsafe {
                asm!("mov word ptr [{p}], {v:x}", p = in(reg) p, v = in(reg) v8,
                    options(nostack, preserves_flags))
            },
            // SAFETY: see above.
            4 => unsafe {
                asm!("mov dword ptr [{p}], {v:e}", p = in(reg) p, v = in(reg) v8,
                    options(nostack, preserves_flags))
            },
            // SAFETY: see above.
            8 => unsafe {
                asm!("mov qword ptr [{p}], {v}", p = in(reg) p, v = in(reg) v8,
                    options(nostack, preserves_flags))
            },
            // SAFETY: the caller's contract.
            _ => unsafe { store(p, n, v8 as u8) },
        }
    }

    /// Load the 8 bytes from `p` (any alignment), the first in the low byte.
    ///
    /// # Safety
    /// `p..p + 8` lies in a live arena's state array.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(super) unsafe fn load8(p: *const AtomicU8) -> u64 {
        let v: u64;
        // SAFETY: the 8 bytes lie in the array (the caller's contract); byte-atomic (see the
        // module); x86-64 is little-endian, so the first byte is the low one.
        unsafe {
            core::arch::asm!("mov {v}, qword ptr [{p}]", p = in(reg) p, v = out(reg) v,
                options(nostack, preserves_flags, readonly))
        };
        v
    }

    /// Store `v` into the `n` bytes from `p`.
    ///
    /// # Safety
    /// `p..p + n` lies in a live arena's state array.
    #[cfg(not(target_arch = "x86_64"))]
    #[inline(never)]
    pub(super) unsafe fn store(p: *const AtomicU8, n: u32, v: u8) {
        for i in 0..n as usize {
            // SAFETY: `i < n`, so the byte is in the array (the caller's contract); the store is
            // atomic.
            unsafe { (*p.add(i)).store(v, Ordering::Relaxed) };
        }
    }

    /// Store `v8`, a byte repeated 8 times, into the `n` bytes from `p`, `n` a power of two.
    ///
    /// # Safety
    /// `p..p + n` lies in a live arena's state array.
    #[cfg(not(target_arch = "x86_64"))]
    #[inline(always)]
    pub(super) unsafe fn store_pow2(p: *const AtomicU8, n: u32, v8: u64) {
        // SAFETY: the caller's contract.
        unsafe { store(p, n, v8 as u8) }
    }

    /// Load the 8 bytes from `p`, the first in the low byte.
    ///
    /// # Safety
    /// `p..p + 8` lies in a live arena's state array.
    #[cfg(not(target_arch = "x86_64"))]
    #[inline(always)]
    pub(super) unsafe fn load8(p: *const AtomicU8) -> u64 {
        // SAFETY: `i < 8`, so each byte is in the array (the caller's contract); the loads are
        // atomic.
        u64::from_le_bytes(core::array::from_fn(|i| unsafe { (*p.add(i)).load(Ordering::Relaxed) }))
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_stores_exactly_its_bytes() {
        // Every length and start `bytewise::store` chooses its stores by, and the aligned
        // powers of two of `fill_block`: each byte of the run changes, none around it.
        // Aligned as the page-aligned state array is, for `fill_block`.
        #[repr(align(512))]
        struct Array([AtomicU8; 400]);
        let array = Array(core::array::from_fn(|_| AtomicU8::new(PageState::Reported as u8)));
        let bytes = &array.0;
        // SAFETY: `bytes` holds 400 state bytes and outlives `states`.
        let states = unsafe { States::from_raw(bytes.as_ptr(), 400) };
        let check = |start: u32, n: u32, what: &str| {
            for (i, b) in bytes.iter().enumerate() {
                let inside = (start as usize..(start + n) as usize).contains(&i);
                let want = if inside { PageState::Dirty as u8 } else { PageState::Reported as u8 };
                assert_eq!(b.load(Ordering::Relaxed), want, "{what} {start}+{n}: byte {i}");
                b.store(PageState::Reported as u8, Ordering::Relaxed);
            }
        };
        for n in 0..=300 {
            for start in 0..20 {
                states.fill(start, n, PageState::Dirty);
                check(start, n, "fill");
            }
        }
        for n in [1u32, 2, 4, 8, 16, 32, 64, 128, 256] {
            for start in (0..400 - n).step_by(n as usize).take(4) {
                // SAFETY: `start` is a multiple of `n` and `start + n <= 400`: an aligned block
                // of `n` pages of the array.
                unsafe { fill_block(bytes.as_ptr().add(start as usize), n, PageState::Dirty) };
                check(start, n, "fill_block");
            }
        }
    }

    #[test]
    fn for_each_run_finds_the_runs_a_byte_by_byte_walk_finds() {
        let bytes: Vec<AtomicU8> = (0..300u32).map(|_| AtomicU8::new(0)).collect();
        // SAFETY: `bytes` holds 300 state bytes and outlives `states`.
        let states = unsafe { States::from_raw(bytes.as_ptr(), 300) };
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for round in 0..300 {
            // Runs of random lengths (1 to 40 bytes) of random free states.
            let mut i = 0;
            while i < bytes.len() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let len = 1 + (x >> 32) as usize % 40;
                for b in bytes.iter().skip(i).take(len) {
                    b.store((x % 4) as u8, Ordering::Relaxed);
                }
                i += len;
            }
            let (start, n) = ((x >> 8) as u32 % 150, (x >> 24) as u32 % 150);
            let mut want = Vec::new();
            for p in start..start + n {
                let s = PageState::from_byte(bytes[p as usize].load(Ordering::Relaxed));
                match want.last_mut() {
                    Some((_, len, last)) if *last == s => *len += 1,
                    _ => want.push((p, 1, s)),
                }
            }
            let mut got = Vec::new();
            states.for_each_run(start, n, |p, len, s| got.push((p, len, s)));
            assert_eq!(got, want, "round {round}: {start}+{n}");
        }
    }

    #[test]
    fn count_agrees_with_a_byte_by_byte_count() {
        let bytes: Vec<AtomicU8> = (0..300u32).map(|_| AtomicU8::new(0)).collect();
        // SAFETY: `bytes` holds 300 state bytes and outlives `states`.
        let states = unsafe { States::from_raw(bytes.as_ptr(), 300) };
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..200 {
            for b in &bytes {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Mostly dirty in some rounds, mostly one other state (whole words of it) in
                // others, any free state in the rest.
                let v = match round % 3 {
                    0 if !x.is_multiple_of(8) => PageState::Dirty as u8,
                    1 if !x.is_multiple_of(16) => (round / 3 % 4) as u8,
                    _ => (x % 4) as u8,
                };
                b.store(v, Ordering::Relaxed);
            }
            let (start, n) = ((x >> 8) as u32 % 150, (x >> 24) as u32 % 150);
            let mut want = StateCounts::default();
            for p in start..start + n {
                match PageState::from_byte(bytes[p as usize].load(Ordering::Relaxed)) {
                    PageState::Zeroed => want.zeroed += 1,
                    PageState::Reported => want.reported += 1,
                    PageState::LazyFree => want.lazy += 1,
                    _ => {}
                }
            }
            assert_eq!(states.count(start, n), want, "round {round}: {start}+{n}");
        }
    }
}
