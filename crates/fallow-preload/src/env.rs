//! Configuration by environment: `FALLOW_THRESHOLD`, `FALLOW_REPORT`, `FALLOW_REPORT_DELAY_MS`,
//! `FALLOW_ZEROING`, `FALLOW_THP`, `FALLOW_STATS`, and `FALLOW_ARENA_SIZE` (bytes reserved per
//! arena, rounded up to the largest block; 0, the default, means the machine's RAM).
//!
//! Read with `getenv` (no `std::env`: it allocates, and this runs inside `malloc`). A value that
//! does not parse prints one warning naming the variable and the default used, and the default
//! applies; nothing here can fail the program.

use core::ffi::CStr;
use core::fmt::Write;

use fallow::global::StackBuf;

/// Default `FALLOW_THRESHOLD`: requests of at least 256 KiB go to fallow (the measurement is in
/// docs/design.md, "C API and preload").
pub const DEFAULT_THRESHOLD: usize = fallow::global::DEFAULT_THRESHOLD;
pub const DEFAULT_REPORT_DELAY_MS: u64 = 2000;

/// How free pages go back to the kernel (`FALLOW_REPORT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportMode {
    /// `MADV_DONTNEED`: pages read zero afterwards (the `Reported` state).
    DontNeed,
    /// `MADV_FREE`: cheaper, contents unknown afterwards (the `LazyFree` state).
    Free,
    Off,
}

/// Background zeroing of free pages (`FALLOW_ZEROING`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroingMode {
    Idle,
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnvSettings {
    pub threshold: usize,
    pub report: ReportMode,
    pub report_delay_ms: u64,
    pub zeroing: ZeroingMode,
    pub thp: bool,
    pub stats: bool,
    pub arena_size: usize,
}

impl Default for EnvSettings {
    fn default() -> Self {
        EnvSettings {
            threshold: DEFAULT_THRESHOLD,
            report: ReportMode::DontNeed,
            report_delay_ms: DEFAULT_REPORT_DELAY_MS,
            zeroing: ZeroingMode::Idle,
            thp: false,
            stats: false,
            arena_size: 0,
        }
    }
}

/// The settings from the process environment (warnings printed for bad values).
pub fn from_environment() -> EnvSettings {
    parse(|name| {
        let v = unsafe { libc::getenv(name.as_ptr()) };
        if v.is_null() {
            None
        } else {
            Some(unsafe { CStr::from_ptr(v) }.to_bytes())
        }
    }, &mut |msg| fallow::os::write_stderr(msg))
}

/// Parse from a lookup function; `warn` receives each warning line.
pub fn parse<'a>(get: impl Fn(&CStr) -> Option<&'a [u8]>, warn: &mut dyn FnMut(&[u8])) -> EnvSettings {
    let mut s = EnvSettings::default();
    let d = EnvSettings::default();
    let mut bad = |var: &str, value: &[u8], expected: &str, default: &dyn core::fmt::Display| {
        let mut b = StackBuf::<320>::new();
        let shown = core::str::from_utf8(&value[..value.len().min(64)]).unwrap_or("<not utf-8>");
        let _ = writeln!(b, "fallow: warning: {var}={shown:?} is not {expected}; using the default {default}");
        warn(b.as_bytes());
    };
    if let Some(v) = get(c"FALLOW_THRESHOLD") {
        match parse_size(v) {
            Some(n) if n >= 1 => s.threshold = n,
            _ => bad("FALLOW_THRESHOLD", v, "a size in bytes >= 1 (suffix k, m or g allowed)", &d.threshold),
        }
    }
    if let Some(v) = get(c"FALLOW_REPORT") {
        match v {
            b"dontneed" => s.report = ReportMode::DontNeed,
            b"free" => s.report = ReportMode::Free,
            b"off" => s.report = ReportMode::Off,
            _ => bad("FALLOW_REPORT", v, "one of dontneed, free, off", &"dontneed"),
        }
    }
    if let Some(v) = get(c"FALLOW_REPORT_DELAY_MS") {
        match parse_size(v).filter(|_| v.iter().all(u8::is_ascii_digit)) {
            Some(n) => s.report_delay_ms = n as u64,
            None => bad("FALLOW_REPORT_DELAY_MS", v, "a number of milliseconds", &d.report_delay_ms),
        }
    }
    if let Some(v) = get(c"FALLOW_ZEROING") {
        match v {
            b"idle" => s.zeroing = ZeroingMode::Idle,
            b"off" => s.zeroing = ZeroingMode::Off,
            _ => bad("FALLOW_ZEROING", v, "one of idle, off", &"idle"),
        }
    }
    if let Some(v) = get(c"FALLOW_THP") {
        match v {
            b"0" => s.thp = false,
            b"1" => s.thp = true,
            _ => bad("FALLOW_THP", v, "0 or 1", &0),
        }
    }
    if let Some(v) = get(c"FALLOW_ARENA_SIZE") {
        match parse_size(v) {
            Some(n) => s.arena_size = n,
            None => bad("FALLOW_ARENA_SIZE", v, "a size in bytes (suffix k, m or g allowed)", &"0 (the machine's RAM)"),
        }
    }
    if let Some(v) = get(c"FALLOW_STATS") {
        match v {
            b"0" | b"" => s.stats = false,
            b"1" => s.stats = true,
            _ => bad("FALLOW_STATS", v, "0 or 1", &0),
        }
    }
    s
}

/// Decimal bytes with an optional binary suffix (`k`, `m`, `g`, either case).
fn parse_size(v: &[u8]) -> Option<usize> {
    let (digits, shift) = match v.last()? {
        b'k' | b'K' => (&v[..v.len() - 1], 10),
        b'm' | b'M' => (&v[..v.len() - 1], 20),
        b'g' | b'G' => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut n: usize = 0;
    for &c in digits {
        n = n.checked_mul(10)?.checked_add((c - b'0') as usize)?;
    }
    n.checked_mul(1usize << shift).filter(|&x| x >> shift == n)
}

/// Apply the settings to an allocator configuration. Today the core has the THP switch; the
/// reporting mode and delay and the zeroing mode are parsed and kept here, and are applied here
/// once the core's configuration has the background workers' tunables (branch `reclaim`).
pub fn apply_env_tunables(config: &mut fallow::Config, env: &EnvSettings) {
    config.thp = env.thp;
    config.arena_size = env.arena_size;
    if config.thp && config.max_order < 9 {
        config.max_order = 9;
    }
    let t = &mut config.tunables;
    match env.report {
        ReportMode::DontNeed => t.report_mode = fallow::ReportMode::DontNeed,
        ReportMode::Free => t.report_mode = fallow::ReportMode::Free,
        ReportMode::Off => t.report = false,
    }
    t.report_delay_ms = env.report_delay_ms.min(3_600_000) as u32;
    t.zeroing = env.zeroing == ZeroingMode::Idle;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(vars: &[(&str, &str)]) -> (EnvSettings, Vec<String>) {
        let mut warnings = Vec::new();
        let s = parse(
            |name| vars.iter().find(|(k, _)| k.as_bytes() == name.to_bytes()).map(|(_, v)| v.as_bytes()),
            &mut |m| warnings.push(String::from_utf8(m.to_vec()).unwrap()),
        );
        (s, warnings)
    }

    #[test]
    fn good_values() {
        let (s, w) = run(&[
            ("FALLOW_THRESHOLD", "1m"),
            ("FALLOW_REPORT", "free"),
            ("FALLOW_REPORT_DELAY_MS", "500"),
            ("FALLOW_ZEROING", "off"),
            ("FALLOW_THP", "1"),
            ("FALLOW_STATS", "1"),
            ("FALLOW_ARENA_SIZE", "2G"),
        ]);
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(
            s,
            EnvSettings {
                threshold: 1 << 20,
                report: ReportMode::Free,
                report_delay_ms: 500,
                zeroing: ZeroingMode::Off,
                thp: true,
                stats: true,
                arena_size: 2 << 30,
            }
        );
        let mut c = fallow::Config::default();
        apply_env_tunables(&mut c, &s);
        assert!(c.thp);
    }

    #[test]
    fn bad_values_warn_once_each_and_keep_defaults() {
        let (s, w) = run(&[
            ("FALLOW_THRESHOLD", "lots"),
            ("FALLOW_REPORT", "sometimes"),
            ("FALLOW_REPORT_DELAY_MS", "5k"),
            ("FALLOW_ZEROING", "busy"),
            ("FALLOW_THP", "yes"),
            ("FALLOW_STATS", "2"),
            ("FALLOW_ARENA_SIZE", "-1"),
        ]);
        assert_eq!(s, EnvSettings::default());
        assert_eq!(w.len(), 7, "{w:?}");
        assert!(w[0].contains("FALLOW_THRESHOLD=\"lots\"") && w[0].contains("default 262144"), "{}", w[0]);
        assert!(w[1].contains("FALLOW_REPORT") && w[1].contains("default dontneed"));
        assert!(w[2].contains("FALLOW_REPORT_DELAY_MS") && w[2].contains("default 2000"));
        assert!(w[3].contains("FALLOW_ZEROING") && w[3].contains("default idle"));
        assert!(w[4].contains("FALLOW_THP") && w[4].contains("default 0"));
        assert!(w[5].contains("FALLOW_ARENA_SIZE"));
        assert!(w[6].contains("FALLOW_STATS"));
        let (_, w) = run(&[("FALLOW_THRESHOLD", "99999999999999999999g")]);
        assert_eq!(w.len(), 1);
    }
}
