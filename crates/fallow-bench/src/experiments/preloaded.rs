//! A peer as a program gets it (small, burst; and the preloaded peers of large and mixed): a child
//! process of this binary whose C library calls (`malloc`, `free`) resolve to the peer's library,
//! put first by `LD_PRELOAD`. glibc: nothing preloaded; jemalloc, mimalloc, tcmalloc: Debian's
//! libraries (`libjemalloc2`, `libmimalloc2.0`, `libtcmalloc-minimal4`, as `fallow compare` finds
//! them), not the copies linked into this binary; fallow and its variants: fallow's preload
//! library (`launch::find_preload`), with the variant's environment (`PeerKind::guest_env`:
//! `fallow-small` sets `FALLOW_SMALL=1`). The child checks, before it measures anything, that its
//! `malloc` is the library's (`check_malloc`), so that a library that failed to load cannot pass
//! for a peer.

use std::path::PathBuf;
use std::process::Command;

use super::Experiment;
use crate::launch;
use crate::peers::PeerKind;

/// The peers that can run this way, in the tables' order.
pub const PEERS: [PeerKind; 8] = [
    PeerKind::Glibc,
    PeerKind::Jemalloc,
    PeerKind::Mimalloc,
    PeerKind::Tcmalloc,
    PeerKind::Fallow,
    PeerKind::FallowDelay,
    PeerKind::FallowThp,
    PeerKind::FallowSmall,
];

/// The default peers: glibc, each of jemalloc, mimalloc and tcmalloc whose library is installed,
/// and fallow (its preload library; `fallow-small` only when asked for).
pub fn default_peers() -> Vec<PeerKind> {
    let installed = |k: PeerKind| !matches!(k, PeerKind::Jemalloc | PeerKind::Mimalloc | PeerKind::Tcmalloc) || launch::peer_library(k.name()).is_some();
    PEERS[..5].iter().copied().filter(|&k| installed(k)).collect()
}

/// Whether experiment `e` runs every peer this way (small, burst).
pub fn runs(e: Experiment) -> bool {
    matches!(e, Experiment::Small | Experiment::Burst)
}

/// The library a peer's child preloads (`None`: glibc, nothing), or why it cannot run.
pub fn library(kind: PeerKind) -> Result<Option<PathBuf>, String> {
    match kind {
        PeerKind::Glibc => Ok(None),
        PeerKind::Jemalloc | PeerKind::Mimalloc | PeerKind::Tcmalloc => launch::peer_library(kind.name())
            .map(Some)
            .ok_or_else(|| format!("{}: not installed (Debian package {})", kind.name(), crate::compare::package(kind.name()))),
        k if PEERS.contains(&k) => launch::find_preload(None).map(Some),
        k => {
            let names: Vec<&str> = PEERS.iter().map(|p| p.name()).collect();
            Err(format!("{} cannot run as a preloaded library (these can: {})", k.name(), names.join(", ")))
        }
    }
}

/// Check every peer before a run starts: an error names the first that cannot run.
pub fn check_all(kinds: &[PeerKind]) -> Result<(), String> {
    kinds.iter().try_for_each(|&k| library(k).map(drop))
}

/// A command running this binary as `sub` for `kind`: its library first in `LD_PRELOAD` (what the
/// environment already preloads after it), the variant's environment over this process's.
pub fn command(kind: PeerKind, sub: &str) -> Result<Command, String> {
    let exe = std::env::current_exe().map_err(|err| format!("cannot find this program: {err}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg(sub);
    if let Some(lib) = library(kind)? {
        cmd.env("LD_PRELOAD", launch::ld_preload_with(&lib));
    }
    cmd.envs(kind.guest_env().iter().copied());
    Ok(cmd)
}

/// What the file name of the object that defines `malloc` contains for `kind`.
fn expected_file(kind: PeerKind) -> &'static str {
    match kind {
        PeerKind::Glibc => "libc.so",
        PeerKind::Jemalloc => "libjemalloc",
        PeerKind::Mimalloc => "libmimalloc",
        PeerKind::Tcmalloc => "libtcmalloc",
        _ => launch::PRELOAD_NAME,
    }
}

/// The file of the object that defines the `malloc` this process calls.
fn malloc_file() -> Option<String> {
    // SAFETY: `dlsym` with `RTLD_DEFAULT` and a NUL-terminated name only looks the symbol up in
    // the objects already loaded, in the order the dynamic linker binds them (the preloaded first).
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) };
    if sym.is_null() {
        return None;
    }
    // SAFETY: `Dl_info` is pointers, for which all zeros (null) is a valid value.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: `sym` is an address in a loaded object and `info` a valid, writable `Dl_info`.
    if unsafe { libc::dladdr(sym, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: `dli_fname` is a NUL-terminated string owned by the dynamic linker, valid while the
    // object stays loaded (for the process's life: nothing here unloads it), copied at once.
    Some(unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned())
}

/// In the child: `Ok` if this process's `malloc` is `kind`'s.
pub fn check_malloc(kind: PeerKind) -> Result<(), String> {
    let file = malloc_file().unwrap_or_else(|| "an unknown object".into());
    if file.contains(expected_file(kind)) {
        Ok(())
    } else {
        Err(format!("{}: malloc resolves to {file}, not to {}", kind.name(), expected_file(kind)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_calls_glibc_and_only_the_listed_peers_run() {
        check_malloc(PeerKind::Glibc).unwrap();
        assert!(check_malloc(PeerKind::Mimalloc).unwrap_err().contains("libc.so"));
        assert_eq!(library(PeerKind::Glibc), Ok(None));
        assert!(library(PeerKind::Mmap).unwrap_err().contains("fallow-small"));
        let d = default_peers();
        assert_eq!((d.first(), d.last()), (Some(&PeerKind::Glibc), Some(&PeerKind::Fallow)));
        assert!(!d.contains(&PeerKind::FallowSmall));
    }
}
