//! Measurements for free page reporting and background pre-zeroing (issues 3 and 4), the figures
//! quoted in docs/design.md. Not a test: nothing is asserted; every figure is printed.
//!
//!   cargo run -p fallow --release --example reclaim_measure [-- quick]
//!
//! Each figure is the median of `RUNS` runs (3; 1 with `quick`). Wall time and CPU time of the
//! whole process (background threads included) are given side by side.

use std::time::{Duration, Instant};

use fallow::{Allocator, Config, Flags, Tunables};

/// This example's own system calls (fallow's `os` module is crate-private).
mod os {
    /// How many of the pages of `[addr, addr + len)` are resident, by `mincore` (which only reads
    /// the page tables: any address is fine).
    pub fn resident_pages(addr: usize, len: usize) -> Result<usize, i32> {
        let mut buf = vec![0u8; len.div_ceil(super::PAGE)];
        // SAFETY: `buf` is writable for one byte per page of the range; `mincore` touches nothing else.
        if unsafe { libc::mincore(addr as *mut libc::c_void, len, buf.as_mut_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        Ok(buf.iter().filter(|b| **b & 1 != 0).count())
    }

    /// CPU time (user + system) of the whole process, in ns.
    pub fn process_cpu_ns() -> u64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }
}

const PAGE: usize = 4096;
const GIB: usize = 1 << 30;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Write `byte` to the first byte of each page of `p..p + len`.
///
/// # Safety
/// `p..p + len` is a live block that the caller owns (no other reference to it exists).
unsafe fn touch(p: *mut u8, len: usize, byte: u8) {
    let mut off = 0;
    while off < len {
        // SAFETY: the caller promises `p..p + len` is a live block it owns (`touch`'s `# Safety`), and `off < len`.
        unsafe { p.add(off).write_volatile(byte) };
        off += PAGE;
    }
}

fn config(max_order: u8, t: Tunables) -> Config {
    Config { arena_size: 8 << 30, max_order, tunables: t, ..Config::default() }
}

/// An allocator over one arena of `size` bytes, all of it touched once and freed (dirty): a
/// `ZERO` request then cannot pick never-touched memory (which reads zero but costs a fault per
/// page) instead of the memory the experiment is about.
fn prefaulted(size: usize, max_order: u8, t: Tunables) -> Allocator {
    let a = Allocator::new(Config { arena_size: size, max_order, tunables: t, ..Config::default() }).unwrap();
    let p = a.alloc(size, PAGE, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `p` is the live block of `size` bytes just allocated, owned here until the free below.
    unsafe { core::ptr::write_bytes(p, 0x33, size) };
    a.free(p).unwrap();
    a
}

/// Time from freeing 4 GiB until `mincore` finds at most 1% of it resident.
fn resident_fall(max_order: u8, t: Tunables) -> (f64, f64, u64, u64) {
    let a = Allocator::new(config(max_order, t)).unwrap();
    let len = 4 * GIB;
    let p = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `p` is the live block of `len` bytes just allocated, owned here until the free below.
    unsafe { core::ptr::write_bytes(p, 0x11, len) };
    let t0 = Instant::now();
    a.free(p).unwrap();
    loop {
        let r = os::resident_pages(p as usize, len).unwrap() * PAGE;
        if r <= len / 100 || t0.elapsed() > Duration::from_secs(60) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let fall = ms(t0.elapsed());
    // Let the last batches finish, then read the cost.
    while a.stats().reported_bytes < (len as u64) * 99 / 100 && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let s = a.stats();
    let ns_per_gib = s.report_ns as f64 / (s.reported_bytes as f64 / GIB as f64);
    (fall, ns_per_gib / 1e6, s.report_calls, s.report_batches)
}

/// Obtain 1 GiB zeroed and populated (and touch every page, as the user would), right after
/// freeing a dirty 1 GiB and idling 1 s. Returns (wall ms of the obtain, process CPU ms over
/// free + idle + obtain, bytes memset on the allocation path).
fn obtain_fallow(zeroing: bool) -> (f64, f64, u64) {
    let t = Tunables { zeroing, ..Tunables::default() };
    let a = prefaulted(GIB, 18, t);
    let p = a.alloc(GIB, PAGE, Flags::ZERO | Flags::POPULATE).unwrap().as_ptr();
    // SAFETY: `p` is the live 1 GiB block just allocated, owned here until the free below.
    unsafe { core::ptr::write_bytes(p, 0x5a, GIB) };
    let cpu0 = os::process_cpu_ns();
    a.free(p).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let memset0 = a.stats().zeroed_on_alloc_bytes;
    if std::env::var_os("VERBOSE").is_some() {
        eprintln!("before obtain (zeroing {zeroing}):\n{}", a.stats());
    }
    let t0 = Instant::now();
    let q = a.alloc(GIB, PAGE, Flags::ZERO | Flags::POPULATE).unwrap().as_ptr();
    // SAFETY: `q` is the live 1 GiB block just allocated, owned here until the free below.
    unsafe { touch(q, GIB, 1) };
    let wall = ms(t0.elapsed());
    let cpu = (os::process_cpu_ns() - cpu0) as f64 / 1e6;
    let memset = a.stats().zeroed_on_alloc_bytes - memset0;
    a.free(q).unwrap();
    (wall, cpu, memset)
}

fn obtain_glibc() -> (f64, f64) {
    // SAFETY: each `calloc(1, GIB)` is checked non-null, so it is a live 1 GiB block that only this
    // function knows; each is written (and touched) before it is freed, and freed once.
    unsafe {
        let p = libc::calloc(1, GIB) as *mut u8;
        assert!(!p.is_null());
        core::ptr::write_bytes(p, 0x5a, GIB);
        let cpu0 = os::process_cpu_ns();
        libc::free(p as *mut _);
        std::thread::sleep(Duration::from_secs(1));
        let t0 = Instant::now();
        let q = libc::calloc(1, GIB) as *mut u8;
        assert!(!q.is_null());
        touch(q, GIB, 1);
        let wall = ms(t0.elapsed());
        let cpu = (os::process_cpu_ns() - cpu0) as f64 / 1e6;
        libc::free(q as *mut _);
        (wall, cpu)
    }
}

/// A zeroed allocation of `size` used at once (every cache line read and written), pre-zeroed in
/// the background (non-temporal stores: not in cache) versus zeroed on the spot (memset: in
/// cache). Returns ns per allocation+use.
fn cache_cold(size: usize, prezeroed: bool) -> f64 {
    let t = Tunables {
        report: false,
        zeroing: prezeroed,
        zero_order: 0,
        zero_chunk: size.min(2 << 20),
        zeroed_reserve: 4 * size,
        ..Tunables::default()
    };
    let a = prefaulted(64 << 20, 12, t);
    let evict = vec![1u8; 64 << 20];
    let mut samples = Vec::new();
    for round in 0..15 {
        let p = a.alloc(size, PAGE, Flags::NONE).unwrap().as_ptr();
        // SAFETY: `p` is the live block of `size` bytes just allocated, owned here until the free below.
        unsafe { core::ptr::write_bytes(p, round as u8 | 1, size) };
        a.free(p).unwrap();
        if prezeroed {
            let t0 = Instant::now();
            while a.stats().free_zeroed_pages < (size / PAGE) as u64 && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        // Evict the caches in both cases (the block was written long before it is reused).
        let s: u64 = evict.iter().step_by(64).map(|&b| b as u64).sum();
        std::hint::black_box(s);
        let t0 = Instant::now();
        let q = a.alloc(size, PAGE, Flags::ZERO).unwrap().as_ptr();
        // SAFETY: `q` is a live block of `size` bytes (a multiple of 8), page-aligned, zeroed by `Flags::ZERO`
        // (so every u64 is initialized), and owned here until the free below; no other reference to it exists.
        let words = unsafe { std::slice::from_raw_parts_mut(q as *mut u64, size / 8) };
        let mut acc = 0u64;
        for w in words.iter_mut().step_by(8) {
            acc = acc.wrapping_add(*w);
            *w = acc + 1;
        }
        std::hint::black_box(acc);
        let dt = t0.elapsed().as_nanos() as f64;
        a.free(q).unwrap();
        if round >= 3 {
            samples.push(dt);
        }
    }
    median(samples)
}

/// Throughput (GB/s) of a memory-bound loop (sum of a 512 MiB array) for ~1.5 s, beside a
/// zeroing worker busy with 4 GiB of dirty free memory (or with zeroing off), and what the
/// worker zeroed meanwhile, and the process CPU time.
fn bandwidth_beside_zeroing(zeroing: bool) -> (f64, f64, f64) {
    let t = Tunables { report: false, zeroing, zeroed_reserve: 6 * GIB, ..Tunables::default() };
    let a = Allocator::new(config(18, t)).unwrap();
    let arr = vec![3u64; (512 << 20) / 8];
    let len = 4 * GIB;
    let p = a.alloc(len, PAGE, Flags::NONE).unwrap().as_ptr();
    // SAFETY: `p` is the live block of `len` bytes just allocated, owned here until the free below.
    unsafe { core::ptr::write_bytes(p, 0x77, len) };
    let cpu0 = os::process_cpu_ns();
    a.free(p).unwrap();
    let t0 = Instant::now();
    let mut bytes = 0usize;
    while t0.elapsed() < Duration::from_millis(1500) {
        let s: u64 = arr.iter().fold(0u64, |x, &y| x.wrapping_add(y));
        std::hint::black_box(s);
        bytes += arr.len() * 8;
    }
    let gbps = bytes as f64 / t0.elapsed().as_secs_f64() / 1e9;
    let cpu = (os::process_cpu_ns() - cpu0) as f64 / 1e6;
    let zeroed = a.stats().zeroed_background_bytes as f64 / GIB as f64;
    (gbps, zeroed, cpu)
}

/// The reclaim measurements: zeroing calibration, resident size after reporting, streaming
/// beside the zeroing worker.
#[derive(clap::Parser)]
struct Args {
    /// `quick`: one run of each figure instead of three (the medians).
    #[arg(value_parser = ["quick"])]
    quick: Option<String>,
}

fn main() {
    let quick = <Args as clap::Parser>::parse().quick.is_some();
    let runs = if quick { 1 } else { 3 };
    println!("fallow reclaim measurements ({runs} run(s) each, medians)");
    println!("non-temporal zeroing threshold before calibration: {} KiB", fallow::binding_support::nt_threshold() >> 10);
    let c0 = os::process_cpu_ns();
    fallow::binding_support::calibrate_nt();
    println!(
        "calibration of non-temporal zeroing: {:.0} ms CPU, threshold {}",
        (os::process_cpu_ns() - c0) as f64 / 1e6,
        match fallow::binding_support::nt_threshold() {
            usize::MAX => "never".to_string(),
            t => format!("{} KiB", t >> 10),
        }
    );

    for (name, max_order, delay) in [
        ("default (2 s delay, 1 GiB blocks)", 18u8, 2000u32),
        ("smallest delay (0, 1 GiB blocks)", 18, 0),
        ("smallest delay (0, 2 MiB blocks)", 9, 0),
    ] {
        let t = Tunables { report_delay_ms: delay, zeroing: false, ..Tunables::default() };
        let r: Vec<_> = (0..runs).map(|_| resident_fall(max_order, t)).collect();
        println!(
            "resident fall after freeing 4 GiB, {name}: {:.0} ms; report cost {:.1} ms/GiB in syscalls ({} calls, {} batches)",
            median(r.iter().map(|x| x.0).collect()),
            median(r.iter().map(|x| x.1).collect()),
            r[0].2,
            r[0].3
        );
    }

    let on: Vec<_> = (0..runs).map(|_| obtain_fallow(true)).collect();
    let off: Vec<_> = (0..runs).map(|_| obtain_fallow(false)).collect();
    let gl: Vec<_> = (0..runs).map(|_| obtain_glibc()).collect();
    println!(
        "1 GiB zeroed+populated+touched after free + 1 s idle: fallow zeroing on {:.1} ms (memset {} MiB, CPU {:.0} ms), zeroing off {:.1} ms (memset {} MiB, CPU {:.0} ms), glibc calloc+touch {:.1} ms (CPU {:.0} ms)",
        median(on.iter().map(|x| x.0).collect()),
        on[0].2 >> 20,
        median(on.iter().map(|x| x.1).collect()),
        median(off.iter().map(|x| x.0).collect()),
        off[0].2 >> 20,
        median(off.iter().map(|x| x.1).collect()),
        median(gl.iter().map(|x| x.0).collect()),
        median(gl.iter().map(|x| x.1).collect()),
    );

    for size in [64 << 10, 1 << 20, 16 << 20] {
        let pre = cache_cold(size, true);
        let spot = cache_cold(size, false);
        println!(
            "cache-cold objection, ZERO alloc of {} KiB used at once: pre-zeroed {:.1} us, zeroed on the spot {:.1} us",
            size >> 10,
            pre / 1e3,
            spot / 1e3
        );
    }
    println!("non-temporal zeroing threshold after calibration: {}", match fallow::binding_support::nt_threshold() {
        usize::MAX => "never".to_string(),
        t => format!("{} KiB", t >> 10),
    });

    let with: Vec<_> = (0..runs).map(|_| bandwidth_beside_zeroing(true)).collect();
    let without: Vec<_> = (0..runs).map(|_| bandwidth_beside_zeroing(false)).collect();
    println!(
        "memory-bound loop beside the zeroing worker: {:.2} GB/s (worker zeroed {:.2} GiB meanwhile, process CPU {:.0} ms) vs {:.2} GB/s with zeroing off (CPU {:.0} ms)",
        median(with.iter().map(|x| x.0).collect()),
        median(with.iter().map(|x| x.1).collect()),
        median(with.iter().map(|x| x.2).collect()),
        median(without.iter().map(|x| x.0).collect()),
        median(without.iter().map(|x| x.2).collect()),
    );
}
