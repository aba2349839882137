//! Large values are set up where they live, not on the stack and moved: a thread's per-thread
//! cache (most of a page) at its first page block, which touched 20 KiB of the stack of every
//! thread that took a page block (resident memory per thread, which glibc's cache of thread
//! stacks keeps), and an allocator's shared state (12 KiB) when it is made, which touched 36 KiB
//! more of the stack of the thread that made it (the main thread's, for the preload library:
//! resident for the process's life). Measured as the kernel counts it: the resident pages of
//! the thread's stack mapping (`/proc/self/smaps`) before and after.
#![warn(clippy::undocumented_unsafe_blocks)]

use fallow::{Allocator, Config, Flags};

/// Resident KiB of the mapping that holds `addr` (`/proc/self/smaps`).
fn resident_kib_around(addr: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        let range = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = range.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)) {
                inside = (lo..hi).contains(&addr);
                continue;
            }
        }
        if inside {
            if let Some(kib) = line.strip_prefix("Rss:") {
                return kib.trim().trim_end_matches("kB").trim().parse().unwrap();
            }
        }
    }
    panic!("no mapping holds {addr:#x}");
}

#[test]
fn a_threads_first_page_blocks_touch_little_of_its_stack() {
    let a = Allocator::new(Config { arena_size: 64 << 20, thp: false, ..Config::default() }).unwrap();
    let a = &a;
    let (before, after) = std::thread::scope(|s| {
        s.spawn(move || {
            let here = 0u8;
            let at = &here as *const u8 as usize;
            let before = resident_kib_around(at);
            for order in 0..6 {
                let p = a.alloc(4096 << order, 4096, Flags::NONE).unwrap();
                // SAFETY: `p` is a live block of at least 4096 bytes just handed out.
                unsafe { p.as_ptr().write(1) };
                a.free(p.as_ptr()).unwrap();
            }
            (before, resident_kib_around(at))
        })
        .join()
        .unwrap()
    });
    a.check_invariants().unwrap();
    // The cache built by value took 16 KiB more of the stack than reading the map does.
    assert!(after < before + 12, "the thread's stack: {before} KiB resident before, {after} KiB after");
}

#[test]
fn making_an_allocator_touches_little_of_the_threads_stack() {
    let (before, after) = std::thread::spawn(|| {
        let here = 0u8;
        let at = &here as *const u8 as usize;
        let before = resident_kib_around(at);
        let a = Allocator::new(Config { arena_size: 64 << 20, thp: false, ..Config::default() }).unwrap();
        let after = resident_kib_around(at);
        a.check_invariants().unwrap();
        (before, after)
    })
    .join()
    .unwrap();
    // Built by value and moved into its `Arc`, the shared state took 36 KiB more of the stack
    // than now (8 -> 44 KiB resident, now 8 -> 12).
    assert!(after < before + 16, "the thread's stack: {before} KiB resident before, {after} KiB after");
}
