//! The core's modules form layers, and an import points down only (docs/design.md, "Layers"):
//! this test reads every `crate::` path in `src/` and fails on one that names a module at the
//! same place or above in `LAYERS`. A module is a file `src/m.rs` or a folder `src/m/`; paths
//! inside a module's own folder (`super::`, `crate::m::`) are its own business.

use std::collections::BTreeMap;
use std::path::Path;

/// Bottom up. Each module may import only modules listed before it.
const LAYERS: &[&str] = &[
    // System calls and the smallest shared vocabulary: no crate import at all.
    "os",
    "error",
    // Messages without allocating (`StackBuf`) and the abort on a bad pointer (`fatal`).
    "message",
    "flags",
    "lock",
    "sync",
    "nt",
    "start",
    // Settings and limits, page states and block records, counters and their report.
    "config",
    // The `FALLOW_*` environment variables over a `Config` (the preload's and the C library's).
    "env",
    "page",
    "stats",
    // The worker word (sleep and wake of a background thread), without the workers' policies,
    // and the watch that keeps fallow's threads from outliving the program (`worker/exit_watch.rs`).
    "worker",
    // Address space and side metadata, then the free lists over it.
    "arena",
    "buddy",
    // The locked allocator, then the per-thread front over it.
    "heap",
    "cache",
    // Small objects in spans of pages, over the page path.
    "slab",
    // The memory limit and pressure the reporter watches.
    "limit",
    // The background workers: they use the heap's isolation interface and drain idle caches.
    "report",
    "zero",
    // Trims on demand: the reporter's batches, run by the calling thread.
    "trim",
    // The public allocator over all of it, and the surfaces built on it.
    "allocator",
    "global",
    "binding_support",
];

/// The crate modules a source text names, as `crate::m`, outside comments.
fn imports(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if name == "{" || name.is_empty() {
                continue;
            }
            out.push(name);
        }
        // `use crate::{a, b::c}`: every first segment inside the braces.
        if let Some(i) = code.find("crate::{") {
            let inner = &code[i + "crate::{".len()..];
            let inner = &inner[..inner.find('}').unwrap_or(inner.len())];
            for part in inner.split(',') {
                let name: String = part.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        }
    }
    out
}

/// Every module of `src/` (but the crate root) with the text of its files.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut mods = BTreeMap::new();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            let mut text = String::new();
            let mut stack = vec![p.clone()];
            while let Some(d) = stack.pop() {
                for f in std::fs::read_dir(&d).unwrap() {
                    let f = f.unwrap().path();
                    if f.is_dir() {
                        stack.push(f);
                    } else if f.extension().is_some_and(|x| x == "rs") {
                        text += &std::fs::read_to_string(&f).unwrap();
                    }
                }
            }
            mods.entry(name).or_insert_with(String::new).push_str(&text);
        } else if p.extension().is_some_and(|x| x == "rs") && name != "lib" {
            mods.entry(name).or_insert_with(String::new).push_str(&std::fs::read_to_string(&p).unwrap());
        }
    }
    mods
}

#[test]
fn every_import_points_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mods = modules(&src);
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
    let mut wrong = Vec::new();
    for (m, text) in &mods {
        let Some(r) = rank(m) else {
            wrong.push(format!("module `{m}` has no place in LAYERS"));
            continue;
        };
        let mut seen: Vec<String> = imports(text).into_iter().filter(|i| i != m).collect();
        seen.sort();
        seen.dedup();
        for i in seen {
            match rank(&i) {
                Some(ri) if ri < r => {}
                Some(_) => wrong.push(format!("`{m}` imports `{i}`, which is not below it")),
                // A name that is no module (a re-export of the crate root): must not be one.
                None if mods.contains_key(&i) => wrong.push(format!("`{m}` imports unplaced `{i}`")),
                None => {}
            }
        }
    }
    assert!(wrong.is_empty(), "imports against the layer order (tests/layers.rs, LAYERS):\n{}", wrong.join("\n"));
}

/// The check itself finds what it must: a path in code, braces, and not a path in a comment.
#[test]
fn imports_are_read_from_code_only() {
    let text = "use crate::heap::Heap;\nuse crate::{arena::Arena, page};\n// crate::cache in a comment\nlet x = crate::os::now_ns(); // crate::zero\n";
    assert_eq!(imports(text), ["heap", "arena", "page", "os"]);
}
