//! The soft memory limit and the pressure signal (docs/design.md, "Memory limit and
//! pressure"): past the limit, free memory goes back before its delay and the usage comes back
//! below the limit; a limit below the live data never fails an allocation; a pressure event
//! returns idle memory, the zeroed reserve included; PSI is watched where the kernel has it,
//! without holding a descriptor; a cgroup's limit is found and obeyed; the figures agree with
//! `/proc/self/smaps_rollup`; a bad `FALLOW_MEMORY_LIMIT` warns and keeps the default.
//!
//! The reporting delay is an hour in these tests, so that only the limit or the pressure can
//! explain memory given back. No timing is asserted: waits are bounded polls for liveness only.
//! The tests that read the process's resident size run in a forked child, away from the other
//! tests' threads and memory.
#![warn(clippy::undocumented_unsafe_blocks)]

mod common;

use common::{in_child, wait_for};
use fallow::{Allocator, Config, Flags, MemoryLimit, Tunables};

const MIB: usize = 1 << 20;
const HOUR_MS: u32 = 3_600_000;
/// `Stats::memory_limit_source` and `pressure_signal` codes (stats.rs).
const SOURCE_SETTING: u64 = 1;
const SOURCE_V2_MAX: u64 = 3;
const SOURCE_V1: u64 = 4;
const SIGNAL_PSI_CGROUP: u64 = 1;
const SIGNAL_PSI_SYSTEM: u64 = 2;
const SIGNAL_MEMAVAILABLE: u64 = 3;

/// 64 MiB blocks (larger than any cached order, so that every block is on the lists), the delay
/// an hour, zeroing off.
fn config(limit: MemoryLimit, pressure: bool) -> Config {
    let tunables = Tunables {
        report: true,
        report_delay_ms: HOUR_MS,
        zeroing: false,
        memory_limit: limit,
        pressure,
        ..Tunables::default()
    };
    // On 4 KiB pages: with huge pages a small block keeps its whole 2 MiB unit resident
    // (buddy/units.rs), which "every idle free page given back" would have to leave out.
    Config { arena_size: 1 << 30, max_order: 14, thp: false, tunables, ..Config::default() }
}

/// A block of `len` bytes, every page written.
fn touched(a: &Allocator, len: usize) -> *mut u8 {
    let p = a.alloc(len, 4096, Flags::NONE).expect("a soft limit never fails an allocation").as_ptr();
    // SAFETY: `p` is a live block of `len` bytes from `alloc`, used by this thread only.
    unsafe { core::ptr::write_bytes(p, 0x5a, len) };
    p
}

/// `Rss:` of `/proc/self/smaps_rollup`, in bytes.
fn rss() -> u64 {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup").expect("smaps_rollup");
    let line = text.lines().find(|l| l.starts_with("Rss:")).expect("an Rss line");
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

fn check(cond: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

/// Poll for at most 180 s, returning an error instead of panicking (in a child).
fn wait(what: &str, mut cond: impl FnMut() -> bool) -> Result<(), String> {
    let t0 = std::time::Instant::now();
    while !cond() {
        if t0.elapsed().as_secs() > 180 {
            return Err(format!("gave up waiting for: {what}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}

/// Tolerance of the comparisons with `smaps_rollup`: 8 MiB (fallow's side metadata, the test's
/// own heap and stack, what the kernel rounds) plus 5% of the figure compared.
fn close(a: u64, b: u64) -> bool {
    a.abs_diff(b) <= (8 << 20) + a.max(b) / 20
}

/// No free page resident, and none held by the reporter (a block in flight is counted neither
/// resident nor reported until it comes back).
fn quiet_and_reported(a: &Allocator) -> bool {
    let s = a.stats();
    s.resident_free_bytes() == 0 && s.isolated_pages == 0
}

#[test]
fn the_limit_is_obeyed_and_the_figures_agree_with_smaps_rollup() {
    in_child(|| {
        let limit = 80 * MIB as u64;
        let base_rss = rss();
        let a = Allocator::new(config(MemoryLimit::Bytes(limit), false)).map_err(|e| e.to_string())?;
        let blocks: Vec<*mut u8> = (0..3).map(|_| touched(&a, 32 * MIB)).collect();
        let full_rss = rss();
        // 96 MiB live, past the limit but with nothing free to give back; then 32 MiB live and
        // 64 MiB free and resident: the reporter gives back (at least) 32 MiB at once, though
        // the delay is an hour.
        a.free(blocks[1]).map_err(|e| e.to_string())?;
        a.free(blocks[2]).map_err(|e| e.to_string())?;
        wait("usage back below the limit", || {
            let s = a.stats();
            s.limit_reported_bytes > 0 && s.memory_limit_usage_bytes <= limit && s.isolated_pages == 0
        })?;
        let s = a.stats();
        check(s.memory_limit_bytes == limit && s.memory_limit_source == SOURCE_SETTING, || format!("{s}"))?;
        check(s.memory_limit_hits >= 1, || format!("{s}"))?;
        check(s.reported_bytes == s.limit_reported_bytes && s.limit_reported_bytes >= 32 * MIB as u64, || format!("{s}"))?;
        check(s.pressure_reported_bytes == 0 && s.pressure_signal == 0, || format!("pressure is off: {s}"))?;
        // What the counters say went back left the process's resident set.
        let after = rss();
        let dropped = full_rss.saturating_sub(after);
        check(close(dropped, s.limit_reported_bytes), || {
            format!("Rss fell by {dropped}, limit_reported_bytes {}", s.limit_reported_bytes)
        })?;
        check(close(s.memory_limit_usage_bytes, after - base_rss), || {
            format!("usage {} against an Rss growth of {}", s.memory_limit_usage_bytes, after - base_rss)
        })?;
        a.check_invariants()?;
        a.free(blocks[0]).map_err(|e| e.to_string())
    });
}

#[test]
fn a_limit_below_the_live_data_never_fails_an_allocation() {
    let a = Allocator::new(config(MemoryLimit::Bytes(4096), false)).unwrap();
    let mut live = Vec::new();
    for round in 0..4 {
        for _ in 0..4 {
            live.push(touched(&a, 16 * MIB));
            let p = a.alloc(8 * MIB, 4096, Flags::ZERO).expect("a soft limit never fails an allocation");
            // SAFETY: a live block of 8 MiB, used by this thread only; ZERO says it reads zero.
            assert!(unsafe { common::all_zero(p.as_ptr(), 8 * MIB) }, "round {round}: a ZERO block reads zero");
            live.push(p.as_ptr());
        }
        // Free half: all of it goes back (the limit is far below the live data).
        for p in live.drain(..4) {
            a.free(p).unwrap();
        }
        wait_for("every free page reported", || quiet_and_reported(&a));
    }
    let s = a.stats();
    assert!(s.memory_limit_hits >= 1 && s.limit_reported_bytes > 0, "{s}");
    a.check_invariants().unwrap();
    for p in live {
        a.free(p).unwrap();
    }
}

#[test]
fn a_pressure_event_returns_idle_memory_and_the_zeroed_reserve() {
    // Zeroing on, so that a zeroed reserve exists to be dropped; the hook stands for a PSI event.
    let mut c = config(MemoryLimit::Off, true);
    c.tunables.zeroing = true;
    c.tunables.zero_delay_ms = 0;
    let a = Allocator::new(c).unwrap();
    // A ZERO request: the zeroing worker then keeps a reserve zeroed.
    let z = a.alloc(4096, 4096, Flags::ZERO).unwrap();
    let blocks: Vec<*mut u8> = (0..2).map(|_| touched(&a, 64 * MIB)).collect();
    for p in blocks {
        a.free(p).unwrap();
    }
    // (A real PSI event, which this machine may see at any time, may give it back first.)
    wait_for("some free memory zeroed", || {
        let s = a.stats();
        s.free_zeroed_pages > 0 || s.pressure_reported_bytes > 0
    });
    let before = a.stats();
    a.simulate_pressure();
    wait_for("the event seen", || a.stats().pressure_events > before.pressure_events);
    wait_for("idle free memory given back", || quiet_and_reported(&a));
    let s = a.stats();
    assert!(s.pressure_reported_bytes >= 128 * MIB as u64 && s.pressure_reported_bytes == s.reported_bytes, "{s}");
    assert!(s.limit_reported_bytes == 0 && s.memory_limit_source == 0, "no limit: {s}");
    a.check_invariants().unwrap();
    a.free(z.as_ptr()).unwrap();
}

#[test]
fn psi_is_watched_where_the_kernel_has_it() {
    let psi = std::fs::read_to_string("/proc/pressure/memory").is_ok();
    let a = Allocator::new(config(MemoryLimit::Off, true)).unwrap();
    wait_for("a pressure signal chosen", || a.stats().pressure_signal != 0);
    let signal = a.stats().pressure_signal;
    if psi {
        assert!(signal == SIGNAL_PSI_CGROUP || signal == SIGNAL_PSI_SYSTEM, "signal {signal}: {}", a.stats());
    } else {
        assert!(signal == SIGNAL_MEMAVAILABLE || signal == SIGNAL_MEMAVAILABLE + 1, "signal {signal}");
    }
    // The file is read, not held: no descriptor of the process names a PSI file (as one held
    // here would).
    assert!(!holds_pressure_file(), "a PSI file is held open");
    if psi {
        let held = std::fs::File::open("/proc/pressure/memory").unwrap();
        assert!(holds_pressure_file());
        drop(held);
    }
    // Switched off at run time: the figure says off.
    a.set_tunables(Tunables { pressure: false, ..a.tunables() }).unwrap();
    wait_for("the signal off", || a.stats().pressure_signal == 0);
}

/// Whether a descriptor of this process names a PSI file for longer than one read (the
/// reporter opens the file, reads it and closes it at each look: a few such counts in a row).
fn holds_pressure_file() -> bool {
    let names = || -> bool {
        let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return false };
        dir.flatten().any(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().contains("pressure")))
    };
    (0..5).all(|_| {
        std::thread::sleep(std::time::Duration::from_millis(3));
        names()
    })
}

/// A memory cgroup of its own for this process, as root: v1 `memory.limit_in_bytes` or v2
/// `memory.max`. `None` where the machine does not let the test make one.
fn own_cgroup(limit: u64) -> Option<(std::path::PathBuf, u64)> {
    let name = format!("fallow-limit-test-{}", std::process::id());
    let v1 = std::path::Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists();
    let (dir, file, source) = if v1 {
        (std::path::Path::new("/sys/fs/cgroup/memory").join(&name), "memory.limit_in_bytes", SOURCE_V1)
    } else {
        (std::path::Path::new("/sys/fs/cgroup").join(&name), "memory.max", SOURCE_V2_MAX)
    };
    std::fs::create_dir(&dir).ok()?;
    let ok = std::fs::write(dir.join(file), limit.to_string()).is_ok()
        && std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string()).is_ok();
    if !ok {
        let _ = std::fs::remove_dir(&dir);
        return None;
    }
    Some((dir, source))
}

#[test]
fn a_cgroup_limit_is_found_and_obeyed() {
    in_child(|| {
        let hard = 256 * MIB as u64;
        let Some((_, source)) = own_cgroup(hard) else {
            eprintln!("a_cgroup_limit_is_found_and_obeyed: no memory cgroup of its own here (not root, or no controller); skipped");
            return Ok(());
        };
        let a = Allocator::new(config(MemoryLimit::Auto, false)).map_err(|e| e.to_string())?;
        // The margin for a 256 MiB limit: a quarter, 64 MiB.
        let in_force = hard - 64 * MIB as u64;
        wait("the cgroup's limit resolved", || a.stats().memory_limit_source != 0)?;
        let s = a.stats();
        check(s.memory_limit_source == source && s.memory_limit_bytes == in_force, || format!("{s}"))?;
        // 192 MiB touched and 48 MiB more: past the 192 MiB in force, below the hard 256 MiB.
        let blocks: Vec<*mut u8> = (0..3).map(|_| touched(&a, 64 * MIB)).collect();
        let extra = touched(&a, 48 * MIB);
        a.free(blocks[0]).map_err(|e| e.to_string())?;
        a.free(blocks[1]).map_err(|e| e.to_string())?;
        wait("the cgroup back below the limit", || {
            let s = a.stats();
            let back = s.memory_limit_usage_bytes <= in_force && s.isolated_pages == 0;
            s.memory_limit_hits >= 1 && s.limit_reported_bytes >= 64 * MIB as u64 && back
        })?;
        a.check_invariants()?;
        a.free(blocks[2]).map_err(|e| e.to_string())?;
        a.free(extra).map_err(|e| e.to_string())
    });
    // The child has left its cgroup by exiting: remove it (a cgroup with processes in it, another
    // run's, refuses).
    let found = std::fs::read_dir("/sys/fs/cgroup/memory").into_iter().chain(std::fs::read_dir("/sys/fs/cgroup"));
    for entries in found {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with("fallow-limit-test-") {
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }
}

#[test]
fn a_bad_memory_limit_warns_once_and_keeps_the_default() {
    use fallow::binding_support::env::parse;
    for (value, expected) in [("lots", "auto, off or a size"), ("12x", "auto, off or a size")] {
        let mut warnings = Vec::new();
        let vars = [("FALLOW_MEMORY_LIMIT", value)];
        let s = parse(
            Config::default(),
            |name| vars.iter().find(|(k, _)| k.as_bytes() == name.to_bytes()).map(|(_, v)| v.as_bytes()),
            &mut |m| warnings.push(String::from_utf8(m.to_vec()).unwrap()),
        );
        assert_eq!(s.config.tunables.memory_limit, MemoryLimit::Auto);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        let w = &warnings[0];
        assert!(w.contains(&format!("FALLOW_MEMORY_LIMIT=\"{value}\"")) && w.contains(expected), "{w}");
        assert!(w.ends_with("using the default auto\n"), "{w}");
    }
}
