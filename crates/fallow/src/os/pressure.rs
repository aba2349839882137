//! Memory limits and pressure as the kernel shows them: the process's memory cgroup (v2
//! `memory.high`, `memory.max`, `memory.current`, `memory.pressure`; v1 `memory.limit_in_bytes`,
//! `memory.usage_in_bytes`), PSI stall totals (`/proc/pressure/memory`, the kernel's psi.rst) and
//! `MemAvailable` of `/proc/meminfo`. Every file is read with `open`, `read` and `close` into a
//! buffer on the stack, paths are built on the stack too: nothing here allocates (the reporting
//! worker that calls it runs inside a preloaded `malloc`'s process).

use core::ffi::CStr;

use super::{parse_decimal, read_small_file};

/// A limit at or above this is "no limit" (v1 writes 2^63 rounded down to a page for none).
const NO_LIMIT: u64 = 1 << 62;

/// A path built on the stack, NUL-terminated.
#[derive(Clone, Copy)]
pub struct StackPath {
    buf: [u8; 512],
    len: usize,
}

impl StackPath {
    fn new(prefix: &[u8]) -> Option<StackPath> {
        let mut p = StackPath { buf: [0; 512], len: 0 };
        p.push(prefix)?;
        Some(p)
    }

    fn push(&mut self, bytes: &[u8]) -> Option<()> {
        // One byte stays for the NUL; a path with a NUL inside is no path.
        if self.len + bytes.len() >= self.buf.len() || bytes.contains(&0) {
            return None;
        }
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
        self.buf[self.len] = 0;
        Some(())
    }

    /// This path with `/name` appended.
    fn join(&self, name: &[u8]) -> Option<StackPath> {
        let mut p = *self;
        p.push(b"/")?;
        p.push(name)?;
        Some(p)
    }

    fn as_cstr(&self) -> &CStr {
        // The buffer holds a NUL at `len` and none before it (`push` refuses one).
        CStr::from_bytes_with_nul(&self.buf[..=self.len]).unwrap_or(c"")
    }

    /// The parent directory, down to `floor` bytes (the mount point) at most.
    fn parent(&self, floor: usize) -> Option<StackPath> {
        if self.len <= floor {
            return None;
        }
        let cut = self.buf[floor..self.len].iter().rposition(|&b| b == b'/').map_or(floor, |i| floor + i);
        let mut p = *self;
        p.len = cut;
        p.buf[cut] = 0;
        Some(p)
    }
}

/// A decimal number at the start of `b` (a file's content, "123\n").
fn leading_number(b: &[u8]) -> Option<u64> {
    let end = b.iter().position(|c| !c.is_ascii_digit()).unwrap_or(b.len());
    parse_decimal(&b[..end])
}

/// A number from a small file: `Some(None)` for "max" (v2's no limit), `None` when unreadable.
fn read_number(path: &StackPath) -> Option<Option<u64>> {
    let mut buf = [0u8; 64];
    let n = read_small_file(path.as_cstr(), &mut buf)?;
    if buf[..n].starts_with(b"max") {
        return Some(None);
    }
    Some(leading_number(&buf[..n]).filter(|&v| v < NO_LIMIT))
}

/// The value of `key` in a `key value` per line file (`memory.stat`), in the unit written.
pub fn stat_value(content: &[u8], key: &[u8]) -> Option<u64> {
    content.split(|&b| b == b'\n').find_map(|line| {
        let rest = line.strip_prefix(key)?;
        leading_number(rest.strip_prefix(b" ")?)
    })
}

/// Where the memory controller of this process is, from `/proc/self/cgroup`'s content: `(true,
/// path)` for v1 (a line `N:...memory...:/path`), `(false, path)` for the v2 line `0::/path`
/// when no v1 line names the memory controller.
pub fn memory_cgroup_line(content: &[u8]) -> Option<(bool, &[u8])> {
    let mut v2 = None;
    for line in content.split(|&b| b == b'\n') {
        let mut f = line.splitn(3, |&b| b == b':');
        let (Some(id), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else { continue };
        if controllers.split(|&b| b == b',').any(|c| c == b"memory") {
            return Some((true, path));
        }
        if id == b"0" && controllers.is_empty() {
            v2 = Some((false, path));
        }
    }
    v2
}

/// Which file a cgroup limit came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupLimitFile {
    /// v2 `memory.high` (throttling starts there).
    High,
    /// v2 `memory.max`.
    Max,
    /// v1 `memory.limit_in_bytes`.
    V1,
}

/// The memory cgroup of this process whose limit is the least of its own and its ancestors'.
#[derive(Clone, Copy)]
pub struct CgroupMemory {
    /// That cgroup's directory.
    dir: StackPath,
    pub v2: bool,
    pub limit: u64,
    pub file: CgroupLimitFile,
}

/// The directory of this process's memory cgroup, with the length of its mount point, and
/// whether it is v2.
fn own_memory_cgroup() -> Option<(StackPath, usize, bool)> {
    let mut buf = [0u8; 2048];
    let n = read_small_file(c"/proc/self/cgroup", &mut buf)?;
    let (v1, path) = memory_cgroup_line(&buf[..n])?;
    let mount: &[u8] = if v1 { b"/sys/fs/cgroup/memory" } else { b"/sys/fs/cgroup" };
    if !v1 {
        // Pure v2 only: a hybrid mount keeps the memory controller on v1 (found above).
        let mut c = [0u8; 256];
        let n = read_small_file(c"/sys/fs/cgroup/cgroup.controllers", &mut c)?;
        c[..n].split(|b| b.is_ascii_whitespace()).find(|w| *w == b"memory")?;
    }
    let mut dir = StackPath::new(mount)?;
    let path = path.strip_suffix(b"\n").unwrap_or(path);
    if path != b"/" {
        dir.push(path)?;
    }
    Some((dir, mount.len(), !v1))
}

/// The least memory limit over this process's cgroup and its ancestors up to the mount point,
/// and where it is set. A cgroup whose files cannot be read is passed over (in a container
/// without its own cgroup namespace, the path `/proc/self/cgroup` names is not mounted, and the
/// mount point is the container's cgroup). `None`: no memory controller or no limit.
pub fn cgroup_memory() -> Option<CgroupMemory> {
    let (own, floor, v2) = own_memory_cgroup()?;
    let mut best: Option<CgroupMemory> = None;
    let mut dir = Some(own);
    while let Some(d) = dir {
        let files: &[(&[u8], CgroupLimitFile)] = if v2 {
            &[(b"memory.high", CgroupLimitFile::High), (b"memory.max", CgroupLimitFile::Max)]
        } else {
            &[(b"memory.limit_in_bytes", CgroupLimitFile::V1)]
        };
        for &(name, file) in files {
            if let Some(Some(limit)) = d.join(name).and_then(|p| read_number(&p)) {
                if best.is_none_or(|b| limit < b.limit) {
                    best = Some(CgroupMemory { dir: d, v2, limit, file });
                }
            }
        }
        dir = d.parent(floor);
    }
    best
}

impl CgroupMemory {
    /// Memory the cgroup uses, as its limit counts it, less its inactive file cache (which the
    /// kernel reclaims first, before any pressure on anonymous memory: the kubelet's "working
    /// set"). `None` when unreadable.
    pub fn usage(&self) -> Option<u64> {
        let (current, key): (&[u8], &[u8]) = if self.v2 {
            (b"memory.current", b"inactive_file")
        } else {
            (b"memory.usage_in_bytes", b"total_inactive_file")
        };
        let used = read_number(&self.dir.join(current)?)??;
        let mut buf = [0u8; 4096];
        let inactive = read_small_file(self.dir.join(b"memory.stat")?.as_cstr(), &mut buf)
            .and_then(|n| stat_value(&buf[..n], key))
            .unwrap_or(0);
        Some(used.saturating_sub(inactive))
    }
}

/// The `memory.pressure` file of this process's own cgroup (v2 only).
pub fn cgroup_pressure_file() -> Option<StackPath> {
    let (own, _, v2) = own_memory_cgroup()?;
    if !v2 {
        return None;
    }
    own.join(b"memory.pressure")
}

/// The system-wide PSI file.
pub fn system_pressure_file() -> StackPath {
    StackPath::new(b"/proc/pressure/memory").unwrap_or(StackPath { buf: [0; 512], len: 0 })
}

/// The "some" stall total of a PSI file (`some avg10=... total=N`): microseconds in which at
/// least one task of the cgroup (or of the system) waited for memory, since boot. `None` when
/// the file cannot be read (no PSI: a kernel built or booted without it).
///
/// Read, not registered as a trigger: a trigger's descriptor costs its closer an RCU grace
/// period (`psi_trigger_destroy`), which a process pays at every exit (tens of ms under load).
pub fn psi_some_total_us(file: &StackPath) -> Option<u64> {
    // Two lines of about 60 bytes each.
    let mut buf = [0u8; 256];
    let n = read_small_file(file.as_cstr(), &mut buf)?;
    some_total(&buf[..n])
}

/// The `total=` of the `some` line of a PSI file's content.
fn some_total(content: &[u8]) -> Option<u64> {
    let line = content.split(|&b| b == b'\n').find(|l| l.starts_with(b"some "))?;
    let at = line.windows(6).position(|w| w == b"total=")?;
    leading_number(&line[at + 6..])
}

/// `(MemAvailable, MemTotal)` of `/proc/meminfo`, in bytes.
pub fn mem_available() -> Option<(u64, u64)> {
    // The first lines (MemTotal, MemFree, MemAvailable) fit in far less.
    let mut buf = [0u8; 512];
    let n = read_small_file(c"/proc/meminfo", &mut buf)?;
    let kib = |key: &[u8]| {
        buf[..n].split(|&b| b == b'\n').find_map(|l| {
            let rest = l.strip_prefix(key)?;
            let digits = rest.iter().position(u8::is_ascii_digit)?;
            leading_number(&rest[digits..])
        })
    };
    Some((kib(b"MemAvailable:")?.checked_mul(1024)?, kib(b"MemTotal:")?.checked_mul(1024)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_lines() {
        let hybrid = b"9:name=systemd:/\n4:memory:/jobs/a\n1:cpu:/\n0::/\n";
        assert_eq!(memory_cgroup_line(hybrid), Some((true, &b"/jobs/a"[..])));
        let v1_multi = b"5:cpu,memory:/x\n";
        assert_eq!(memory_cgroup_line(v1_multi), Some((true, &b"/x"[..])));
        assert_eq!(memory_cgroup_line(b"0::/user.slice/app\n"), Some((false, &b"/user.slice/app"[..])));
        assert_eq!(memory_cgroup_line(b"2:cpu:/\n"), None);
    }

    #[test]
    fn stat_values_and_paths() {
        let stat = b"cache 10\ninactive_file 4096\ntotal_inactive_file 8192\n";
        assert_eq!(stat_value(stat, b"inactive_file"), Some(4096));
        assert_eq!(stat_value(stat, b"total_inactive_file"), Some(8192));
        assert_eq!(stat_value(stat, b"active_file"), None);
        let p = StackPath::new(b"/sys/fs/cgroup/memory").unwrap();
        let mut q = p;
        q.push(b"/a/b").unwrap();
        assert_eq!(q.as_cstr(), c"/sys/fs/cgroup/memory/a/b");
        let q = q.parent(p.len).unwrap();
        assert_eq!(q.as_cstr(), c"/sys/fs/cgroup/memory/a");
        let q = q.parent(p.len).unwrap();
        assert_eq!(q.as_cstr(), c"/sys/fs/cgroup/memory");
        assert!(q.parent(p.len).is_none());
        assert_eq!(q.join(b"memory.max").unwrap().as_cstr(), c"/sys/fs/cgroup/memory/memory.max");
    }

    #[test]
    fn psi_totals() {
        let file = b"some avg10=0.00 avg60=0.12 avg300=0.00 total=9805402\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=6517503\n";
        assert_eq!(some_total(file), Some(9805402));
        assert_eq!(some_total(b"full avg10=0.00 total=5\n"), None);
        assert_eq!(some_total(b"some avg10=0.00\n"), None);
        // Where the kernel has PSI, the system's file reads.
        if std::path::Path::new("/proc/pressure/memory").exists() {
            assert!(psi_some_total_us(&system_pressure_file()).is_some());
        }
    }

    #[test]
    fn meminfo_reads() {
        let (avail, total) = mem_available().expect("/proc/meminfo");
        assert!(avail <= total && total > 0);
    }
}
