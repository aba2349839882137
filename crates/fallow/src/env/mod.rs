//! Settings by environment, one parser for the preload library and the C library:
//! `FALLOW_THRESHOLD`, `FALLOW_REPORT`, `FALLOW_REPORT_DELAY_MS`, `FALLOW_ZEROING`, `FALLOW_THP`,
//! `FALLOW_STATS`, `FALLOW_ARENA_SIZE`, `FALLOW_MEMORY_LIMIT`, `FALLOW_PRESSURE` and the
//! per-thread caches' `FALLOW_CACHE`, `FALLOW_CACHE_MAX_ORDER`, `FALLOW_CACHE_BATCH_PAGES` and
//! `FALLOW_CACHE_HIGH_PAGES`, and `FALLOW_SMALL` (`1`: small objects from the slab layer,
//! `Config::small_objects`; `0`: not) with `FALLOW_SMALL_TRIM` (`0`: live spans keep their free
//! pages, `Config::small_trim`), applied over a given `Config` (the default one for the preload, the
//! caller's for `fallow_create_from_env`).
//!
//! Read with `getenv` (no `std::env`: it allocates, and this runs inside `malloc`); warnings are
//! formatted on the stack. Every value is validated, and a bad one gives exactly one warning
//! naming the variable, the value given and the value used; nothing here can fail the program:
//! - a value that does not parse: the default (the given configuration's value) applies;
//! - a size out of its range: the nearest value in range applies. Ranges:
//!   `FALLOW_THRESHOLD` one page (4096) to the largest block (a larger threshold would send
//!   nothing to fallow); `FALLOW_REPORT_DELAY_MS` 0 to 3600000 (one hour, as
//!   `Tunables::report_delay_ms` accepts); `FALLOW_ARENA_SIZE` 0 (the machine's RAM) or a
//!   multiple of the largest block from the largest block to 1 TiB (the core reserves arenas in
//!   whole largest blocks, so other values are rounded up). The largest block is the
//!   configuration's (1 GiB by default); `FALLOW_THP=1` raises it to 2 MiB if it is smaller;
//!   `FALLOW_MEMORY_LIMIT` at least one page (4096 bytes);
//! - `FALLOW_REPORT=dontneed` or `free` with the memfd backing, which neither frees: the default;
//! - a cache setting out of the range `Config::validate` accepts: the nearest value in range
//!   (`FALLOW_CACHE_MAX_ORDER` 0 to 11, `FALLOW_CACHE_HIGH_PAGES` 2 to 65536,
//!   `FALLOW_CACHE_BATCH_PAGES` 1 to the high mark in effect).
//!
//! `FALLOW_REPORT=off` is `Tunables::report = false`; `dontneed` and `free` set
//! `Tunables::report_mode`; `FALLOW_ZEROING` is `Tunables::zeroing`; `FALLOW_MEMORY_LIMIT`
//! (`auto`, `off` or a size: `2GiB`, `512m`, bytes) is `Tunables::memory_limit`;
//! `FALLOW_PRESSURE` (`auto`, `off`) is `Tunables::pressure`. `FALLOW_THRESHOLD` and
//! `FALLOW_STATS` concern a process-wide allocator only (the preload); the C library checks them
//! all the same, so that the same environment gives the same warnings.

use core::ffi::CStr;
use core::fmt::{Arguments, Display, Write};

use crate::config::{
    Backing, Config, MemoryLimit, ReportMode, CACHE_HIGH_PAGES_MAX, CACHE_HIGH_PAGES_MIN, CACHE_ORDER_LIMIT,
    MAX_ORDER_LIMIT, MIN_MEMORY_LIMIT,
};
use crate::message::StackBuf;
use crate::os;

/// Default `FALLOW_THRESHOLD`: requests of at least 256 KiB go to fallow (the measurement is in
/// docs/design.md, "C API and preload"); `FallowAlloc`'s default too.
pub const DEFAULT_THRESHOLD: usize = 256 << 10;
/// Largest `FALLOW_ARENA_SIZE`: 1 TiB per arena.
pub const MAX_ARENA_SIZE: usize = 1 << 40;
/// Smallest `FALLOW_THRESHOLD`: one page, fallow's unit.
pub const MIN_THRESHOLD: usize = os::PAGE_SIZE;

/// What the environment says: the process-wide settings and the allocator's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvSettings {
    /// `FALLOW_THRESHOLD`: requests of at least this many bytes go to fallow.
    pub threshold: usize,
    /// `FALLOW_STATS=1`: the statistics on stderr at exit.
    pub stats: bool,
    /// The configuration given, with `FALLOW_ARENA_SIZE`, `FALLOW_THP` and the `FALLOW_CACHE*`
    /// variables applied, and in its tunables `FALLOW_REPORT`, `FALLOW_REPORT_DELAY_MS` and
    /// `FALLOW_ZEROING`.
    pub config: Config,
}

/// The settings from the process environment over `base`, each warning written to stderr.
pub fn from_environment(base: Config) -> EnvSettings {
    parse(
        base,
        |name| {
            // SAFETY: `parse` uses the bytes only during this call, and we rely on no other thread
            // changing the environment meanwhile (settings are read once, on the first large
            // request or by an explicit call; glibc's own getenv asks the same).
            unsafe { os::getenv(name) }
        },
        &mut |msg| os::write_stderr(msg),
    )
}

/// One warning line, formatted on the stack: `{var}={value:?} {what}; using {used}`.
fn warn_line(warn: &mut dyn FnMut(&[u8]), var: &str, value: &[u8], what: Arguments, used: Arguments) {
    let mut b = StackBuf::<384>::new();
    let shown = core::str::from_utf8(&value[..value.len().min(64)]).unwrap_or("<not utf-8>");
    let _ = writeln!(b, "fallow: warning: {var}={shown:?} {what}; using {used}");
    warn(b.as_bytes());
}

/// A value that does not parse: the default applies.
fn unparsed(warn: &mut dyn FnMut(&[u8]), var: &str, value: &[u8], expected: &str, default: &dyn Display) {
    warn_line(warn, var, value, format_args!("is not {expected}"), format_args!("the default {default}"));
}

/// A size out of its range: the nearest value in range (`used`) applies.
fn adjusted(warn: &mut dyn FnMut(&[u8]), var: &str, value: &[u8], why: Arguments, used: usize) {
    warn_line(warn, var, value, why, format_args!("{used}"));
}

/// How `FALLOW_REPORT` names what `config` does without it.
fn report_name(config: &Config) -> &'static str {
    if !config.tunables.report {
        return "off";
    }
    match config.tunables.effective_mode(config.backing) {
        ReportMode::Free => "free",
        ReportMode::Punch => "punch",
        ReportMode::DontNeed | ReportMode::Auto => "dontneed",
    }
}

/// An arena size as the warnings name it.
struct ArenaSize(usize);

impl Display for ArenaSize {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.0 {
            0 => write!(f, "0 (the machine's RAM)"),
            n => write!(f, "{n}"),
        }
    }
}

/// A memory limit as the warnings name it.
struct LimitName(MemoryLimit);

impl Display for LimitName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.0 {
            MemoryLimit::Off => write!(f, "off"),
            MemoryLimit::Auto => write!(f, "auto"),
            MemoryLimit::Bytes(n) => write!(f, "{n}"),
        }
    }
}

/// Parse from a lookup function, over `base`; `warn` receives each warning line.
pub fn parse<'a>(
    base: Config,
    get: impl Fn(&CStr) -> Option<&'a [u8]>,
    warn: &mut dyn FnMut(&[u8]),
) -> EnvSettings {
    let d = base.clone();
    let mut s = EnvSettings { threshold: DEFAULT_THRESHOLD, stats: false, config: base };
    let c = &mut s.config;
    // The largest block the ranges are checked against is the one `FALLOW_THP` leads to (its
    // warning, if any, comes in its turn below).
    let thp = match get(c"FALLOW_THP") {
        Some(b"1") => true,
        Some(b"0") => false,
        _ => d.thp,
    };
    let max_order = if thp { d.max_order.max(9) } else { d.max_order }.min(MAX_ORDER_LIMIT);
    let block = os::PAGE_SIZE << max_order;
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
            None => unparsed(warn, var, v, "a size in bytes (suffix k, m or g allowed)", &DEFAULT_THRESHOLD),
        }
    }
    if let Some(v) = get(c"FALLOW_REPORT") {
        let var = "FALLOW_REPORT";
        match v {
            b"off" => c.tunables.report = false,
            b"dontneed" | b"free" if d.backing == Backing::Memfd => {
                let used = format_args!("the default {}", report_name(&d));
                warn_line(warn, var, v, format_args!("does not free memfd pages"), used);
            }
            b"dontneed" | b"free" => {
                c.tunables.report = true;
                c.tunables.report_mode = if v == b"free" { ReportMode::Free } else { ReportMode::DontNeed };
            }
            _ => unparsed(warn, var, v, "one of dontneed, free, off", &report_name(&d)),
        }
    }
    if let Some(v) = get(c"FALLOW_REPORT_DELAY_MS") {
        let var = "FALLOW_REPORT_DELAY_MS";
        let max = crate::config::MAX_DELAY_MS;
        match parse_size(v).filter(|_| v.iter().all(u8::is_ascii_digit)) {
            Some(n) if n > max as usize => {
                c.tunables.report_delay_ms = max;
                adjusted(warn, var, v, format_args!("is above one hour ({max} ms)"), max as usize);
            }
            Some(n) => c.tunables.report_delay_ms = n as u32,
            None => unparsed(warn, var, v, "a number of milliseconds", &d.tunables.report_delay_ms),
        }
    }
    if let Some(on) = switch(&get, warn, c"FALLOW_ZEROING", ["idle", "off"], d.tunables.zeroing) {
        c.tunables.zeroing = on;
    }
    if let Some(v) = get(c"FALLOW_THP") {
        if v != b"0" && v != b"1" {
            unparsed(warn, "FALLOW_THP", v, "0 or 1", &(d.thp as u8));
        }
    }
    c.thp = thp;
    c.max_order = if thp { d.max_order.max(9) } else { d.max_order };
    if let Some(v) = get(c"FALLOW_ARENA_SIZE") {
        let var = "FALLOW_ARENA_SIZE";
        let max = MAX_ARENA_SIZE.max(block);
        match parse_size(v) {
            Some(n) if n != 0 && n < block => {
                c.arena_size = block;
                adjusted(warn, var, v, format_args!("is below the largest block ({block} bytes)"), c.arena_size);
            }
            Some(n) if n > max => {
                c.arena_size = max;
                adjusted(warn, var, v, format_args!("is above 1 TiB ({MAX_ARENA_SIZE} bytes)"), c.arena_size);
            }
            Some(n) if n % block != 0 => {
                // The core reserves whole largest blocks: say what it will reserve.
                c.arena_size = n.div_ceil(block) * block;
                let why = format_args!("is not a multiple of the largest block ({block} bytes)");
                adjusted(warn, var, v, why, c.arena_size);
            }
            Some(n) => c.arena_size = n,
            None => {
                let default = ArenaSize(d.arena_size);
                unparsed(warn, var, v, "a size in bytes (suffix k, m or g allowed)", &default)
            }
        }
    }
    if let Some(v) = get(c"FALLOW_MEMORY_LIMIT") {
        let var = "FALLOW_MEMORY_LIMIT";
        match v {
            b"auto" => c.tunables.memory_limit = MemoryLimit::Auto,
            b"off" => c.tunables.memory_limit = MemoryLimit::Off,
            _ => match parse_limit(v) {
                Some(n) if n < MIN_MEMORY_LIMIT => {
                    c.tunables.memory_limit = MemoryLimit::Bytes(MIN_MEMORY_LIMIT);
                    let why = format_args!("is below one page ({MIN_MEMORY_LIMIT} bytes)");
                    adjusted(warn, var, v, why, MIN_MEMORY_LIMIT as usize);
                }
                Some(n) => c.tunables.memory_limit = MemoryLimit::Bytes(n),
                None => {
                    let expected = "auto, off or a size in bytes (suffix k, m, g or t, with iB or B allowed)";
                    unparsed(warn, var, v, expected, &LimitName(d.tunables.memory_limit));
                }
            },
        }
    }
    if let Some(on) = switch(&get, warn, c"FALLOW_PRESSURE", ["auto", "off"], d.tunables.pressure) {
        c.tunables.pressure = on;
    }
    cache_settings(&get, warn, c, &d);
    if let Some(on) = switch(&get, warn, c"FALLOW_SMALL", ["1", "0"], d.small_objects) {
        c.small_objects = on;
    }
    if let Some(on) = switch(&get, warn, c"FALLOW_SMALL_TRIM", ["1", "0"], d.small_trim) {
        c.small_trim = on;
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

/// A switch `var` spelled `words` (on, off): `None` when unset; another word is the default
/// `default` (one warning naming both words).
fn switch<'a>(
    get: &impl Fn(&CStr) -> Option<&'a [u8]>,
    warn: &mut dyn FnMut(&[u8]),
    var: &CStr,
    [on, off]: [&str; 2],
    default: bool,
) -> Option<bool> {
    let v = get(var)?;
    if v == on.as_bytes() || v == off.as_bytes() {
        return Some(v == on.as_bytes());
    }
    let name = var.to_str().unwrap_or("FALLOW_?");
    let what = format_args!("is not one of {on}, {off}");
    warn_line(warn, name, v, what, format_args!("the default {}", if default { on } else { off }));
    None
}

/// A whole number from `min` to `max` for `var`: `None` when unset; a value out of range is the
/// nearest bound (one warning), one that does not parse the default `default` (one warning).
fn ranged<'a>(
    get: &impl Fn(&CStr) -> Option<&'a [u8]>,
    warn: &mut dyn FnMut(&[u8]),
    var: &CStr,
    (min, max): (u32, u32),
    default: u32,
) -> Option<u32> {
    let v = get(var)?;
    let name = var.to_str().unwrap_or("FALLOW_?");
    match parse_size(v).filter(|_| v.iter().all(u8::is_ascii_digit)) {
        Some(n) if n < min as usize => {
            adjusted(warn, name, v, format_args!("is below {min}"), min as usize);
            Some(min)
        }
        Some(n) if n > max as usize => {
            adjusted(warn, name, v, format_args!("is above {max}"), max as usize);
            Some(max)
        }
        Some(n) => Some(n as u32),
        None => {
            unparsed(warn, name, v, "a whole number", &default);
            Some(default)
        }
    }
}

/// The per-thread caches' variables over `c` (`d`: the configuration given, whose values are the
/// defaults). The high mark comes first: the batch is checked against the one in effect.
fn cache_settings<'a>(
    get: &impl Fn(&CStr) -> Option<&'a [u8]>,
    warn: &mut dyn FnMut(&[u8]),
    c: &mut Config,
    d: &Config,
) {
    if let Some(on) = switch(get, warn, c"FALLOW_CACHE", ["on", "off"], d.cache) {
        c.cache = on;
    }
    let order = (0, CACHE_ORDER_LIMIT as u32);
    if let Some(n) = ranged(get, warn, c"FALLOW_CACHE_MAX_ORDER", order, d.cache_max_order as u32) {
        c.cache_max_order = n as u8;
    }
    let high = (CACHE_HIGH_PAGES_MIN, CACHE_HIGH_PAGES_MAX);
    if let Some(n) = ranged(get, warn, c"FALLOW_CACHE_HIGH_PAGES", high, d.cache_high_pages) {
        c.cache_high_pages = n;
    }
    // The batch's default is the given one, capped by a high mark the environment set (a given
    // configuration that is itself out of range stays so, for `Config::validate` to refuse).
    let batch_default = if c.cache_high_pages != d.cache_high_pages {
        d.cache_batch_pages.min(c.cache_high_pages)
    } else {
        d.cache_batch_pages
    };
    let batch = (1, c.cache_high_pages);
    let var = c"FALLOW_CACHE_BATCH_PAGES";
    c.cache_batch_pages = ranged(get, warn, var, batch, batch_default).unwrap_or(batch_default);
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

/// A memory limit: `parse_size`'s forms, plus `t`, each suffix optionally followed by `iB` or
/// `B` (`2GiB`, `512MB`, `512m`).
fn parse_limit(v: &[u8]) -> Option<u64> {
    let lower = |b: &u8| b.to_ascii_lowercase();
    let n = v.len();
    let v = if n > 3 && v[n - 2..].iter().map(lower).eq(*b"ib") && v[n - 3].is_ascii_alphabetic() {
        &v[..n - 2]
    } else if n > 2 && lower(&v[n - 1]) == b'b' && v[n - 2].is_ascii_alphabetic() {
        &v[..n - 1]
    } else {
        v
    };
    match v.last() {
        Some(b't' | b'T') => parse_size(&v[..v.len() - 1])?.checked_mul(1 << 40).map(|x| x as u64),
        _ => parse_size(v).map(|x| x as u64),
    }
}

#[cfg(test)]
mod tests;
