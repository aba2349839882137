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
//! - Pressure: the "some" stall total of the cgroup's `memory.pressure` (v2), else of
//!   `/proc/pressure/memory`, read every `PERIOD_NS`; 150 ms of stall within a second is an
//!   event (`StallWindow`: what a PSI trigger would signal, without a trigger's descriptor,
//!   whose close costs every exit an RCU grace period). Where neither file reads,
//!   `MemAvailable` below a sixteenth of `MemTotal`, read at most once a second. Pressure lasts
//!   two windows after the last event (while `MemAvailable` stays low, for polling); meanwhile
//!   all idle free memory goes back, the zeroed reserve first, and then the delay-based policy
//!   resumes.
//! - The limit never fails an allocation: it only makes the reporter hurry.
//!
//! Nothing here allocates: files are read by `os` into stack buffers.

use core::sync::atomic::Ordering;

use crate::config::MemoryLimit;
use crate::heap::{Heap, Shared};
use crate::os::{self, PAGE_SHIFT};
use crate::stats::{SIGNAL_MEMAVAILABLE, SIGNAL_NONE, SIGNAL_OFF, SIGNAL_PSI_CGROUP, SIGNAL_PSI_SYSTEM};
use crate::stats::{SOURCE_NONE, SOURCE_SETTING, SOURCE_V1, SOURCE_V2_HIGH, SOURCE_V2_MAX};

/// How often, at most, the reporter looks at the limit and reads the PSI file while it waits for
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
/// A pressure event is `STALL_EVENT_US` of "some" stall within `STALL_WINDOW_NS` (the trigger
/// psi.rst gives as its example), and pressure lasts two windows after the last one.
const STALL_WINDOW_NS: u64 = 1_000_000_000;
const STALL_EVENT_US: u64 = 150_000;
/// Samples kept: read at least `PERIOD_NS` apart, 16 span more than a window.
const STALL_SAMPLES: usize = 16;

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

/// The "some" stall totals of a PSI file, read at least `PERIOD_NS` apart, and the rule that makes
/// events of them, as the kernel's trigger would: the total grew by `STALL_EVENT_US` within
/// `STALL_WINDOW_NS`, at most one event a window. Where two reads are more than a window apart
/// (the reporter was busy in a pass), the stall over the gap must reach the same share of it.
pub(crate) struct StallWindow {
    /// `(time ns, total µs)`, oldest first from `next` on, `len` of them.
    samples: [(u64, u64); STALL_SAMPLES],
    len: usize,
    next: usize,
    last_event_ns: Option<u64>,
}

impl StallWindow {
    pub(crate) const fn new() -> StallWindow {
        StallWindow { samples: [(0, 0); STALL_SAMPLES], len: 0, next: 0, last_event_ns: None }
    }

    /// Record the total read at `now_ns`; whether it makes an event.
    pub(crate) fn observe(&mut self, now_ns: u64, total_us: u64) -> bool {
        let oldest = (self.next + STALL_SAMPLES - self.len) % STALL_SAMPLES;
        let mut kept = (0..self.len).map(|i| self.samples[(oldest + i) % STALL_SAMPLES]);
        // The oldest sample within the window, else the newest (older than the window).
        let base = kept.clone().find(|&(t, _)| now_ns.saturating_sub(t) <= STALL_WINDOW_NS).or(kept.next_back());
        self.samples[self.next] = (now_ns, total_us);
        self.next = (self.next + 1) % STALL_SAMPLES;
        self.len = (self.len + 1).min(STALL_SAMPLES);
        let Some((t, total)) = base else { return false };
        let span_ns = now_ns.saturating_sub(t).max(STALL_WINDOW_NS);
        let stalled_ns = total_us.saturating_sub(total).saturating_mul(1000);
        let due = self.last_event_ns.is_none_or(|e| now_ns.saturating_sub(e) >= STALL_WINDOW_NS);
        // stalled / span >= event / window, in integers (u128: no overflow).
        let event = due && stalled_ns as u128 * STALL_WINDOW_NS as u128 >= (STALL_EVENT_US * 1000) as u128 * span_ns as u128;
        if event {
            self.last_event_ns = Some(now_ns);
        }
        event
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
    /// The PSI file read (with `SIGNAL_PSI_*`), when it was last read, and its stall totals.
    psi_file: Option<os::StackPath>,
    psi_read_ns: u64,
    stall: StallWindow,
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
            psi_file: None,
            psi_read_ns: 0,
            stall: StallWindow::new(),
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
            self.psi_file = None;
            self.stall = StallWindow::new();
            self.low_memory = false;
            self.pressure_until_ns = 0;
            self.signal = if pressure { self.choose_signal() } else { SIGNAL_OFF };
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

    /// The PSI file of the cgroup, else the system's, whichever reads first, else `MemAvailable`
    /// polling.
    fn choose_signal(&mut self) -> u64 {
        let cgroup = os::cgroup_pressure_file().map(|f| (f, SIGNAL_PSI_CGROUP));
        let system = (os::system_pressure_file(), SIGNAL_PSI_SYSTEM);
        for (file, signal) in cgroup.into_iter().chain([system]) {
            if os::psi_some_total_us(&file).is_some() {
                self.psi_file = Some(file);
                return signal;
            }
        }
        if os::mem_available().is_some() {
            SIGNAL_MEMAVAILABLE
        } else {
            SIGNAL_NONE
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
        !matches!(self.measure, Measure::None) || self.psi_file.is_some() || self.signal == SIGNAL_MEMAVAILABLE
    }

    /// Read what changes outside fallow, each at its own rate, without the lock: the cgroup's
    /// usage, the PSI file, `MemAvailable`, and a pressure event made by hand.
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
        if let Some(file) = &self.psi_file {
            if now.saturating_sub(self.psi_read_ns) >= PERIOD_NS {
                self.psi_read_ns = now;
                event |= os::psi_some_total_us(file).is_some_and(|total| self.stall.observe(now, total));
            }
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
            self.pressure_until_ns = now + 2 * STALL_WINDOW_NS;
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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn stall_of_150_ms_within_a_second_is_an_event() {
        let mut w = StallWindow::new();
        // 10% stall, read every 100 ms: never an event.
        for i in 0..30 {
            assert!(!w.observe(i * 100 * MS, i * 10_000), "at {i}");
        }
        // Then 50 ms of stall in 100 ms: within the window (from the read at 2000 ms) 140 ms...
        assert!(!w.observe(3000 * MS, 340_000));
        // ...then 180 ms (from 2100 ms): an event.
        assert!(w.observe(3100 * MS, 390_000));
        // At most one event a window, however long the stall goes on.
        for i in 1..10 {
            assert!(!w.observe((3100 + i * 100) * MS, 390_000 + i * 100_000), "at {i}");
        }
        assert!(w.observe(4100 * MS, 390_000 + 1_000_000));
    }

    #[test]
    fn a_gap_longer_than_the_window_needs_the_same_share() {
        let mut w = StallWindow::new();
        assert!(!w.observe(0, 1_000));
        // 200 ms of stall over 2 s: 10%, no event.
        assert!(!w.observe(2000 * MS, 201_000));
        // 700 ms over the next 4 s: 17.5%, an event.
        assert!(w.observe(6000 * MS, 901_000));
        // The first read makes no event, whatever the total since boot.
        assert!(!StallWindow::new().observe(5000 * MS, 4_000_000_000));
    }
}
