//! The words every hot path asks first, per thread: which page cache (`cache/table.rs`) and
//! which slab heap (`slab/table.rs`) this thread used last, each as (owner id, pointer); 0 for
//! the id is none. Only the thread itself reads or writes its words.
//!
//! On x86-64 Linux each pair is a block of static TLS of its own, defined in `global_asm!`
//! (the page cache's `fallow_last_cache` here, zero in a new thread; the slab's
//! `fallow_last_slab` in `slab/table.rs`, whose heap word starts as the slab's empty heap) and
//! read with the initial-exec model: one load of the block's offset from the thread pointer (a
//! GOT word the dynamic loader fills in at load time), then `fs:`-relative loads (`tls_pair!`,
//! `tls_word!`). Rust's `thread_local!` in a shared object (the preload library) goes through
//! the general-dynamic model, a `__tls_get_addr` call per access (about 30 instructions with
//! its register saves), which `#[thread_local]` / `-Z tls-model` would avoid only on nightly. A
//! shared object with initial-exec TLS is marked `DF_STATIC_TLS`: loaded at start
//! (`LD_PRELOAD`, a dependency) its blocks are in every thread's static TLS; `dlopen`ed, the
//! loader places their 32 bytes in the static TLS surplus glibc keeps for this, or refuses the
//! load, never a wrong address. A block's initial image is copied for each thread after the
//! loader has applied its relocations (the slab's heap word is one). Elsewhere the words are
//! `thread_local!`s.
//!
//! The symbols are global (the crate's code units all refer to them) and hidden (not exported
//! from a shared object); two versions of this crate linked into one program would clash on
//! them at link time, not at run time.

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    core::arch::global_asm!(
        ".pushsection .tbss,\"awT\",@nobits",
        ".p2align 4",
        ".globl fallow_last_cache",
        ".hidden fallow_last_cache",
        ".type fallow_last_cache,@object",
        ".size fallow_last_cache,16",
        "fallow_last_cache:",
        ".zero 16",
        ".popsection",
    );

    /// `get` and `set` of the pair of words at byte offset `$at` of the static TLS block
    /// `$block` (a symbol defined in `global_asm!` in `.tbss` or `.tdata`, hidden).
    macro_rules! tls_pair {
        ($block:literal, $get:ident, $set:ident, $at:literal) => {
            /// (id, pointer) of this thread.
            #[inline(always)]
            pub(crate) fn $get() -> (u64, usize) {
                let (id, p): (u64, usize);
                // SAFETY: two aligned loads from this thread's own copy of the block (the
                // thread pointer plus the block's offset, which the loader wrote in the GOT
                // word); only this thread writes it, so there is no race.
                unsafe {
                    core::arch::asm!(
                        concat!("mov {t}, qword ptr [rip + ", $block, "@GOTTPOFF]"),
                        concat!("mov {id}, qword ptr fs:[{t} + ", $at, "]"),
                        concat!("mov {p}, qword ptr fs:[{t} + ", $at, " + 8]"),
                        t = out(reg) _,
                        id = out(reg) id,
                        p = out(reg) p,
                        options(nostack, readonly, preserves_flags, pure),
                    )
                };
                (id, p)
            }

            /// Set this thread's (id, pointer).
            #[inline]
            pub(crate) fn $set(id: u64, p: usize) {
                // SAFETY: two aligned stores to this thread's own copy of the block (as in the
                // getter).
                unsafe {
                    core::arch::asm!(
                        concat!("mov {t}, qword ptr [rip + ", $block, "@GOTTPOFF]"),
                        concat!("mov qword ptr fs:[{t} + ", $at, "], {id}"),
                        concat!("mov qword ptr fs:[{t} + ", $at, " + 8], {p}"),
                        t = out(reg) _,
                        id = in(reg) id,
                        p = in(reg) p,
                        options(nostack, preserves_flags),
                    )
                };
            }
        };
    }

    /// The load of the word at byte offset `$at` of the block `$block`, alone.
    macro_rules! tls_word {
        ($block:literal, $get:ident, $at:literal) => {
            #[inline(always)]
            pub(crate) fn $get() -> usize {
                let p: usize;
                // SAFETY: as `tls_pair!`'s loads: an aligned load from this thread's own copy
                // of the block.
                unsafe {
                    core::arch::asm!(
                        concat!("mov {t}, qword ptr [rip + ", $block, "@GOTTPOFF]"),
                        concat!("mov {p}, qword ptr fs:[{t} + ", $at, "]"),
                        t = out(reg) _,
                        p = out(reg) p,
                        options(nostack, readonly, preserves_flags, pure),
                    )
                };
                p
            }
        };
    }

    pub(crate) use {tls_pair, tls_word};

    tls_pair!("fallow_last_cache", cache, set_cache, "0");
}

/// Elsewhere: a `thread_local!` of the same words.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod imp {
    use core::cell::Cell;

    thread_local! {
        static LAST: Cell<(u64, usize)> = const { Cell::new((0, 0)) };
    }

    #[inline(always)]
    pub(crate) fn cache() -> (u64, usize) {
        LAST.with(|l| l.get())
    }

    #[inline]
    pub(crate) fn set_cache(id: u64, p: usize) {
        LAST.with(|l| l.set((id, p)))
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) use imp::{tls_pair, tls_word};
pub(crate) use imp::{cache, set_cache};
