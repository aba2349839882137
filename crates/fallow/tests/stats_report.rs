//! The report of `Stats` (`Display`, `Stats::write_report`): where the reserved address space is,
//! in plain words and adding up (never-used address space apart from memory given back), then one
//! line per figure of the table, each name once and in the table's order, then the free blocks by
//! class and order; and writing
//! it into a buffer on the stack allocates nothing (the preload prints it from inside `malloc`'s
//! library at exit).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use fallow::binding_support::{StackBuf, Unit, FIELDS};
use fallow::{Allocator, Config, Flags, Stats};

/// The system allocator, counting the allocations made by each thread.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call goes to `System` unchanged; only a thread-local counter is added, whose
// const initialiser needs no allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's promises about `l` are `System`'s.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `alloc` with `l`, which is `System`'s.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: `p` came from `alloc` with `l`, as `System` requires.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(|n| n.get())
}

fn some_stats() -> Stats {
    let a = Allocator::new(Config { arena_size: 64 << 20, max_order: 10, ..Config::default() }).unwrap();
    let p = a.alloc(300 << 10, 4096, Flags::ZERO).unwrap();
    let s = a.stats();
    a.free(p.as_ptr()).unwrap();
    s
}

/// The summary's value of `name` (MiB), and the number of summary lines.
fn summary(text: &str) -> (Vec<(String, f64)>, usize) {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines.iter().position(|l| *l == "counters:").expect("no counters: line");
    assert!(lines[0].starts_with("address space reserved: "), "{text}");
    let rows = lines[1..end]
        .iter()
        .map(|l| {
            let (name, rest) = l.trim_start().split_at(22);
            let mib = rest.split_whitespace().next().unwrap().parse().unwrap();
            (name.trim_end().to_string(), mib)
        })
        .collect();
    (rows, end + 1)
}

#[test]
fn the_summary_names_never_used_address_space_apart_and_adds_up() {
    // Without the per-thread cache, which would take a whole 128-page block for its stack, and on
    // 4 KiB pages (with huge pages, the first 2 MiB unit is used whole: buddy/units.rs).
    let a = Allocator::new(Config { arena_size: 64 << 20, max_order: 10, thp: false, cache: false, ..Config::default() }).unwrap();
    let p = a.alloc(300 << 10, 4096, Flags::ZERO).unwrap();
    let s = a.stats();
    // 75 pages handed out from the bottom of a fresh 64 MiB arena: the rest was never touched.
    assert_eq!(s.never_used_pages, 16384 - 75, "{s}");
    assert_eq!(s.free_reported_pages, s.never_used_pages, "nothing was given back yet: {s}");
    let text = s.to_string();
    let (rows, _) = summary(&text);
    let get = |n: &str| rows.iter().find(|(k, _)| k == n).unwrap_or_else(|| panic!("no {n}: {text}")).1;
    assert!(text.starts_with("address space reserved: 64.0 MiB in 1 arena"), "{text}");
    assert_eq!(get("never used"), ((16384.0 - 75.0) / 256.0 * 10.0f64).round() / 10.0, "{text}");
    assert_eq!(get("free, reported"), 0.0, "{text}");
    assert_eq!(get("live"), 0.3, "{text}");
    let total: f64 = rows.iter().map(|(_, v)| v).sum();
    assert!((total - 64.0).abs() < 0.05 * rows.len() as f64, "{text}");

    // 2 MiB more: the buddy split put it at 2 MiB, past untouched pages [75, 512), which are
    // never used all the same, since nothing was ever given back.
    let q = a.alloc(2 << 20, 4096, Flags::ZERO).unwrap();
    let s = a.stats();
    assert_eq!(s.never_used_pages, 16384 - 75 - 512, "{s}");
    a.free(q.as_ptr()).unwrap();

    // Freed and reported: the pages come back as memory given back, not as never used.
    a.free(p.as_ptr()).unwrap();
    let mut t = a.tunables();
    t.report_order = 0;
    t.report_delay_ms = 0;
    t.zeroing = false;
    a.set_tunables(t).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let s = loop {
        let s = a.stats();
        if s.free_reported_pages == 16384 || std::time::Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!((s.free_reported_pages, s.never_used_pages), (16384, 16384 - 75 - 512), "{s}");
    let text = s.to_string();
    let (rows, _) = summary(&text);
    let get = |n: &str| rows.iter().find(|(k, _)| k == n).unwrap().1;
    assert_eq!(get("free, reported"), (587.0 / 256.0 * 10.0f64).round() / 10.0, "{text}");
}

#[test]
fn one_line_per_figure_in_table_order() {
    let s = some_stats();
    let text = s.to_string();
    let (_, skip) = summary(&text);
    let lines: Vec<&str> = text.lines().skip(skip).collect();
    let singles: Vec<&str> =
        FIELDS.iter().filter(|(_, u)| *u != Unit::Blocks).map(|(n, _)| *n).collect();
    let named: Vec<&str> = lines.iter().take(singles.len()).map(|l| l.split(':').next().unwrap()).collect();
    assert_eq!(named, singles, "{text}");
    let line = |name: &str| lines.iter().find(|l| l.starts_with(&format!("{name}:"))).unwrap().to_string();
    assert!(line("bytes_in_use").ends_with(" 0.3 MiB"), "{text}");
    let calls = s.alloc_calls.to_string();
    assert_eq!(line("alloc_calls").split_whitespace().nth(1), Some(calls.as_str()), "{text}");
    assert!(s.free_reported_pages > 0, "{text}");
    let pages = format!(" {} ({:.1} MiB)", s.free_reported_pages, s.free_reported_pages as f64 / 256.0);
    assert!(line("free_reported_pages").ends_with(&pages), "{text}");
    assert!(line("report_ns").ends_with(" ms"), "{text}");
    assert_eq!(lines[singles.len()], "free blocks by order:", "{text}");
    assert_eq!(&lines[singles.len() + 1..].join("\n"), s.buddyinfo().trim_end());
}

#[test]
fn the_report_into_a_stack_buffer_does_not_allocate() {
    let s = some_stats();
    let expected: String = s.to_string().lines().map(|l| format!("fallow:   {l}\n")).collect();
    let mut b = StackBuf::<8192>::new();
    let before = allocations();
    s.write_report(&mut b, "fallow:   ").unwrap();
    let after = allocations();
    assert_eq!(after, before, "write_report allocated");
    assert!(b.as_bytes().len() < 8192 / 2, "the preload's buffer is getting small: {}", b.as_bytes().len());
    assert_eq!(std::str::from_utf8(b.as_bytes()).unwrap(), expected);
}
