//! The soft memory limit and memory pressure, as the reporting worker watches them (`Watch`):
//! where the limit comes from, what it is compared with, which pressure signal is registered,
//! and what the reporter must give back now (`Squeeze`). The reporter owns its `Watch` (one
//! per reporter thread); the zeroing worker only reads `Shared::squeezed`.
//!
//! Rules (docs/design.md, "Memory limit and pressure"):
//! - The limit and the signal are the reporter's: with reporting off there is neither.
//! - A set limit (`MemoryLimit::Bytes`) is compared with fallow's own resident memory, computed
//!   under the lock from counters (`Heap::owned_resident_pages`: live blocks and free pages not
//!   reported). A cgroup's limit (`MemoryLimit::Auto`) is the cgroup's limit less a margin for
//!   what fallow does not own (`cgroup_margin`), compared with the cgroup's usage less its
//!   inactive file cache, read at most every `PERIOD_NS` (`NEAR_PERIOD_NS` within a margin of
//!   the limit in force): several processes may share the
//!   cgroup, and only its usage says how close all of them are to its limit. The cgroup's limit
//!   is looked up again every `CGROUP_PERIOD_NS` (10 s): it may be changed at run time.
//! - Once the usage passes the limit (a "hit"), the reporter gives free memory back without
//!   waiting for the delay until the usage is `1/32` of the limit below it (hysteresis, so that
//!   the next allocations do not cross again at once), or nothing is left. A block freed within
//!   `zero_delay_ms` is hot (the program is reusing it) and waits that long even then.
//! - Pressure: a PSI trigger ("some" 150 ms in a 1 s window, or 300 ms in 2 s where the 1 s
//!   window is refused) on the cgroup's `memory.pressure` (v2), else `/proc/pressure/memory`;
//!   where neither can be registered, `MemAvailable` below a sixteenth of `MemTotal`, read at
//!   most once a second. Pressure lasts two trigger windows after the last event (while
//!   `MemAvailable` stays low, for polling); meanwhile all idle free memory goes back, the zeroed
//!   reserve first, and then the delay-based policy resumes.
//! - The limit never fails an allocation: it only makes the reporter hurry.
//!
//! Nothing here allocates: files are read by `os` into stack buffers.

use core::sync::atomic::Ordering;

use crate::config::MemoryLimit;
use crate::heap::{Heap, Shared};
use crate::os::{self, PAGE_SHIFT};
use crate::stats::{SIGNAL_MEMAVAILABLE, SIGNAL_NONE, SIGNAL_OFF, SIGNAL_PSI_CGROUP, SIGNAL_PSI_SYSTEM};
use crate::stats::{SOURCE_NONE, SOURCE_SETTING, SOURCE_V1, SOURCE_V2_HIGH, SOURCE_V2_MAX};

/// How often, at most, the reporter looks at the limit and the PSI trigger while it waits for
/// blocks to age, and reads a cgroup's usage: the limit is obeyed within this period.
pub(crate) const PERIOD_NS: u64 = 100_000_000;
/// The period near a cgroup's limit: once its usage is within a margin of the limit in force
/// (so within two of the cgroup's own limit), a process that starts touching memory can cross
/// it within a few tens of ms, before a 100 ms look. A read of the usage costs a few
/// microseconds: at this rate, under 0.1% of a CPU.
const NEAR_PERIOD_NS: u64 = 10_000_000;
/// How often a cgroup's limit is looked up again (it may be changed, or the process moved).
const CGROUP_PERIOD_NS: u64 = 10_000_000_000;
/// How often, at most, `MemAvailable` is read (the fallback signal).
const MEMINFO_PERIOD_NS: u64 = 1_000_000_000;

/// The margin kept below a cgroup's limit for what fallow does not own (the program's other
/// memory, the kernel's for the cgroup, other processes in it) and for the reporter's reaction
/// time, while another process of the cgroup may be touching memory: a quarter of the limit, at
/// least 16 MiB and at most 2 GiB, and never more than half the limit. (An eighth left a guest of
/// `fallow bench pressure` OOM-killed now and then: another guest touching 1-2 GiB/s crosses an
/// eighth of a few hundred MiB before a reporter's 10 ms look and its batch have given back.)
pub(crate) fn cgroup_margin(limit: u64) -> u64 {
    (limit / 4).clamp(16 << 20, 2 << 30).min(limit / 2)
}

/// What the reporter must give back now, beyond what the delay gives.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Squeeze {
    /// Pages to give back because the limit was passed (0: below it, or back below).
    pub excess_pages: u64,
    /// Memory pressure: every idle free block goes back.
    pub pressure: bool,
}

impl Squeeze {
    pub(crate) fn urgent(&self) -> bool {
        self.excess_pages > 0 || self.pressure
    }
}

/// What the limit is compared with.
enum Measure {
    None,
    /// A set limit, against fallow's own resident memory.
    Own { limit: u64 },
    /// A cgroup's limit less the margin, against the cgroup's usage (`Watch::cgroup`).
    Cgroup { limit: u64 },
}

/// The reporter's view of the limit and of pressure (see the top of this file).
pub(crate) struct Watch {
    /// The settings the limit and the signal were resolved for, and when.
    resolved: Option<(MemoryLimit, bool)>,
    resolved_ns: u64,
    measure: Measure,
    /// The cgroup whose limit is in force (with `Measure::Cgroup`).
    cgroup: Option<os::CgroupMemory>,
    /// The cgroup's usage last read, less what was reported since.
    usage: u64,
    usage_read_ns: u64,
    /// The usage passed the limit and has not come back below the hysteresis mark yet.
    over: bool,
    hits: u64,
    signal: u64,
    psi_fd: i32,
    psi_id: u64,
    window_ns: u64,
    pressure_until_ns: u64,
    meminfo_read_ns: u64,
    low_memory: bool,
    events: u64,
}

impl Watch {
    pub(crate) fn new() -> Watch {
        Watch {
            resolved: None,
            resolved_ns: 0,
            measure: Measure::None,
            cgroup: None,
            usage: 0,
            usage_read_ns: 0,
            over: false,
            hits: 0,
            signal: SIGNAL_OFF,
            psi_fd: -1,
            psi_id: 0,
            window_ns: 0,
            pressure_until_ns: 0,
            meminfo_read_ns: 0,
            low_memory: false,
            events: 0,
        }
    }

    /// Resolve the limit and register the pressure signal if the settings changed since the last
    /// time (at the reporter's start, and after `set_tunables`), a cgroup's limit also every
    /// `CGROUP_PERIOD_NS`, and publish them in the statistics. Reads files without the lock.
    pub(crate) fn refresh(&mut self, s: &Shared) {
        let t = s.heap.lock().tunables;
        let want = (t.memory_limit, t.pressure && t.report);
        let now = os::now_ns();
        let stale = want.0 == MemoryLimit::Auto && now.saturating_sub(self.resolved_ns) >= CGROUP_PERIOD_NS;
        if self.resolved == Some(want) && !stale {
            return;
        }
        let (limit, pressure) = want;
        let limit_changed = self.resolved.is_none_or(|(l, _)| l != limit) || stale;
        self.resolved_ns = now;
        let before = self.limit();
        let pressure_changed = self.resolved.is_none_or(|(_, p)| p != pressure);
        self.resolved = Some(want);
        let mut source = SOURCE_NONE;
        if limit_changed {
            self.usage_read_ns = 0;
            self.cgroup = None;
            self.measure = match limit {
                MemoryLimit::Off => Measure::None,
                MemoryLimit::Bytes(n) => {
                    source = SOURCE_SETTING;
                    Measure::Own { limit: n }
                }
                MemoryLimit::Auto => match os::cgroup_memory() {
                    None => Measure::None,
                    Some(cg) => {
                        source = match cg.file {
                            os::CgroupLimitFile::High => SOURCE_V2_HIGH,
                            os::CgroupLimitFile::Max => SOURCE_V2_MAX,
                            os::CgroupLimitFile::V1 => SOURCE_V1,
                        };
                        let usage = cg.usage().unwrap_or(0);
                        (self.usage, self.usage_read_ns) = (usage, os::now_ns());
                        self.cgroup = Some(cg);
                        Measure::Cgroup { limit: cg.limit - cgroup_margin(cg.limit) }
                    }
                },
            };
        }
        if self.limit() != before {
            self.over = false;
        }
        if pressure_changed {
            self.close_trigger(s);
            self.low_memory = false;
            self.pressure_until_ns = 0;
            self.signal = if pressure { self.register(s) } else { SIGNAL_OFF };
        }
        let mut h = s.heap.lock();
        if limit_changed {
            h.reclaim.memory_limit_bytes = self.limit().unwrap_or(0);
            h.reclaim.memory_limit_source = source;
            if self.limit().is_none() {
                h.reclaim.memory_limit_usage_bytes = 0;
            }
        }
        h.reclaim.pressure_signal = self.signal;
    }

    /// The PSI trigger of the cgroup, else the system's, else `MemAvailable` polling. The trigger
    /// is opened and published under the allocator lock, which `fork` holds (`before_fork`): a
    /// child gets the descriptor published in `psi_fd`, which it closes, or none at all, never
    /// one half-made. The paths are found before (the cgroup's takes a read of
    /// `/proc/self/cgroup`): under the lock, only the trigger's open and write.
    fn register(&mut self, s: &Shared) -> u64 {
        let (cgroup_file, system_file) = (os::cgroup_pressure_file(), os::system_pressure_file());
        let fork_guard = s.heap.lock();
        let cgroup = cgroup_file.and_then(|f| os::psi_trigger(&f).ok());
        let found = match cgroup {
            Some(t) => Some((t, SIGNAL_PSI_CGROUP)),
            None => os::psi_trigger(&system_file).ok().map(|t| (t, SIGNAL_PSI_SYSTEM)),
        };
        if let Some(((fd, window_ms), signal)) = found {
            self.psi_fd = fd;
            self.psi_id = os::file_id(fd).unwrap_or(0);
            self.window_ns = window_ms as u64 * 1_000_000;
            s.psi_id.store(self.psi_id, Ordering::Relaxed);
            s.psi_fd.store(fd, Ordering::Relaxed);
            return signal;
        }
        drop(fork_guard);
        if os::mem_available().is_some() {
            SIGNAL_MEMAVAILABLE
        } else {
            SIGNAL_NONE
        }
    }

    fn close_trigger(&mut self, s: &Shared) {
        if self.psi_fd >= 0 {
            self.psi_fd = -1;
            s.close_psi();
        }
    }

    fn limit(&self) -> Option<u64> {
        match self.measure {
            Measure::None => None,
            Measure::Own { limit } | Measure::Cgroup { limit } => Some(limit),
        }
    }

    /// How often to look: `NEAR_PERIOD_NS` when a cgroup's usage is within a margin of the limit
    /// in force, else `PERIOD_NS`.
    pub(crate) fn period_ns(&self) -> u64 {
        match (&self.measure, &self.cgroup) {
            (Measure::Cgroup { limit }, Some(cg)) if self.usage + (cg.limit - limit) > *limit => NEAR_PERIOD_NS,
            _ => PERIOD_NS,
        }
    }

    /// The reporter's wait for an idle CPU before a pass (`Shared::wait_for_idle_cpu`, at most
    /// `max_ns`), watched while a limit or a signal is: in steps of one period, ending early when
    /// one of them asks the reporter to hurry (unwatched, on a busy machine, it would be a second
    /// each pass in which a limit passed goes unseen).
    pub(crate) fn wait_for_idle_cpu(&mut self, s: &Shared, gate: &mut crate::worker::IdleGate, max_ns: u64) {
        if !self.watching() {
            s.wait_for_idle_cpu(&s.reporter, gate, max_ns);
            return;
        }
        let mut left = max_ns;
        while left > 0 {
            let step = left.min(self.period_ns());
            let t0 = os::now_ns();
            s.wait_for_idle_cpu(&s.reporter, gate, step);
            // Back before the step ran out: a CPU is idle, or a kick or the stop came.
            if os::now_ns() - t0 < step || s.reporter.stopping() {
                return;
            }
            left -= step;
            self.sample(s);
            if self.urgent_now(s) {
                return;
            }
        }
    }

    /// Whether the limit or pressure asks the reporter to hurry now (the lock only with a limit).
    fn urgent_now(&mut self, s: &Shared) -> bool {
        match self.measure {
            Measure::None => self.low_memory || os::now_ns() < self.pressure_until_ns,
            _ => self.squeeze(s, &mut s.heap.lock()).urgent(),
        }
    }

    /// Whether anything here can ask the reporter to hurry (then it naps in `PERIOD_NS` steps).
    pub(crate) fn watching(&self) -> bool {
        !matches!(self.measure, Measure::None) || self.psi_fd >= 0 || self.signal == SIGNAL_MEMAVAILABLE
    }

    /// Read what changes outside fallow, each at its own rate, without the lock: the cgroup's
    /// usage, the PSI trigger, `MemAvailable`, and a pressure event made by hand.
    pub(crate) fn sample(&mut self, s: &Shared) {
        let now = os::now_ns();
        if let (Measure::Cgroup { .. }, Some(cg)) = (&self.measure, &self.cgroup) {
            if now.saturating_sub(self.usage_read_ns) >= self.period_ns() {
                if let Some(u) = cg.usage() {
                    self.usage = u;
                }
                self.usage_read_ns = now;
            }
        }
        let mut event = s.pressure_injected.swap(false, Ordering::Relaxed);
        let hold = if self.window_ns > 0 { 2 * self.window_ns } else { 2_000_000_000 };
        if self.psi_fd >= 0 && os::psi_fired(self.psi_fd, self.psi_id) {
            event = true;
        }
        let meminfo_due = now.saturating_sub(self.meminfo_read_ns) >= MEMINFO_PERIOD_NS;
        if self.signal == SIGNAL_MEMAVAILABLE && meminfo_due {
            self.meminfo_read_ns = now;
            let low = os::mem_available().is_some_and(|(avail, total)| avail < total / 16);
            event |= low && !self.low_memory;
            self.low_memory = low;
        }
        if event {
            self.events += 1;
            self.pressure_until_ns = now + hold;
        }
    }

    /// Under the lock: compare the usage with the limit, say what must go back, and publish the
    /// figures (and `Shared::squeezed`, which stops the zeroing worker meanwhile).
    pub(crate) fn squeeze(&mut self, s: &Shared, h: &mut Heap) -> Squeeze {
        let pressure = self.low_memory || os::now_ns() < self.pressure_until_ns;
        let mut sq = Squeeze { excess_pages: 0, pressure };
        let measured = match self.measure {
            Measure::None => None,
            Measure::Own { limit } => Some((limit, h.owned_resident_pages() << PAGE_SHIFT)),
            Measure::Cgroup { limit } => Some((limit, self.usage)),
        };
        if let Some((limit, usage)) = measured {
            let target = limit - limit / 32;
            if !self.over && usage > limit {
                self.over = true;
                self.hits += 1;
            } else if self.over && usage <= target {
                self.over = false;
            }
            if self.over {
                sq.excess_pages = (usage - target).div_ceil(os::PAGE_SIZE as u64);
            }
            h.reclaim.memory_limit_usage_bytes = usage;
        }
        h.reclaim.memory_limit_hits = self.hits;
        h.reclaim.pressure_events = self.events;
        s.squeezed.store(sq.urgent(), Ordering::Relaxed);
        sq
    }

    /// `bytes` were just reported: a cgroup's usage read before counts them no more.
    pub(crate) fn reported(&mut self, bytes: u64) {
        self.usage = self.usage.saturating_sub(bytes);
    }

    /// Nap for `ns` (blocks to age), in `PERIOD_NS` steps while a limit or a signal is watched,
    /// returning early when one of them asks the reporter to hurry, or on a kick (settings
    /// changed, stop, a pressure event made by hand). Each step is `Worker::nap`, so a stop is
    /// seen as promptly as in one long nap.
    pub(crate) fn nap(&mut self, s: &Shared, ns: u64) {
        if !self.watching() {
            s.reporter.nap(ns);
            return;
        }
        let mut left = ns;
        while left > 0 {
            let step = left.min(self.period_ns());
            if s.reporter.nap_unless_kicked(step) || s.reporter.stopping() {
                return;
            }
            left -= step;
            self.sample(s);
            if self.urgent_now(s) {
                return;
            }
        }
    }
}
