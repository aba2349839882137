//! Links the unwinder into the library (`../static_unwinder.rs`) and places the functions that
//! programs execute first in its `.text` (the hot text, below).

#[path = "../static_unwinder.rs"]
mod static_unwinder;

use std::path::PathBuf;

fn main() {
    static_unwinder::link_unwinder_statically();
    hot_text_first();
    println!("cargo:rerun-if-changed=build.rs");
}

/// The preload is loaded into every process it runs under, and the kernel maps a file's pages
/// 64 KiB around each page fault (fault-around): code a small program executes scattered over
/// the library's text made all of its text mapping resident (448 KiB). A linker script
/// (`INSERT AFTER .init`, so the rest of the default layout stays) builds `.text` with the
/// functions of `hot_text.txt` first, after the C start files' and `libc_nonshared`'s
/// (`pthread_atfork`, run at start-up), and puts `.fini` and the PLT sections (`.plt.got` holds
/// the `__cxa_finalize` every exit calls) beside `.init`: what a program runs lies in a few pages
/// (docs/measurements.md, "The preload's hot text"). GNU ld and lld read the script; gold and
/// mold do not: a build with either needs `FALLOW_HOT_TEXT=0`, which keeps the linker's own
/// order (also for a comparison).
fn hot_text_first() {
    println!("cargo:rerun-if-changed=hot_text.txt");
    println!("cargo:rerun-if-env-changed=FALLOW_HOT_TEXT");
    if std::env::var("FALLOW_HOT_TEXT").is_ok_and(|v| v == "0") {
        return;
    }
    let list = std::fs::read_to_string("hot_text.txt").expect("crates/fallow-preload/hot_text.txt");
    let mut script = String::from(
        "/* The preload's hot text first (build.rs); written by the build from hot_text.txt. */\nSECTIONS\n{\n  \
         .fini : { KEEP(*(SORT_NONE(.fini))) }\n  .plt : { *(.plt) *(.iplt) }\n  .plt.got : { *(.plt.got) }\n  \
         .plt.sec : { *(.plt.sec) }\n  .text : {\n    \
         *crtbeginS.o(.text .text.*)\n    *libc_nonshared.a:*(.text .text.*)\n",
    );
    // Each line a pattern of symbol names (scripts/hot-text.py); a function's section is
    // `.text.` and its name, `.text.unlikely.` and its name for a cold one.
    for name in list.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        script.push_str(&format!("    *(.text.{name} .text.unlikely.{name})\n"));
    }
    script.push_str("    *(.text .text.*)\n  }\n}\nINSERT AFTER .init;\n");
    let path = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("hot_text.ld");
    std::fs::write(&path, script).unwrap();
    // `-T` through the compiler driver (a path with a comma would split `-Wl,`).
    println!("cargo:rustc-link-arg-cdylib=-T{}", path.display());
}
