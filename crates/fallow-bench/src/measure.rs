//! Measuring: wall and CPU clocks, medians, the generator of sizes, touching memory, the machine
//! record (the peers' library versions with it), the progress line, and byte sizes as people
//! write them (`512MiB`).
//!
//! CPU time is the whole process's user + system time (`getrusage(RUSAGE_SELF)`), so that work an
//! allocator does on its own background threads is charged to it.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use serde_json::{json, Value};

use crate::peers::PAGE;

/// User + system CPU time of this process, in milliseconds.
pub fn cpu_ms() -> f64 {
    rusage_ms(libc::RUSAGE_SELF)
}

/// User + system CPU time of the children this process has waited for, in milliseconds.
pub fn children_cpu_ms() -> f64 {
    rusage_ms(libc::RUSAGE_CHILDREN)
}

fn rusage_ms(who: i32) -> f64 {
    // SAFETY: `rusage` is plain integers, for which all zeros is a valid value.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(who, &mut ru) };
    timeval_ms(ru.ru_utime) + timeval_ms(ru.ru_stime)
}

/// A `timeval` (of `getrusage`, `wait4`) in milliseconds.
pub fn timeval_ms(t: libc::timeval) -> f64 {
    t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock a parent and its children share (`exit`'s
/// timestamps, `fallow run`'s samples and the preload's record).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always valid.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One timed run: wall and CPU milliseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    pub wall_ms: f64,
    pub cpu_ms: f64,
}

/// Run `f`, timing it on both clocks.
pub fn timed<R>(f: impl FnOnce() -> R) -> (R, Sample) {
    let c0 = cpu_ms();
    let t0 = Instant::now();
    let r = f();
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    (r, Sample { wall_ms, cpu_ms: cpu_ms() - c0 })
}

pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The fields every result row has: `median_ms`, `min_ms`, `max_ms`, `cpu_ms` (median CPU).
pub fn summary(samples: &[Sample]) -> serde_json::Map<String, Value> {
    let wall: Vec<f64> = samples.iter().map(|s| s.wall_ms).collect();
    let cpu: Vec<f64> = samples.iter().map(|s| s.cpu_ms).collect();
    let mut m = serde_json::Map::new();
    m.insert("median_ms".into(), num(median(&wall)));
    m.insert("min_ms".into(), num(wall.iter().cloned().fold(f64::INFINITY, f64::min)));
    m.insert("max_ms".into(), num(wall.iter().cloned().fold(f64::NEG_INFINITY, f64::max)));
    m.insert("cpu_ms".into(), num(median(&cpu)));
    m
}

/// A JSON number rounded to 3 decimals, or null when not finite.
pub fn num(x: f64) -> Value {
    if x.is_finite() {
        json!((x * 1000.0).round() / 1000.0)
    } else {
        Value::Null
    }
}

/// A cheap generator (xorshift64): the same seed gives every peer the same sequence of sizes and
/// picks, so that peers differ only in how they serve them.
pub struct XorShift(u64);

impl XorShift {
    /// The generator of `seed` (a thread number, a round): nearby seeds start far apart.
    pub fn new(seed: u64) -> XorShift {
        XorShift(0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_add(1).wrapping_mul(0xbf58_476d_1ce4_e5b9))
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number in `[lo, hi]` (`lo <= hi`), uniform but for the modulo's bias (nil at these ranges).
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
}

/// Write one byte in every page of `[p, p+len)` (makes them resident).
///
/// # Safety
/// `[p, p + len)` is writable memory of the caller's that nobody else accesses meanwhile.
pub unsafe fn touch_pages(p: *mut u8, len: usize, value: u8) {
    let mut off = 0;
    while off < len {
        // SAFETY: `off < len`, inside the caller's writable range (the contract above).
        unsafe { core::ptr::write_volatile(p.add(off), value) };
        off += PAGE;
    }
}

/// Fill `[p, p+len)` with `value`.
///
/// # Safety
/// As `touch_pages`: `[p, p + len)` is writable memory of the caller's, accessed by nobody else.
pub unsafe fn fill(p: *mut u8, len: usize, value: u8) {
    // SAFETY: the caller's writable range (the contract above).
    unsafe { core::ptr::write_bytes(p, value, len) };
    std::hint::black_box(p);
}

pub fn sleep_ms(ms: u64) {
    std::thread::sleep(std::time::Duration::from_millis(ms));
}

/// Parse `1GiB`, `512MiB`, `64KiB`, `4096`, `1G`, `2M`, `1.5GiB`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("a size cannot be negative (got '{s}')"));
    }
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: f64 = n.parse().map_err(|_| format!("bad size '{s}' (examples: 4096, 64KiB, 512MiB, 1GiB)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" | "kb" => 1024.0,
        "m" | "mib" | "mb" => 1048576.0,
        "g" | "gib" | "gb" => 1073741824.0,
        "t" | "tib" | "tb" => 1099511627776.0,
        _ => return Err(format!("bad size unit in '{s}' (use B, KiB, MiB, GiB or TiB)")),
    };
    let bytes = n * mult;
    if bytes.is_nan() || bytes < 1.0 || bytes > (1u64 << 46) as f64 {
        return Err(format!("size '{s}' is out of range (1 byte to 64 TiB)"));
    }
    Ok(bytes as usize)
}

pub fn fmt_size(bytes: usize) -> String {
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{}GiB", bytes >> 30)
    } else if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{}MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{}KiB", bytes >> 10)
    } else {
        format!("{bytes}B")
    }
}

/// The value after `key:` on the first line of `path` that starts with `key`, trimmed.
pub fn read_first_line(path: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

pub fn online_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// The `machine` record: what the numbers were measured on.
pub fn machine() -> Value {
    // SAFETY: `utsname` is arrays of chars, for which all zeros is a valid value.
    let mut uts: libc::utsname = unsafe { core::mem::zeroed() };
    // SAFETY: `uts` is a valid, writable utsname.
    unsafe { libc::uname(&mut uts) };
    // SAFETY: each field is NUL-terminated: zeroed above, then filled by `uname` with
    // NUL-terminated strings shorter than the field.
    let cstr = |b: &[libc::c_char]| unsafe { std::ffi::CStr::from_ptr(b.as_ptr()).to_string_lossy().into_owned() };
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .ok()
        .and_then(|s| s.split('[').nth(1).and_then(|r| r.split(']').next()).map(str::to_string));
    let mut libraries = serde_json::Map::new();
    for (k, v) in versions() {
        libraries.insert(k.into(), json!(v));
    }
    json!({
        "cpus": online_cpus(),
        "cpu_model": read_first_line("/proc/cpuinfo", "model name"),
        "mem_total": read_first_line("/proc/meminfo", "MemTotal"),
        "kernel": format!("{} {}", cstr(&uts.sysname), cstr(&uts.release)),
        "thp": thp,
        "libraries": libraries,
        "unix_time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
    })
}

/// Versions of the libraries, for the `machine` record.
pub fn versions() -> Vec<(&'static str, String)> {
    // SAFETY: `gnu_get_libc_version` is glibc's, takes nothing and returns a pointer to a static
    // NUL-terminated string that is never freed or changed.
    let glibc = unsafe {
        extern "C" {
            fn gnu_get_libc_version() -> *const libc::c_char;
        }
        std::ffi::CStr::from_ptr(gnu_get_libc_version()).to_string_lossy().into_owned()
    };
    // SAFETY: plain call with no arguments and no preconditions (returns an int).
    let mi = unsafe { libmimalloc_sys::mi_version() };
    // SAFETY: "version" is a read-only jemalloc mallctl of type `const char *`: `v` and `len`
    // are live locals of that type and size, no new value is passed (null, 0); on success `v`
    // points to jemalloc's static NUL-terminated version string.
    let je = unsafe {
        let mut v: *const libc::c_char = core::ptr::null();
        let mut len = core::mem::size_of::<*const libc::c_char>();
        let rc = tikv_jemalloc_sys::mallctl(
            c"version".as_ptr(),
            &mut v as *mut _ as *mut libc::c_void,
            &mut len,
            core::ptr::null_mut(),
            0,
        );
        if rc == 0 && !v.is_null() {
            std::ffi::CStr::from_ptr(v).to_string_lossy().into_owned()
        } else {
            "unknown".into()
        }
    };
    vec![
        ("glibc", glibc),
        ("jemalloc", je),
        ("mimalloc", format!("mi_version() = {mi}")),
        ("fallow", env!("CARGO_PKG_VERSION").to_string()),
    ]
}

/// A one-line progress display on stderr, shown only when stderr is a terminal.
pub struct Progress {
    on: bool,
    total: usize,
    done: usize,
    label: String,
}

impl Progress {
    pub fn new(label: &str, total: usize) -> Progress {
        Progress { on: std::io::stderr().is_terminal(), total: total.max(1), done: 0, label: label.into() }
    }

    pub fn step(&mut self, what: &str) {
        self.done += 1;
        if !self.on {
            return;
        }
        let width = 30;
        let filled = (self.done.min(self.total) * width) / self.total;
        let mut e = std::io::stderr();
        let _ = write!(
            e,
            "\r\x1b[K{:<12} [{}{}] {}/{} {}",
            self.label,
            "#".repeat(filled),
            " ".repeat(width - filled),
            self.done.min(self.total),
            self.total,
            what
        );
        let _ = e.flush();
    }

    pub fn finish(&mut self) {
        if self.on {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
    }
}

/// A memory-bandwidth ceiling: GiB/s of `memset` over a resident buffer of `len` bytes (the
/// median of `reps` passes).
pub fn memset_gib_per_s(len: usize, reps: usize) -> f64 {
    let mut buf = vec![1u8; len];
    let mut rates = Vec::new();
    for i in 0..reps.max(1) {
        let t0 = Instant::now();
        // SAFETY: `buf` is this function's own vector of `len` bytes.
        unsafe { fill(buf.as_mut_ptr(), len, i as u8) };
        let s = t0.elapsed().as_secs_f64();
        rates.push(len as f64 / (1u64 << 30) as f64 / s);
    }
    std::hint::black_box(&buf);
    median(&rates)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_people_write_them() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size(" 2M "), Ok(2 << 20));
        for bad in ["", "0", "GiB", "12XB", "-1MiB", "1..2MiB", "100TiB"] {
            assert!(parse_size(bad).is_err(), "{bad} parsed");
        }
        assert_eq!(fmt_size(256 << 20), "256MiB");
        assert_eq!(fmt_size(3 << 29), "1536MiB");
        assert_eq!(fmt_size(1000), "1000B");
    }

    #[test]
    fn medians_and_summaries() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
        let s = summary(&[
            Sample { wall_ms: 5.0, cpu_ms: 1.0 },
            Sample { wall_ms: 1.0, cpu_ms: 2.0 },
            Sample { wall_ms: 3.0, cpu_ms: 3.0 },
        ]);
        assert_eq!(s["median_ms"], json!(3.0));
        assert_eq!(s["min_ms"], json!(1.0));
        assert_eq!(s["max_ms"], json!(5.0));
        assert_eq!(s["cpu_ms"], json!(2.0));
        assert_eq!(num(f64::NAN), Value::Null);
    }

    #[test]
    fn the_generator_stays_in_range_and_reaches_both_ends() {
        let mut r = XorShift::new(0);
        let (mut lo, mut hi) = (usize::MAX, 0);
        for _ in 0..10_000 {
            let n = r.range(500, 1000);
            assert!((500..=1000).contains(&n));
            (lo, hi) = (lo.min(n), hi.max(n));
        }
        assert_eq!((lo, hi), (500, 1000));
        assert_eq!(XorShift::new(7).range(3, 3), 3);
        // The same seed, the same sequence; another seed, another.
        let seq = |s| {
            let mut g = XorShift::new(s);
            (0..4).map(|_| g.next()).collect::<Vec<_>>()
        };
        assert_eq!(seq(1), seq(1));
        assert_ne!(seq(1), seq(2));
    }
}
