//! Allocate, dirty, free and allocate again, printing the statistics at each step: the smallest
//! look at what fallow knows about its free pages. A `ZERO` request takes zeroed pages first, then
//! dirty ones (with a memset), reported ones last; a plain request takes dirty pages first, then
//! zeroed ones, reported ones last (faulting a reported page back in costs more than a memset of a
//! resident one: docs/design.md). Each step says what its request got, from the counters.

use fallow::{Allocator, Config, Flags, Stats};

const MIB: f64 = (1 << 20) as f64;

/// What the request between `before` and `after` got, from the counters.
fn got(before: &Stats, after: &Stats, zero: bool) -> String {
    let reported = (after.reused_reported_bytes - before.reused_reported_bytes) as f64 / MIB;
    if zero {
        let memset = (after.zeroed_on_alloc_bytes - before.zeroed_on_alloc_bytes) as f64 / MIB;
        let skipped = (after.zero_skipped_bytes - before.zero_skipped_bytes) as f64 / MIB;
        format!(
            "got {:.0} MiB zeroed, {memset:.0} MiB dirty (memset now), {reported:.0} MiB reported (no memset: \
             the kernel zero-fills it at first touch)",
            skipped - reported
        )
    } else {
        let total = (after.bytes_in_use - before.bytes_in_use) as f64 / MIB;
        format!("got {:.0} MiB resident (dirty or zeroed), {reported:.0} MiB reported", total - reported)
    }
}

fn main() {
    let a = Allocator::new(Config::default()).expect("allocator");
    let len = 256 << 20;
    let s0 = a.stats();
    let p = a.alloc(len, 4096, Flags::ZERO).expect("alloc");
    let s1 = a.stats();
    println!("== 256 MiB ZERO allocation of never-touched memory: {}\n{s1}\n", got(&s0, &s1, true));
    // SAFETY: `p` is a live block of `len` bytes (the allocation above), owned here until the free below.
    unsafe { std::ptr::write_bytes(p.as_ptr(), 0xa5, len) };
    a.free(p.as_ptr()).expect("free");
    let s2 = a.stats();
    println!("== after writing and freeing it: 256 MiB dirty (until the zeroing worker gets to it)\n{s2}\n");
    let q = a.alloc(len, 4096, Flags::ZERO).expect("alloc");
    let s3 = a.stats();
    println!(
        "== 256 MiB ZERO allocation again: zeroed memory first, then dirty, reported last: {}\n{s3}\n",
        got(&s2, &s3, true)
    );
    let r = a.alloc(len, 4096, Flags::NONE).expect("alloc");
    let s4 = a.stats();
    println!(
        "== 256 MiB plain allocation: dirty memory first, then zeroed, reported last: {}\n{s4}",
        got(&s3, &s4, false)
    );
    a.free(q.as_ptr()).unwrap();
    a.free(r.as_ptr()).unwrap();
}
