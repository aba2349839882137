//! The report of `Stats` (`Display`, `Stats::write_report`): one line per figure of the table,
//! each name once and in the table's order, then the free blocks by class and order; and writing
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

#[test]
fn one_line_per_figure_in_table_order() {
    let s = some_stats();
    let text = s.to_string();
    let lines: Vec<&str> = text.lines().collect();
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
