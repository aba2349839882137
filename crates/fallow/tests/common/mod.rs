//! Helpers shared by the integration tests.
#![allow(dead_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

use fallow::{Allocator, Config, Flags, PageState};

/// xorshift64*: a fixed-seed generator (a test is deterministic per seed).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Fisher-Yates.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// The tests' own system calls (fallow's `os` module is crate-private).
pub mod os {
    /// How many of the pages of `[addr, addr + len)` are resident, by `mincore` (which only
    /// reads the page tables: any address is fine, an unmapped one is `Err(ENOMEM)`).
    pub fn resident_pages(addr: usize, len: usize) -> Result<usize, i32> {
        const PAGE: usize = 4096;
        let mut buf = vec![0u8; len.div_ceil(PAGE)];
        // SAFETY: `buf` is writable for one byte per page of the range; `mincore` touches nothing else.
        if unsafe { libc::mincore(addr as *mut libc::c_void, len, buf.as_mut_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        Ok(buf.iter().filter(|b| **b & 1 != 0).count())
    }

    /// Field `i` of `/proc/self/statm` in bytes: 0 the address space's size, 1 the resident set.
    fn statm_bytes(i: usize) -> usize {
        let s = std::fs::read_to_string("/proc/self/statm").unwrap();
        s.split_whitespace().nth(i).unwrap().parse::<usize>().unwrap() * 4096
    }

    /// This process's resident set, in bytes.
    pub fn resident_set_bytes() -> usize {
        statm_bytes(1)
    }

    /// This process's address-space size, in bytes.
    pub fn mapped_bytes() -> usize {
        statm_bytes(0)
    }
}

/// Whether every free block of `s` (an allocator with nothing live or cached) is of the top
/// order `max_order`, but for at most one deferred merge per arena (buddy/deferred.rs: the last
/// dirty run freed is listed whole without merging with its buddy, so that its top-level block
/// is listed as two blocks of its order and one of each order above it: exactly one top-level
/// block's pages).
pub fn merged_to_top(s: &fallow::Stats, max_order: u8) -> bool {
    let top = 1u64 << max_order;
    let below: u64 = (0..3).map(|c| s.free_blocks[c][..max_order as usize].iter().enumerate().map(|(o, n)| n << o).sum::<u64>()).sum();
    let listed: u64 = (0..3).map(|c| s.free_blocks[c].iter().enumerate().map(|(o, n)| n << o).sum::<u64>()).sum();
    below.is_multiple_of(top) && below / top <= s.arenas && listed == s.free_pages()
}

/// A small allocator: 1 MiB blocks, 16 MiB arenas (so that growth is exercised too). The
/// background workers are off: these tests assert exact page states and zeroing counters, which
/// the zeroing and reporting workers would change under them (their own tests are report.rs and
/// zero.rs).
pub fn small() -> Allocator {
    let tunables = fallow::Tunables::off();
    Allocator::new(Config { arena_size: 16 << 20, max_order: 8, thp: false, tunables, ..Config::default() }).unwrap()
}

/// An allocator of 16 MiB blocks (max order 12) on 4 KiB pages, with its workers off and the
/// default per-thread caches: nothing but the test's calls changes its lists and page states.
pub fn quiet(arena_size: usize) -> Allocator {
    let c = Config { arena_size, max_order: 12, thp: false, tunables: fallow::Tunables::off(), ..Config::default() };
    Allocator::new(c).unwrap()
}

/// Whether the `len` bytes at `ptr` are all zero.
///
/// # Safety
/// `ptr` is valid for reads of `len` bytes (a live block of at least `len` bytes, or mapped
/// pages), and no other thread writes to them during the call.
pub unsafe fn all_zero(ptr: *const u8, len: usize) -> bool {
    // SAFETY: the caller guarantees that `[ptr, ptr + len)` is readable and not written meanwhile.
    let s = unsafe { std::slice::from_raw_parts(ptr, len) };
    // SAFETY: every bit pattern is a valid `u64`; `align_to` puts only aligned whole words in the middle.
    let (pre, words, post) = unsafe { s.align_to::<u64>() };
    pre.iter().all(|b| *b == 0) && words.iter().all(|w| *w == 0) && post.iter().all(|b| *b == 0)
}

/// Whether the `len` bytes at `ptr` all equal `v`.
///
/// # Safety
/// As for [`all_zero`]: `ptr` is valid for reads of `len` bytes, not written by another thread
/// during the call.
pub unsafe fn all_eq(ptr: *const u8, len: usize, v: u8) -> bool {
    // SAFETY: the caller guarantees that `[ptr, ptr + len)` is readable and not written meanwhile.
    unsafe { std::slice::from_raw_parts(ptr, len) }.iter().all(|b| *b == v)
}

/// Check that every free page's recorded state is true: `Zeroed` pages read zero, `Reported`
/// pages are not resident (by `mincore`; reading them would map the zero page, so they are not read).
///
/// # Safety
/// No other thread allocates from `a` during the call: a run listed free could otherwise be
/// handed out and written while it is read. `a`'s own workers may run: they write or `madvise`
/// only blocks they have first isolated (taken off every list), which `free_runs` does not list.
pub unsafe fn check_free_states(a: &Allocator) -> Result<(), String> {
    // Checked while `free_runs_with` holds the lock: a worker could otherwise report a zeroed run
    // between the listing and the read below, and the read would map the zero page into a
    // reported run (resident by `mincore`, though it reads zero).
    let mut first_error = None;
    a.free_runs_with(|addr, len, state| {
        if first_error.is_none() {
            first_error = check_run(addr, len, state).err();
        }
    });
    first_error.map_or(Ok(()), Err)
}

/// One run of `check_free_states`.
fn check_run(addr: usize, len: usize, state: PageState) -> Result<(), String> {
    match state {
        PageState::Zeroed => {
            // SAFETY: the run is free pages inside the allocator's reservation, which stays mapped
            // while it is borrowed; by `check_free_states`' contract no allocation hands them out
            // (and so no one writes them) meanwhile, and the lock keeps the workers off them.
            if !unsafe { all_zero(addr as *const u8, len) } {
                return Err(format!("zeroed run {addr:#x}+{len} holds data"));
            }
        }
        PageState::Reported => {
            let r = os::resident_pages(addr, len).unwrap();
            if r != 0 {
                return Err(format!("reported run {addr:#x}+{len} has {r} resident pages"));
            }
        }
        PageState::Allocated => return Err(format!("free run {addr:#x} marked allocated")),
        PageState::Dirty | PageState::LazyFree => {}
    }
    Ok(())
}

/// Poll `cond` every 20 ms for at most 180 s (the workers run only on idle CPU time, so a busy
/// machine delays them): a liveness bound, not a timing assertion.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !cond() {
        assert!(t0.elapsed() < std::time::Duration::from_secs(180), "gave up waiting for: {what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Run `f` in a forked child (its own limits, capabilities and address space, and no other test's
/// threads) and fail unless it returns `Ok`. The child's error, or its panic message, comes back
/// through a pipe into the parent's panic message (the test harness's output capture does not
/// reach a child). `f` must not leave threads of its own running: the child exits right after.
pub fn in_child(f: impl FnOnce() -> Result<(), String>) {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is writable for the two descriptors `pipe2` stores.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: the child has only this thread; it runs `f` (which allocates through glibc's
    // fork-safe malloc or fallow, whose own locks are not held by this thread) and leaves by `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: `fds[0]` is the read end of the pipe created above, which the child does not use.
        unsafe { libc::close(fds[0]) };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|e| {
            let m = e.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| e.downcast_ref::<String>().cloned());
            Err(format!("panicked: {}", m.unwrap_or_default()))
        });
        if let Err(m) = &r {
            // SAFETY: `m` is a live string of `m.len()` bytes; `fds[1]` is the pipe's open write end.
            unsafe { libc::write(fds[1], m.as_ptr() as *const libc::c_void, m.len()) };
        }
        // SAFETY: leaves the child at once, without unwinding into (or running the exit handlers of)
        // the parent's test harness.
        unsafe { libc::_exit(if r.is_ok() { 0 } else { 1 }) };
    }
    // SAFETY: `fds[1]` is the pipe's write end, the parent's copy of which it does not use (closing
    // it lets `read` see end-of-file once the child exits).
    unsafe { libc::close(fds[1]) };
    let mut msg = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        // SAFETY: `buf` is writable for `buf.len()` bytes; `fds[0]` is the pipe's open read end.
        let n = unsafe { libc::read(fds[0], buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
        if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        if n <= 0 {
            break;
        }
        msg.extend_from_slice(&buf[..n as usize]);
    }
    // SAFETY: `fds[0]` is the pipe's read end, not used after this.
    unsafe { libc::close(fds[0]) };
    let mut status = 0;
    // SAFETY: `pid` is the child forked above, not yet waited for; `status` is writable.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    assert!(ok, "child failed (status {status}): {}", String::from_utf8_lossy(&msg));
}

/// Allocate `len` bytes, page-aligned (`zero`: a `ZERO` request, checked to read zero), and write
/// them all with `byte`, as a program would.
pub fn take_written(a: &Allocator, len: usize, zero: bool, byte: u8) -> *mut u8 {
    let p = a.alloc(len, 4096, if zero { Flags::ZERO } else { Flags::NONE }).unwrap().as_ptr();
    // SAFETY: `p` is a live block of `len` bytes from `alloc` just above, the caller's alone.
    let b = unsafe { std::slice::from_raw_parts_mut(p, len) };
    if zero {
        assert!(b.iter().all(|&x| x == 0), "a ZERO request of {len} bytes got a block that does not read zero");
    }
    b.fill(byte);
    p
}
