//! The peers: every allocator an experiment compares, behind one small interface.
//!
//! All peers live in one process and are called directly (none is the global allocator):
//! glibc through `libc::malloc`, jemalloc through its prefixed symbols (`_rjem_*`), mimalloc
//! through `mi_*`, `mmap` as a fresh anonymous mapping per request (the kernel's own zeroing on
//! first touch), and fallow as an `Allocator` per peer built from [`fallow_config`].
//!
//! The fallow variants differ in their configuration (`fallow_config`), and `fallow-delay` also in
//! the environment of the processes that run it (`PeerKind::guest_env`): it returns free memory on
//! the reporting delay alone, with the soft memory limit and the pressure signal turned off
//! (`FALLOW_MEMORY_LIMIT=off`, `FALLOW_PRESSURE=off`), which the guests of the pressure
//! experiment read when they build their allocator. In this process it is configured as `fallow`:
//! the in-process experiments put no memory under pressure.
//!
//! `tcmalloc` and `fallow-small` (fallow's preload library, `FALLOW_SMALL=1`) are preloaded peers
//! (`PeerKind::PRELOADED`): they only run in a child process with their library in `LD_PRELOAD`
//! (`experiments/preloaded.rs`), where the C library's `malloc` symbols resolve to it; everywhere
//! else building one is an error.
//!
//! Invariants: a pointer is freed by the peer that gave it, with the size it was asked for; a
//! peer never frees memory that an experiment still touches. A `Peer` is `Sync`: the malloc-like
//! libraries are thread-safe and a fallow `Allocator` is shared by its clones.

use fallow::{Allocator, Flags};

/// Which allocator, and for fallow which variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerKind {
    Glibc,
    Jemalloc,
    Mimalloc,
    Mmap,
    Fallow,
    FallowDelay,
    FallowNozero,
    FallowNoreport,
    FallowNoworkers,
    FallowThp,
    Tcmalloc,
    FallowSmall,
}

impl PeerKind {
    pub const ALL: [PeerKind; 10] = [
        PeerKind::Glibc,
        PeerKind::Jemalloc,
        PeerKind::Mimalloc,
        PeerKind::Mmap,
        PeerKind::Fallow,
        PeerKind::FallowDelay,
        PeerKind::FallowNozero,
        PeerKind::FallowNoreport,
        PeerKind::FallowNoworkers,
        PeerKind::FallowThp,
    ];

    /// The peers that are a library preloaded into a child process, not linked in: runnable only
    /// by the experiments that start a process per measurement (`Experiment::in_children`).
    pub const PRELOADED: [PeerKind; 2] = [PeerKind::Tcmalloc, PeerKind::FallowSmall];

    /// Every peer, in the tables' order (tcmalloc after the malloc-like libraries, fallow-small
    /// after the other fallow variants).
    pub fn every() -> impl Iterator<Item = PeerKind> {
        let p = &PeerKind::PRELOADED;
        PeerKind::ALL[..3].iter().chain(&p[..1]).chain(&PeerKind::ALL[3..]).chain(&p[1..]).copied()
    }

    /// The library a preloaded peer's processes get in `LD_PRELOAD`, as `launch::peer_library`
    /// names it; `None` for the peers linked into this binary.
    pub fn preload(self) -> Option<&'static str> {
        match self {
            PeerKind::Tcmalloc => Some("tcmalloc"),
            PeerKind::FallowSmall => Some("fallow"),
            _ => None,
        }
    }

    /// The name on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            PeerKind::Glibc => "glibc",
            PeerKind::Jemalloc => "jemalloc",
            PeerKind::Mimalloc => "mimalloc",
            PeerKind::Mmap => "mmap",
            PeerKind::Fallow => "fallow",
            PeerKind::FallowDelay => "fallow-delay",
            PeerKind::FallowNozero => "fallow-nozero",
            PeerKind::FallowNoreport => "fallow-noreport",
            PeerKind::FallowNoworkers => "fallow-noworkers",
            PeerKind::FallowThp => "fallow-thp",
            PeerKind::Tcmalloc => "tcmalloc",
            PeerKind::FallowSmall => "fallow-small",
        }
    }

    /// The JSON `allocator` field.
    pub fn allocator(self) -> &'static str {
        match self {
            PeerKind::Fallow
            | PeerKind::FallowDelay
            | PeerKind::FallowNozero
            | PeerKind::FallowNoreport
            | PeerKind::FallowNoworkers
            | PeerKind::FallowThp
            | PeerKind::FallowSmall => "fallow",
            other => other.name(),
        }
    }

    /// The JSON `variant` field.
    pub fn variant(self) -> &'static str {
        match self {
            PeerKind::FallowDelay => "delay",
            PeerKind::FallowNozero => "nozero",
            PeerKind::FallowNoreport => "noreport",
            PeerKind::FallowNoworkers => "noworkers",
            PeerKind::FallowThp => "thp",
            PeerKind::FallowSmall => "small",
            _ => "default",
        }
    }

    pub fn fallow_variant(self) -> Option<FallowVariant> {
        match self {
            PeerKind::Fallow => Some(FallowVariant::Default),
            PeerKind::FallowDelay => Some(FallowVariant::Delay),
            PeerKind::FallowNozero => Some(FallowVariant::NoZero),
            PeerKind::FallowNoreport => Some(FallowVariant::NoReport),
            PeerKind::FallowNoworkers => Some(FallowVariant::NoWorkers),
            PeerKind::FallowThp => Some(FallowVariant::Huge),
            _ => None,
        }
    }

    /// What a process running this peer has in its environment over its parent's: for
    /// `fallow-delay`, the soft memory limit and the pressure signal off. The other peers get
    /// their parent's environment as it is (so `FALLOW_MEMORY_LIMIT=64MiB` before the command
    /// tries that setting with `fallow`; unset, the defaults apply).
    pub fn guest_env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            PeerKind::FallowDelay => &[("FALLOW_MEMORY_LIMIT", "off"), ("FALLOW_PRESSURE", "off")],
            PeerKind::FallowThp => &[("FALLOW_THP", "1")],
            PeerKind::FallowSmall => &[("FALLOW_SMALL", "1")],
            _ => &[],
        }
    }

    pub fn parse(s: &str) -> Option<PeerKind> {
        PeerKind::every().find(|k| k.name() == s)
    }

    /// Parse a comma-separated list; `all` means every peer linked into this binary (`ALL`).
    pub fn parse_list(s: &str) -> Result<Vec<PeerKind>, String> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "all" {
                out.extend(PeerKind::ALL);
                continue;
            }
            match PeerKind::parse(part) {
                Some(k) => out.push(k),
                None => {
                    let names: Vec<&str> = PeerKind::every().map(|k| k.name()).collect();
                    return Err(format!("unknown allocator '{part}' (known: {}, all)", names.join(", ")));
                }
            }
        }
        out.dedup();
        if out.is_empty() {
            return Err("the allocator list is empty".into());
        }
        Ok(out)
    }
}

/// The fallow variants the experiments compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallowVariant {
    /// Every default.
    Default,
    /// Every default in this process; its guests return memory on the delay alone (the limit
    /// and the pressure triggers off through their environment, `PeerKind::guest_env`).
    Delay,
    /// Background pre-zeroing off.
    NoZero,
    /// Free page reporting off.
    NoReport,
    /// Both background workers off (no pre-zeroing, no reporting): fallow's allocation paths alone.
    NoWorkers,
    /// Every default but transparent huge pages (`Config::thp` on, `FALLOW_THP=1`): a block
    /// physically contiguous per 2 MiB and a sixth of the faults, where the default's 4 KiB pages
    /// are scattered over the caches' sets as the kernel happens to hand them out.
    Huge,
}

/// The fallow configuration of a variant, for an experiment that needs `arena_size` bytes of
/// address space per arena. `all_huge` (pin's `--thp`: huge pages for every peer) turns
/// `Config::thp` on; otherwise a variant keeps fallow's default, as a user gets it (4 KiB
/// pages), but `Huge`.
///
/// This is the one place where the variants differ in this process: `NoZero` turns pre-zeroing off, `NoReport`
/// turns reporting off, `NoWorkers` turns both off (so that no background thread is started), `Huge` asks for huge pages.
pub fn fallow_config(variant: FallowVariant, arena_size: usize, all_huge: bool) -> fallow::Config {
    let default = fallow::Config::default();
    let config = fallow::Config { arena_size, thp: all_huge || default.thp, ..default };
    let t = config.tunables;
    match variant {
        FallowVariant::Default | FallowVariant::Delay => config,
        FallowVariant::Huge => fallow::Config { thp: true, ..config },
        FallowVariant::NoZero => fallow::Config { tunables: fallow::Tunables { zeroing: false, ..t }, ..config },
        FallowVariant::NoReport => fallow::Config { tunables: fallow::Tunables { report: false, ..t }, ..config },
        FallowVariant::NoWorkers => {
            fallow::Config { tunables: fallow::Tunables { zeroing: false, report: false, ..t }, ..config }
        }
    }
}

/// What an experiment needs of the fallow peers' arenas.
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    /// The largest total the experiment holds at once, in bytes.
    pub working_set: usize,
    /// Huge pages for every peer (pin's `--thp`): the malloc-like peers advise their large
    /// blocks `MADV_HUGEPAGE`, every fallow variant but `fallow-thp` has `Config::thp`. Without it each
    /// peer runs as its users get it: fallow on huge pages (its default) but `fallow-thp`.
    pub thp: bool,
}

pub struct Peer {
    pub kind: PeerKind,
    imp: Imp,
    thp: bool,
}

/// What `alloc` and `free` dispatch on: one match gives every peer its call, and a fallow peer
/// its allocator (no `Option` to unwrap on the way, which the other peers do not pay).
enum Imp {
    Glibc,
    Jemalloc,
    Mimalloc,
    Mmap,
    Fallow(Allocator),
}

/// A C library's `malloc` and `free` (`Peer::c_calls`).
pub type CMalloc = unsafe extern "C" fn(usize) -> *mut libc::c_void;
pub type CFree = unsafe extern "C" fn(*mut libc::c_void);

pub const PAGE: usize = 4096;
const HUGE: usize = 2 << 20;

impl Peer {
    pub fn new(kind: PeerKind, setup: Setup) -> Result<Peer, String> {
        Peer::build(kind, setup, false)
    }

    /// As `new`, but a fallow variant's configuration has the process's `FALLOW_*` environment
    /// applied over it, as the C library's `fallow_create_from_env` does (a bad value: one
    /// warning on stderr, then the variant's own value). For guest processes, whose environment
    /// `PeerKind::guest_env` sets.
    pub fn from_environment(kind: PeerKind, setup: Setup) -> Result<Peer, String> {
        Peer::build(kind, setup, true)
    }

    fn build(kind: PeerKind, setup: Setup, env: bool) -> Result<Peer, String> {
        let imp = match (kind, kind.fallow_variant()) {
            (_, Some(v)) => {
                // One arena holds the whole working set twice over (room for a grown copy); at
                // least the largest block (1 GiB by default), which is address space only.
                let arena = setup.working_set.saturating_mul(2).max(1 << 30);
                let mut cfg = fallow_config(v, arena, setup.thp);
                if env {
                    cfg = fallow::binding_support::env::from_environment(cfg).config;
                }
                Imp::Fallow(Allocator::new(cfg).map_err(|e| format!("{}: {e}", kind.name()))?)
            }
            (PeerKind::Glibc, None) => Imp::Glibc,
            (PeerKind::Jemalloc, None) => Imp::Jemalloc,
            (PeerKind::Mimalloc, None) => Imp::Mimalloc,
            (PeerKind::Mmap, None) => Imp::Mmap,
            // The C library's calls, which resolve to the preloaded library's when it is there.
            (PeerKind::Tcmalloc, None) if preloaded(c"tc_malloc") => Imp::Glibc,
            (PeerKind::FallowSmall, None) if preloaded(c"fallow_preload_stats") => Imp::Glibc,
            (k @ (PeerKind::Tcmalloc | PeerKind::FallowSmall), None) => {
                return Err(format!("{} is a preloaded library: only the experiments that run every peer in a process \
                                    of its own (large, mixed, small, burst) can measure it", k.name()))
            }
            (k, None) => unreachable!("{k:?} is a fallow variant"),
        };
        Ok(Peer { kind, imp, thp: setup.thp })
    }

    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    pub fn fallow(&self) -> Option<&Allocator> {
        match &self.imp {
            Imp::Fallow(a) => Some(a),
            _ => None,
        }
    }

    /// The plain `malloc` and `free` of a malloc-like peer (glibc, jemalloc, mimalloc), for a loop
    /// that calls them as a program does, without `alloc`'s dispatch; `None` for the others.
    pub fn c_calls(&self) -> Option<(CMalloc, CFree)> {
        match self.imp {
            Imp::Glibc => Some((libc::malloc, libc::free)),
            Imp::Jemalloc => Some((tikv_jemalloc_sys::malloc, tikv_jemalloc_sys::free)),
            Imp::Mimalloc => Some((libmimalloc_sys::mi_malloc, libmimalloc_sys::mi_free)),
            Imp::Mmap | Imp::Fallow(_) => None,
        }
    }

    /// Give a malloc-like peer's free memory back to the kernel (glibc `malloc_trim(0)`, jemalloc
    /// `arena.<all>.purge`, mimalloc `mi_collect(true)`), so that its next requests are served from
    /// pages the kernel hands out anew, as a fresh fallow `Allocator`'s are: which physical pages
    /// back a buffer changes a loop over it by several per cent on this machine (8 MiB `memset`,
    /// two buffers in one process: one 7% faster than the other, run after run), and a peer that
    /// kept its pages for a whole run would carry one draw of that luck into every measurement.
    /// Nothing for fallow and mmap, whose peers are made anew.
    pub fn return_free_memory(&self) {
        match self.imp {
            // SAFETY: `malloc_trim` only releases free memory of glibc's heaps.
            Imp::Glibc => unsafe {
                libc::malloc_trim(0);
            },
            // SAFETY: a NUL-terminated control name, no old or new value (`arena.4096` is
            // `MALLCTL_ARENAS_ALL`): a purge of every arena's unused dirty pages.
            Imp::Jemalloc => unsafe {
                tikv_jemalloc_sys::mallctl(c"arena.4096.purge".as_ptr(), core::ptr::null_mut(), core::ptr::null_mut(), core::ptr::null_mut(), 0);
            },
            // SAFETY: `mi_collect` has no preconditions; `true` also frees what other threads freed.
            Imp::Mimalloc => unsafe { libmimalloc_sys::mi_collect(true) },
            Imp::Mmap | Imp::Fallow(_) => {}
        }
    }

    /// Allocate `size` bytes; `zero` asks for zeroed memory (calloc); `populate` lets the
    /// allocator make the pages resident if it can (fallow only: the others are touched by the
    /// caller). Null on failure.
    pub fn alloc(&self, size: usize, zero: bool, populate: bool) -> *mut u8 {
        // SAFETY: allocation calls with no preconditions beyond their arguments' types: the
        // malloc-like calls take any size, `mmap` asks for a fresh private anonymous mapping at no
        // fixed address (it cannot replace an existing one); fallow's `alloc` is safe.
        let p = unsafe {
            match &self.imp {
                Imp::Glibc => {
                    if zero {
                        libc::calloc(1, size) as *mut u8
                    } else {
                        libc::malloc(size) as *mut u8
                    }
                }
                Imp::Jemalloc => {
                    if zero {
                        tikv_jemalloc_sys::calloc(1, size) as *mut u8
                    } else {
                        tikv_jemalloc_sys::malloc(size) as *mut u8
                    }
                }
                Imp::Mimalloc => {
                    if zero {
                        libmimalloc_sys::mi_calloc(1, size) as *mut u8
                    } else {
                        libmimalloc_sys::mi_malloc(size) as *mut u8
                    }
                }
                Imp::Mmap => {
                    let p = libc::mmap(
                        core::ptr::null_mut(),
                        size,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    );
                    if p == libc::MAP_FAILED {
                        core::ptr::null_mut()
                    } else {
                        p as *mut u8
                    }
                }
                Imp::Fallow(a) => {
                    // One test for the plain request, as the others' `zero` (calloc or malloc);
                    // its flags are then a constant.
                    if zero || populate {
                        fallow_alloc_flags(a, size, zero, populate)
                    } else {
                        match a.alloc(size, PAGE, Flags::NONE) {
                            Ok(p) => p.as_ptr(),
                            Err(_) => core::ptr::null_mut(),
                        }
                    }
                }
            }
        };
        if self.thp && !p.is_null() && self.fallow().is_none() && size >= HUGE {
            // The malloc-like peers get huge pages the way a program asks for them.
            let start = (p as usize).next_multiple_of(HUGE);
            let end = (p as usize + size) & !(HUGE - 1);
            if end > start {
                // SAFETY: `[start, end)` lies inside the `size` bytes just allocated at `p`
                // (rounded inwards to huge pages), and MADV_HUGEPAGE is only a hint that never
                // changes the contents of the range.
                unsafe { libc::madvise(start as *mut _, end - start, libc::MADV_HUGEPAGE) };
            }
        }
        p
    }

    /// Free what `alloc` (or `grow`) gave for `size` bytes.
    ///
    /// # Safety
    /// `p` is null, or came from this peer's `alloc` or `grow` of `size` bytes, is freed once,
    /// and is not touched afterwards (the malloc-like peers and `munmap` trust it blindly).
    pub unsafe fn free(&self, p: *mut u8, size: usize) {
        if p.is_null() {
            return;
        }
        // SAFETY: the caller's contract: `p` came from this peer's `alloc`/`grow` of `size`
        // bytes, is freed once, and is no longer touched. (Fallow's `free` validates `p` anyway.)
        unsafe {
            match &self.imp {
                Imp::Glibc => libc::free(p as *mut _),
                Imp::Jemalloc => tikv_jemalloc_sys::free(p as *mut _),
                Imp::Mimalloc => libmimalloc_sys::mi_free(p as *mut _),
                Imp::Mmap => {
                    libc::munmap(p as *mut _, size);
                }
                Imp::Fallow(a) => {
                    if let Err(e) = a.free(p) {
                        self.free_failed(e);
                    }
                }
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn free_failed(&self, e: fallow::Error) -> ! {
        eprintln!("fallow: {}: free failed: {e}", self.name());
        std::process::exit(1);
    }

    /// Grow a block of `old` bytes to `new` bytes, keeping its contents (realloc). Null on failure
    /// (the old block is then still live).
    ///
    /// # Safety
    /// `p` is a live block of `old` bytes from this peer's `alloc` or `grow`, `new >= old`, and
    /// nobody else uses it during the call; afterwards the caller uses the block returned, or
    /// `p` only if null was returned.
    pub unsafe fn grow(&self, p: *mut u8, old: usize, new: usize) -> *mut u8 {
        // SAFETY: the caller's contract: `p` is a live block of `old` bytes from this peer, which
        // the realloc calls and `move_grow` consume.
        unsafe {
            match &self.imp {
                Imp::Glibc => libc::realloc(p as *mut _, new) as *mut u8,
                Imp::Jemalloc => tikv_jemalloc_sys::realloc(p as *mut _, new) as *mut u8,
                Imp::Mimalloc => libmimalloc_sys::mi_realloc(p as *mut _, new) as *mut u8,
                Imp::Mmap => self.move_grow(p, old, new),
                Imp::Fallow(a) => {
                    match a.resize_in_place(p, new) {
                        Ok(true) => p,
                        _ => self.move_grow(p, old, new),
                    }
                }
            }
        }
    }

    /// A new block, a copy, a free: what `mmap` and fallow do when they cannot grow in place.
    ///
    /// # Safety
    ///
    /// `p` is a live block of `old` bytes from this peer's `alloc` (or `grow`), not used again by
    /// the caller unless null is returned; on success it is freed here.
    unsafe fn move_grow(&self, p: *mut u8, old: usize, new: usize) -> *mut u8 {
        let q = self.alloc(new, false, false);
        if q.is_null() {
            return q;
        }
        // SAFETY: `p` is readable for `old` bytes (the contract above), `q` is a fresh block of
        // `new` bytes, distinct from `p` since `p` is still live; `old.min(new)` fits both.
        unsafe { core::ptr::copy_nonoverlapping(p, q, old.min(new)) };
        // SAFETY: `p` is this peer's live block of `old` bytes (the contract above), copied and
        // not used again.
        unsafe { self.free(p, old) };
        q
    }
}

/// Whether this process has `symbol` (one only a preloaded library defines): the library is loaded.
fn preloaded(symbol: &std::ffi::CStr) -> bool {
    // SAFETY: `dlsym` with `RTLD_DEFAULT` and a NUL-terminated name only looks the symbol up in
    // the libraries already loaded; the address is compared with null, never called.
    !unsafe { libc::dlsym(libc::RTLD_DEFAULT, symbol.as_ptr()) }.is_null()
}

/// A fallow allocation with flags (calloc-like or populated), out of line as the other peers'
/// calloc.
#[inline(never)]
fn fallow_alloc_flags(a: &Allocator, size: usize, zero: bool, populate: bool) -> *mut u8 {
    let mut flags = Flags::NONE;
    if zero {
        flags = flags | Flags::ZERO;
    }
    if populate {
        flags = flags | Flags::POPULATE;
    }
    match a.alloc(size, PAGE, flags) {
        Ok(p) => p.as_ptr(),
        Err(_) => core::ptr::null_mut(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallow_peers_run_as_users_get_them() {
        let default = fallow::Config::default();
        for kind in PeerKind::ALL {
            let Some(v) = kind.fallow_variant() else { continue };
            let huge = kind == PeerKind::FallowThp;
            // Without `--thp`, the page size a user of the variant gets; with it, huge pages.
            assert_eq!(fallow_config(v, 1 << 30, false).thp, default.thp || huge, "{}", kind.name());
            assert!(fallow_config(v, 1 << 30, true).thp, "{}", kind.name());
        }
        assert!(!default.thp, "the default is 4 KiB pages");
    }

    #[test]
    fn every_peer_allocates_zeroes_grows_and_frees() {
        for kind in PeerKind::ALL {
            let p = Peer::new(kind, Setup { working_set: 8 << 20, thp: false }).unwrap();
            let n = 3 << 20;
            let b = p.alloc(n, false, false);
            assert!(!b.is_null(), "{}", kind.name());
            // SAFETY: `b` is a non-null (asserted) live block of `n` bytes from `p.alloc`, freed once
            // after the write and not used again.
            unsafe {
                core::ptr::write_bytes(b, 0xee, n);
                p.free(b, n);
            }
            let z = p.alloc(n, true, true);
            assert!(!z.is_null());
            // SAFETY: `z` is a non-null live block of `n` bytes asked for zeroed, so initialised;
            // no writes happen while `s` is alive.
            let s = unsafe { core::slice::from_raw_parts(z, n) };
            assert!(s.iter().all(|&x| x == 0), "{}: zeroed allocation had garbage", kind.name());
            // SAFETY: `z` is still a live block of `n` bytes (`s` is no longer used), grown once and
            // not used after the grow.
            let g = unsafe {
                core::ptr::write_bytes(z, 7, n);
                p.grow(z, n, 2 * n)
            };
            assert!(!g.is_null());
            // SAFETY: `g` is a non-null live block of `2 * n` bytes whose first `n` were copied
            // (or kept) from `z`, so initialised; `z` is not used after the grow.
            let s = unsafe { core::slice::from_raw_parts(g, n) };
            assert!(s.iter().all(|&x| x == 7), "{}: grow lost the contents", kind.name());
            // SAFETY: `g` is the peer's live block of `2 * n` bytes (`s` is no longer used), freed once.
            unsafe { p.free(g, 2 * n) };
        }
    }

    #[test]
    fn peer_lists_parse() {
        assert_eq!(PeerKind::parse_list("all").unwrap().len(), PeerKind::ALL.len());
        assert_eq!(
            PeerKind::parse_list("glibc, fallow-nozero").unwrap(),
            vec![PeerKind::Glibc, PeerKind::FallowNozero]
        );
        assert!(PeerKind::parse_list("glibc,hoard").unwrap_err().contains("hoard"));
        // tcmalloc is known, but not among `all` (the peers linked in), and cannot run here,
        // where it is not preloaded.
        assert_eq!(PeerKind::parse_list("tcmalloc").unwrap(), vec![PeerKind::Tcmalloc]);
        assert!(!PeerKind::parse_list("all").unwrap().contains(&PeerKind::Tcmalloc));
        let e = Peer::new(PeerKind::Tcmalloc, Setup { working_set: 1 << 20, thp: false }).err().unwrap();
        assert!(e.contains("preloaded"), "{e}");
        assert_eq!(PeerKind::every().count(), PeerKind::ALL.len() + PeerKind::PRELOADED.len());
        assert!(PeerKind::parse_list(",").is_err());
        for k in PeerKind::every() {
            assert_eq!(PeerKind::parse(k.name()), Some(k));
        }
    }

    #[test]
    fn fallow_delay_turns_the_limit_and_the_pressure_triggers_off_in_its_processes() {
        let env = |k: PeerKind, var: &str| k.guest_env().iter().find(|(v, _)| *v == var).map(|(_, x)| *x);
        for var in ["FALLOW_MEMORY_LIMIT", "FALLOW_PRESSURE"] {
            assert_eq!(env(PeerKind::FallowDelay, var), Some("off"));
        }
        // The others run with their parent's environment (unset there: the defaults).
        assert!(PeerKind::Fallow.guest_env().is_empty() && PeerKind::Glibc.guest_env().is_empty());
        assert_eq!(PeerKind::parse_list("fallow-delay").unwrap(), vec![PeerKind::FallowDelay]);
        assert_eq!((PeerKind::FallowDelay.allocator(), PeerKind::FallowDelay.variant()), ("fallow", "delay"));
    }
}
