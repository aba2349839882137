//! The words every hot path asks first, per thread: which page cache (`cache/table.rs`) and
//! which slab heap (`slab/table.rs`) this thread used last, each as (owner id, pointer); 0 for
//! the id is none. Zero in a new thread; only the thread itself reads or writes its words.
//!
//! On x86-64 Linux the four words are one block of static TLS of their own
//! (`fallow_last_used`, defined in `global_asm!`) read with the initial-exec model: one load of
//! the block's offset from the thread pointer (a GOT word the dynamic loader fills in at load
//! time), then `fs:`-relative loads. Rust's `thread_local!` in a shared object (the preload
//! library) goes through the general-dynamic model, a `__tls_get_addr` call per access (about
//! 30 instructions with its register saves), which `#[thread_local]` / `-Z tls-model` would
//! avoid only on nightly. A shared object with initial-exec TLS is marked `DF_STATIC_TLS`:
//! loaded at start (`LD_PRELOAD`, a dependency) its block is in every thread's static TLS;
//! `dlopen`ed, the loader places its 32 bytes in the static TLS surplus glibc keeps for this,
//! or refuses the load, never a wrong address. Elsewhere the words are a `thread_local!`.
//!
//! The symbol is global (the crate's code units all refer to it) and hidden (not exported from
//! a shared object); two versions of this crate linked into one program would clash on it at
//! link time, not at run time.

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    core::arch::global_asm!(
        ".pushsection .tbss,\"awT\",@nobits",
        ".p2align 4",
        ".globl fallow_last_used",
        ".hidden fallow_last_used",
        ".type fallow_last_used,@object",
        ".size fallow_last_used,32",
        "fallow_last_used:",
        ".zero 32",
        ".popsection",
    );

    /// `get` and `set` of the pair of words at byte offset `$at` of the block.
    macro_rules! pair {
        ($get:ident, $set:ident, $at:literal) => {
            /// (id, pointer) of this thread.
            #[inline(always)]
            pub(crate) fn $get() -> (u64, usize) {
                let (id, p): (u64, usize);
                // SAFETY: two aligned loads from this thread's own block of `fallow_last_used`
                // (the thread pointer plus the block's offset, which the loader wrote in the
                // GOT word); only this thread writes the block, so there is no race.
                unsafe {
                    core::arch::asm!(
                        "mov {t}, qword ptr [rip + fallow_last_used@GOTTPOFF]",
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
                // SAFETY: two aligned stores to this thread's own block (as in the getter).
                unsafe {
                    core::arch::asm!(
                        "mov {t}, qword ptr [rip + fallow_last_used@GOTTPOFF]",
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

    pair!(cache, set_cache, "0");
    pair!(slab, set_slab, "16");

    /// One word of the block: the load of `$at`, alone.
    macro_rules! word {
        ($get:ident, $at:literal) => {
            #[inline(always)]
            pub(crate) fn $get() -> usize {
                let p: usize;
                // SAFETY: as `slab`'s loads: an aligned load from this thread's own block.
                unsafe {
                    core::arch::asm!(
                        "mov {t}, qword ptr [rip + fallow_last_used@GOTTPOFF]",
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

    // The words of the slab's pair alone (`slab().0`, `slab().1`), one load each: bytes 16 and
    // 24 are the pair at 16 above (`pair!(slab, set_slab, "16")`). The owner's free compares
    // the id and needs the heap only when a span moves.
    word!(slab_id_word, "16");
    word!(slab_heap, "24");

    #[inline(always)]
    pub(crate) fn slab_id() -> u64 {
        slab_id_word() as u64
    }
}

/// Elsewhere: a `thread_local!` of the same words.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod imp {
    use core::cell::Cell;

    thread_local! {
        static LAST: [Cell<(u64, usize)>; 2] = const { [Cell::new((0, 0)), Cell::new((0, 0))] };
    }

    #[inline(always)]
    pub(crate) fn cache() -> (u64, usize) {
        LAST.with(|l| l[0].get())
    }

    #[inline]
    pub(crate) fn set_cache(id: u64, p: usize) {
        LAST.with(|l| l[0].set((id, p)))
    }

    #[inline(always)]
    pub(crate) fn slab() -> (u64, usize) {
        LAST.with(|l| l[1].get())
    }

    #[inline]
    pub(crate) fn set_slab(id: u64, p: usize) {
        LAST.with(|l| l[1].set((id, p)))
    }

    #[inline(always)]
    pub(crate) fn slab_heap() -> usize {
        slab().1
    }

    #[inline(always)]
    pub(crate) fn slab_id() -> u64 {
        slab().0
    }
}

pub(crate) use imp::{cache, set_cache, set_slab, slab, slab_heap, slab_id};
