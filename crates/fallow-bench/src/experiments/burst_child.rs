//! burst's child (`fallow __burst_child`): one peer's program, its `malloc` and `free` the peer's
//! library (`preloaded.rs`). It builds `--size` bytes of small objects (`objects::churn_size`:
//! mostly 16-512 bytes, some up to 4 KiB; each written, `objects::write`), frees 90% of them in a
//! random order, then idles, reading its own resident anonymous memory (`/proc/self/statm`:
//! resident less shared, so the program's file pages are left out) every `INTERVAL_MS` for
//! `--idle-ms`. It writes what it saw as one JSON object to the file the parent names.
//!
//! The pointers are kept outside every allocator, in a private anonymous mapping of this file's
//! own (`Pointers`), so that the program's bookkeeping does not sit in the peer's heap; after the
//! frees the survivors move to its front and the rest of it is given back (`MADV_DONTNEED`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;

use super::preloaded;
use super::small::objects::{self, churn_size};
use crate::measure::{timeval_ms, XorShift};
use crate::peers::{PeerKind, PAGE};

/// The time between two readings of the resident size.
pub const INTERVAL_MS: u64 = 200;
/// One object in `KEEP` survives the frees.
pub const KEEP: usize = 10;

/// What the child is started with.
#[derive(clap::Args)]
pub struct BurstArgs {
    #[arg(long, value_parser = crate::parse_peer)]
    pub allocator: PeerKind,
    #[arg(long)]
    pub size: usize,
    #[arg(long)]
    pub idle_ms: u64,
    #[arg(long)]
    pub seed: u64,
    #[arg(long)]
    pub report: PathBuf,
}

/// An array of addresses in a mapping of its own, reserved for `cap` entries (only what is
/// written becomes resident).
struct Pointers {
    base: *mut usize,
    cap: usize,
    len: usize,
}

impl Pointers {
    fn new(cap: usize) -> Result<Pointers, String> {
        let bytes = (cap * 8).next_multiple_of(PAGE);
        // SAFETY: a fresh private anonymous mapping at no fixed address (it cannot replace one),
        // reserved without swap space; checked below.
        let p = unsafe {
            libc::mmap(core::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0)
        };
        if p == libc::MAP_FAILED {
            return Err(format!("cannot map {bytes} bytes for the pointers"));
        }
        Ok(Pointers { base: p as *mut usize, cap, len: 0 })
    }

    fn push(&mut self, p: *mut u8) {
        assert!(self.len < self.cap, "more objects than reserved for");
        // SAFETY: `len < cap`: inside the mapping, which only this value uses.
        unsafe { self.base.add(self.len).write(p as usize) };
        self.len += 1;
    }

    fn slice(&mut self) -> &mut [usize] {
        // SAFETY: the first `len` entries are written (by `push`), in the mapping this value owns;
        // the borrow of `self` keeps anyone else from it meanwhile.
        unsafe { core::slice::from_raw_parts_mut(self.base, self.len) }
    }

    /// Keep the entries `[from, len)`, moved to the front; give back the pages past them.
    fn keep_tail(&mut self, from: usize) {
        self.slice().copy_within(from.., 0);
        self.len -= from;
        let used = (self.len * 8).next_multiple_of(PAGE);
        let bytes = (self.cap * 8).next_multiple_of(PAGE);
        if bytes > used {
            // SAFETY: `[used, bytes)` is inside the mapping and past every entry still in use;
            // its pages read zero afterwards, which nothing reads.
            unsafe { libc::madvise((self.base as *mut u8).add(used) as *mut libc::c_void, bytes - used, libc::MADV_DONTNEED) };
        }
    }
}

impl Drop for Pointers {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, of this size, not used after.
        unsafe { libc::munmap(self.base as *mut libc::c_void, (self.cap * 8).next_multiple_of(PAGE)) };
    }
}

/// This process's resident anonymous bytes: `statm`'s resident less shared pages.
fn anon_rss() -> Result<u64, String> {
    let text = std::fs::read_to_string("/proc/self/statm").map_err(|e| format!("cannot read /proc/self/statm: {e}"))?;
    let v: Vec<u64> = text.split_whitespace().take(3).filter_map(|x| x.parse().ok()).collect();
    match v[..] {
        [_, resident, shared] => Ok(resident.saturating_sub(shared) * PAGE as u64),
        _ => Err(format!("/proc/self/statm reads {text:?}")),
    }
}

fn cpu_ms() -> f64 {
    // SAFETY: `rusage` is plain integers and `timeval`s, for which all zeros is a valid value.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    timeval_ms(ru.ru_utime) + timeval_ms(ru.ru_stime)
}

pub fn child_main(a: BurstArgs) -> Result<(), String> {
    preloaded::check_malloc(a.allocator)?;
    let mut rng = XorShift::new(a.seed);
    // At most one object per 16 bytes (the smallest size).
    let mut ptrs = Pointers::new(a.size / 16 + 1)?;
    let baseline = anon_rss()?;
    let cpu0 = cpu_ms();
    let t0 = Instant::now();
    let mut built = 0;
    while built < a.size {
        let n = churn_size(&mut rng);
        ptrs.push(objects::new(n, (ptrs.len % 251) as u8)?);
        built += n;
    }
    let build_ms = t0.elapsed().as_secs_f64() * 1e3;
    let built_rss = anon_rss()?;
    let t1 = Instant::now();
    let total = ptrs.len;
    let freed = total - total / KEEP;
    let all = ptrs.slice();
    for i in 0..freed {
        all.swap(i, rng.range(i, total - 1));
        // SAFETY: every entry is a live object from `objects::new`; entry i, just drawn from the
        // ones not yet freed, is freed once and left behind (only `[freed, total)` is kept).
        unsafe { objects::release(all[i] as *mut u8) }?;
    }
    ptrs.keep_tail(freed);
    let mut live = 0;
    for &p in ptrs.slice().iter() {
        // SAFETY: the survivors are live objects written by `objects::new`, only read here.
        live += unsafe { objects::check(p as *mut u8) }?.0;
    }
    let free_ms = t1.elapsed().as_secs_f64() * 1e3;
    let cpu1 = cpu_ms();
    // Idle: a reading at the end of the frees and every INTERVAL_MS after it.
    let idle_start = Instant::now();
    let mut samples = Vec::new();
    for k in 0..=a.idle_ms / INTERVAL_MS {
        let due = idle_start + Duration::from_millis(k * INTERVAL_MS);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        samples.push(json!([idle_start.elapsed().as_secs_f64() * 1e3, anon_rss()?]));
    }
    let report = json!({
        "baseline": baseline, "built": built_rss, "built_bytes": built, "objects": total, "live": live,
        "build_ms": build_ms, "free_ms": free_ms, "cpu_ms": cpu1 - cpu0, "idle_cpu_ms": cpu_ms() - cpu1,
        "samples": samples,
    });
    std::fs::write(&a.report, report.to_string()).map_err(|e| format!("cannot write {}: {e}", a.report.display()))
}
