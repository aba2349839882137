//! Configuration by environment: `FALLOW_THRESHOLD`, `FALLOW_REPORT`, `FALLOW_REPORT_DELAY_MS`,
//! `FALLOW_ZEROING`, `FALLOW_THP`, `FALLOW_STATS`, and `FALLOW_ARENA_SIZE`.
//!
//! Read with `getenv` (no `std::env`: it allocates, and this runs inside `malloc`). Every value is
//! validated, and a bad one prints exactly one warning naming the variable, the value given and
//! the value used; nothing here can fail the program:
//! - a value that does not parse: the default applies;
//! - a size out of its range: the nearest value in range applies. Ranges:
//!   `FALLOW_THRESHOLD` one page (4096) to the largest block (1 GiB; a larger threshold would
//!   send nothing to fallow); `FALLOW_REPORT_DELAY_MS` 0 to 3600000 (one hour);
//!   `FALLOW_ARENA_SIZE` 0 (the machine's RAM) or a multiple of the largest block from 1 GiB to
//!   1 TiB (the core reserves arenas in whole largest blocks, so other values are rounded up).
//!   THP does not change the largest block (1 GiB is already a multiple of a huge page).

use core::ffi::CStr;
use core::fmt::Write;

use fallow::binding_support::StackBuf;

/// Default `FALLOW_THRESHOLD`: requests of at least 256 KiB go to fallow (the measurement is in
/// docs/design.md, "C API and preload").
pub const DEFAULT_THRESHOLD: usize = fallow::FallowAlloc::DEFAULT_THRESHOLD;
pub const DEFAULT_REPORT_DELAY_MS: u64 = 2000;
/// Longest `FALLOW_REPORT_DELAY_MS` (one hour), as `Tunables::report_delay_ms` accepts.
pub const MAX_REPORT_DELAY_MS: u64 = 3_600_000;
/// Largest `FALLOW_ARENA_SIZE`: 1 TiB per arena.
pub const MAX_ARENA_SIZE: usize = 1 << 40;
/// Smallest `FALLOW_THRESHOLD`: one page, fallow's unit.
pub const MIN_THRESHOLD: usize = fallow::binding_support::PAGE_SIZE;

/// The largest block of the allocator the preload creates (the default `max_order`; `FALLOW_THP`
/// keeps it, being already at least a huge page).
pub fn largest_block() -> usize {
    fallow::binding_support::PAGE_SIZE << fallow::Config::default().max_order
}

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
        // SAFETY: `name` is a `&CStr`, so a valid NUL-terminated string for the call.
        let v = unsafe { libc::getenv(name.as_ptr()) };
        if v.is_null() {
            None
        } else {
            // SAFETY: a non-null `getenv` result is a NUL-terminated string in the environment,
            // valid until the environment is changed; `parse` only uses it during this call, and
            // we rely on no other thread calling setenv/putenv meanwhile (the settings are
            // read on the first large request, and glibc's getenv has the same requirement).
            Some(unsafe { CStr::from_ptr(v) }.to_bytes())
        }
    }, &mut |msg| fallow::binding_support::write_stderr(msg))
}

/// One warning line, formatted on the stack: `{var}={value:?} {what}; using {used}`.
fn warn_line(
    warn: &mut dyn FnMut(&[u8]),
    var: &str,
    value: &[u8],
    what: core::fmt::Arguments,
    used: core::fmt::Arguments,
) {
    let mut b = StackBuf::<384>::new();
    let shown = core::str::from_utf8(&value[..value.len().min(64)]).unwrap_or("<not utf-8>");
    let _ = writeln!(b, "fallow: warning: {var}={shown:?} {what}; using {used}");
    warn(b.as_bytes());
}

/// A value that does not parse: the default applies.
fn unparsed(warn: &mut dyn FnMut(&[u8]), var: &str, value: &[u8], expected: &str, default: &dyn core::fmt::Display) {
    warn_line(warn, var, value, format_args!("is not {expected}"), format_args!("the default {default}"));
}

/// A size out of its range: the nearest value in range (`used`) applies.
fn adjusted(warn: &mut dyn FnMut(&[u8]), var: &str, value: &[u8], why: core::fmt::Arguments, used: usize) {
    warn_line(warn, var, value, why, format_args!("{used}"));
}

/// Parse from a lookup function; `warn` receives each warning line.
pub fn parse<'a>(get: impl Fn(&CStr) -> Option<&'a [u8]>, warn: &mut dyn FnMut(&[u8])) -> EnvSettings {
    let mut s = EnvSettings::default();
    let d = EnvSettings::default();
    let block = largest_block();
    if let Some(v) = get(c"FALLOW_THRESHOLD") {
        let var = "FALLOW_THRESHOLD";
        match parse_size(v) {
            Some(n) if n < MIN_THRESHOLD => {
                s.threshold = MIN_THRESHOLD;
                adjusted(warn, var, v, format_args!("is below one page ({MIN_THRESHOLD} bytes)"), s.threshold);
            }
            Some(n) if n > block => {
                s.threshold = block;
                let why = format_args!("is above the largest block ({block} bytes): no request would go to fallow");
                adjusted(warn, var, v, why, s.threshold);
            }
            Some(n) => s.threshold = n,
            None => unparsed(warn, var, v, "a size in bytes (suffix k, m or g allowed)", &d.threshold),
        }
    }
    if let Some(v) = get(c"FALLOW_REPORT") {
        match v {
            b"dontneed" => s.report = ReportMode::DontNeed,
            b"free" => s.report = ReportMode::Free,
            b"off" => s.report = ReportMode::Off,
            _ => unparsed(warn, "FALLOW_REPORT", v, "one of dontneed, free, off", &"dontneed"),
        }
    }
    if let Some(v) = get(c"FALLOW_REPORT_DELAY_MS") {
        let var = "FALLOW_REPORT_DELAY_MS";
        match parse_size(v).filter(|_| v.iter().all(u8::is_ascii_digit)) {
            Some(n) if n as u64 > MAX_REPORT_DELAY_MS => {
                s.report_delay_ms = MAX_REPORT_DELAY_MS;
                adjusted(warn, var, v, format_args!("is above one hour ({MAX_REPORT_DELAY_MS} ms)"), MAX_REPORT_DELAY_MS as usize);
            }
            Some(n) => s.report_delay_ms = n as u64,
            None => unparsed(warn, var, v, "a number of milliseconds", &d.report_delay_ms),
        }
    }
    if let Some(v) = get(c"FALLOW_ZEROING") {
        match v {
            b"idle" => s.zeroing = ZeroingMode::Idle,
            b"off" => s.zeroing = ZeroingMode::Off,
            _ => unparsed(warn, "FALLOW_ZEROING", v, "one of idle, off", &"idle"),
        }
    }
    if let Some(v) = get(c"FALLOW_THP") {
        match v {
            b"0" => s.thp = false,
            b"1" => s.thp = true,
            _ => unparsed(warn, "FALLOW_THP", v, "0 or 1", &0),
        }
    }
    if let Some(v) = get(c"FALLOW_ARENA_SIZE") {
        let var = "FALLOW_ARENA_SIZE";
        match parse_size(v) {
            Some(n) if n != 0 && n < block => {
                s.arena_size = block;
                adjusted(warn, var, v, format_args!("is below the largest block ({block} bytes)"), s.arena_size);
            }
            Some(n) if n > MAX_ARENA_SIZE => {
                s.arena_size = MAX_ARENA_SIZE;
                adjusted(warn, var, v, format_args!("is above 1 TiB ({MAX_ARENA_SIZE} bytes)"), s.arena_size);
            }
            Some(n) if n % block != 0 => {
                // The core reserves whole largest blocks: say what it will reserve.
                s.arena_size = n.div_ceil(block) * block;
                let why = format_args!("is not a multiple of the largest block ({block} bytes)");
                adjusted(warn, var, v, why, s.arena_size);
            }
            Some(n) => s.arena_size = n,
            None => unparsed(warn, var, v, "a size in bytes (suffix k, m or g allowed)", &"0 (the machine's RAM)"),
        }
    }
    if let Some(v) = get(c"FALLOW_STATS") {
        match v {
            b"0" | b"" => s.stats = false,
            b"1" => s.stats = true,
            _ => unparsed(warn, "FALLOW_STATS", v, "0 or 1", &0),
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

    #[test]
    fn out_of_range_values_warn_once_each_naming_the_value_used() {
        let gib = 1usize << 30;
        assert_eq!(largest_block(), gib);
        let (s, w) = run(&[
            ("FALLOW_THRESHOLD", "100"),
            ("FALLOW_REPORT_DELAY_MS", "3600001"),
            ("FALLOW_ARENA_SIZE", "100m"),
        ]);
        assert_eq!((s.threshold, s.report_delay_ms, s.arena_size), (4096, 3_600_000, gib));
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[0].contains("FALLOW_THRESHOLD=\"100\" is below one page") && w[0].ends_with("; using 4096\n"), "{}", w[0]);
        assert!(w[1].contains("FALLOW_REPORT_DELAY_MS=\"3600001\"") && w[1].ends_with("; using 3600000\n"), "{}", w[1]);
        assert!(w[2].contains("FALLOW_ARENA_SIZE=\"100m\" is below the largest block") && w[2].ends_with("; using 1073741824\n"), "{}", w[2]);

        let (s, w) = run(&[("FALLOW_THRESHOLD", "2g"), ("FALLOW_ARENA_SIZE", "2T")]);
        // "2T" has no known suffix: not a size, the default applies.
        assert_eq!((s.threshold, s.arena_size), (gib, 0));
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("FALLOW_THRESHOLD=\"2g\" is above the largest block") && w[0].ends_with("; using 1073741824\n"), "{}", w[0]);
        assert!(w[1].contains("FALLOW_ARENA_SIZE=\"2T\"") && w[1].contains("using the default 0"), "{}", w[1]);

        let (s, w) = run(&[("FALLOW_ARENA_SIZE", "2000g"), ("FALLOW_THRESHOLD", "1k")]);
        assert_eq!((s.arena_size, s.threshold), (1 << 40, 4096));
        assert!(w[0].contains("FALLOW_THRESHOLD=\"1k\"") && w[0].ends_with("; using 4096\n"), "{}", w[0]);
        assert!(w[1].contains("FALLOW_ARENA_SIZE=\"2000g\" is above 1 TiB") && w[1].ends_with("; using 1099511627776\n"), "{}", w[1]);

        let (s, w) = run(&[("FALLOW_ARENA_SIZE", "1536m")]);
        assert_eq!(s.arena_size, 2 * gib);
        assert!(w.len() == 1 && w[0].contains("not a multiple") && w[0].ends_with("; using 2147483648\n"), "{w:?}");

        // The bounds themselves are in range, and 0 means the machine's RAM.
        let (s, w) = run(&[
            ("FALLOW_THRESHOLD", "4096"),
            ("FALLOW_REPORT_DELAY_MS", "3600000"),
            ("FALLOW_ARENA_SIZE", "1024g"),
        ]);
        assert!(w.is_empty(), "{w:?}");
        assert_eq!((s.threshold, s.report_delay_ms, s.arena_size), (4096, 3_600_000, 1 << 40));
        let (s, w) = run(&[("FALLOW_THRESHOLD", "1g"), ("FALLOW_ARENA_SIZE", "0"), ("FALLOW_REPORT_DELAY_MS", "0")]);
        assert!(w.is_empty(), "{w:?}");
        assert_eq!((s.threshold, s.arena_size, s.report_delay_ms), (gib, 0, 0));
    }
}
