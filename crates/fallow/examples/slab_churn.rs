//! The cost of trimming live spans to a program that frees most of its objects and takes as
//! many again, in a loop: builds MIB MiB of small objects (burst's sizes: 7 in 8 of 16-512 bytes,
//! the rest 513-4096, each written whole), then ROUNDS times frees a random PCT% of them and
//! allocates as many again (same sizes, written whole), with fallow's small objects and
//! `Config::small_trim` on or off. Prints the rounds' wall and CPU time, the minor page faults
//! they took, the resident memory after the last round's frees and after its refill, and the
//! trim counters.
//!
//! ```text
//! cargo build --release -p fallow --example slab_churn
//! target/release/examples/slab_churn on|off [MIB=256] [ROUNDS=20] [PCT=80] [drain]
//! ```
//! With `drain`, each round's frees end with `Allocator::drain_thread_cache` (every span
//! trimmed whatever its marks: the pages a trim could give back at that moment at best).

use std::time::Instant;

use fallow::{Allocator, Config, Flags, Tunables};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
}

fn size(r: &mut Rng) -> usize {
    if r.next().is_multiple_of(8) {
        r.range(513, 4096)
    } else {
        r.range(16, 512)
    }
}

/// Resident anonymous memory, MiB (`/proc/self/statm`: resident less shared).
fn rss_mib() -> f64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let v: Vec<u64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
    ((v[1] - v[2]) * 4096) as f64 / (1 << 20) as f64
}

/// (user + system CPU ms, minor faults) of this process so far.
fn usage() -> (f64, i64) {
    // SAFETY: `getrusage` fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    (ms(u.ru_utime) + ms(u.ru_stime), u.ru_minflt)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let trim = match args.get(1).map(String::as_str) {
        Some("on") => true,
        Some("off") => false,
        _ => panic!("usage: slab_churn on|off [MIB] [ROUNDS] [PCT] [drain]"),
    };
    let mib: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(256);
    let rounds: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(20);
    let pct: u64 = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(80);
    let drain = args.get(5).is_some_and(|s| s == "drain");
    let a = Allocator::new(Config { tunables: Tunables::off(), small_objects: true, small_trim: trim, ..Config::default() }).unwrap();
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let mut objs: Vec<(*mut u8, usize)> = Vec::new();
    let mut bytes = 0;
    let take = |a: &Allocator, n: usize| {
        let p = a.malloc(n, 16, Flags::NONE).unwrap().as_ptr();
        // SAFETY: a live object of at least `n` bytes.
        unsafe { p.write_bytes(0x5a, n) };
        p
    };
    while bytes < mib << 20 {
        let n = size(&mut r);
        objs.push((take(&a, n), n));
        bytes += n;
    }
    let (cpu0, flt0) = usage();
    let t0 = Instant::now();
    let (mut low, mut high) = (0.0, 0.0);
    for _ in 0..rounds {
        let mut freed = Vec::new();
        for o in objs.iter_mut() {
            if r.next() % 100 < pct {
                a.free_any(o.0).unwrap();
                freed.push(o as *mut (*mut u8, usize));
            }
        }
        if drain {
            a.drain_thread_cache();
        }
        low = rss_mib();
        for o in freed {
            // SAFETY: an entry of `objs`, which is not resized in this loop.
            let o = unsafe { &mut *o };
            o.0 = take(&a, o.1);
        }
        high = rss_mib();
    }
    let wall = t0.elapsed().as_secs_f64() * 1e3;
    let (cpu1, flt1) = usage();
    let s = a.stats();
    println!(
        "trim {trim} objects {} rounds {rounds} pct {pct}: wall {wall:.0} ms, cpu {:.0} ms, minor faults {}, rss after frees {low:.1} MiB, after refill {high:.1} MiB, trims {}, trimmed pages total {}",
        objs.len(),
        cpu1 - cpu0,
        flt1 - flt0,
        s.small_trims,
        s.small_trimmed_pages_total
    );
}
