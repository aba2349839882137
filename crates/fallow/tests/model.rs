//! Model-based property test: random sequences of allocations, frees and resizes of random sizes,
//! alignments and flags, checked after every step against a simple model of the live blocks.

mod common;

use common::*;
use fallow::{Error, Flags};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Alloc { pages: usize, extra: usize, align_log: u8, zero: bool, populate: bool, lock: bool },
    Free { idx: usize, sized: bool },
    Resize { idx: usize, pages: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (
            prop_oneof![3 => 1usize..8, 2 => 8usize..300, 1 => 200usize..600],
            0usize..4096,
            prop_oneof![4 => Just(0u8), 1 => 12u8..21],
            any::<bool>(),
            prop::bool::weighted(0.2),
            prop::bool::weighted(0.05),
        )
            .prop_map(|(pages, extra, align_log, zero, populate, lock)| Op::Alloc {
                pages,
                extra,
                align_log,
                zero,
                populate,
                lock
            }),
        4 => (any::<usize>(), any::<bool>()).prop_map(|(idx, sized)| Op::Free { idx, sized }),
        1 => (any::<usize>(), 1usize..400).prop_map(|(idx, pages)| Op::Resize { idx, pages }),
    ]
}

struct Live {
    addr: usize,
    len: usize,
    fill: u8,
}

fn overlaps(live: &[Live], addr: usize, len: usize) -> bool {
    live.iter().any(|l| addr < l.addr + l.len && l.addr < addr + len)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn model(ops in prop::collection::vec(op(), 1..120)) {
        let a = small();
        let mut live: Vec<Live> = Vec::new();
        let mut fill = 1u8;
        for op in ops {
            match op {
                Op::Alloc { pages, extra, align_log, zero, populate, lock } => {
                    let size = (pages - 1) * 4096 + extra.max(1);
                    let align = if align_log == 0 { 8 } else { 1usize << align_log };
                    let mut flags = Flags::NONE;
                    if zero { flags = flags | Flags::ZERO; }
                    if populate { flags = flags | Flags::POPULATE; }
                    if lock { flags = flags | Flags::LOCK; }
                    let before = a.stats();
                    let p = a.alloc(size, align, flags).unwrap().as_ptr() as usize;
                    let len = a.usable_size(p as *const u8).unwrap();
                    prop_assert_eq!(len, size.div_ceil(4096) * 4096, "no waste beyond page granularity");
                    prop_assert_eq!(p % align, 0);
                    prop_assert!(!overlaps(&live, p, len), "block {:#x}+{} overlaps a live block", p, len);
                    if zero {
                        prop_assert!(all_zero(p as *const u8, len), "ZERO block {:#x} holds data", p);
                        let after = a.stats();
                        let counted = (after.zero_skipped_bytes - before.zero_skipped_bytes)
                            + (after.zeroed_on_alloc_bytes - before.zeroed_on_alloc_bytes);
                        prop_assert_eq!(counted, len as u64);
                    }
                    if populate || lock {
                        prop_assert_eq!(common::os::resident_pages(p, len).unwrap(), len / 4096);
                    }
                    fill = fill.wrapping_add(1).max(1);
                    unsafe { std::ptr::write_bytes(p as *mut u8, fill, len) };
                    live.push(Live { addr: p, len, fill });
                }
                Op::Free { idx, sized } => {
                    if live.is_empty() { continue; }
                    let l = live.swap_remove(idx % live.len());
                    prop_assert!(all_eq(l.addr as *const u8, l.len, l.fill), "block {:#x} lost its pattern", l.addr);
                    if sized {
                        prop_assert_eq!(
                            a.free_sized(l.addr as *mut u8, l.len + 4096),
                            Err(Error::SizeMismatch { addr: l.addr, given: l.len + 4096, actual: l.len })
                        );
                        a.free_sized(l.addr as *mut u8, l.len - 1).unwrap();
                    } else {
                        a.free(l.addr as *mut u8).unwrap();
                    }
                    prop_assert_eq!(a.free(l.addr as *mut u8), Err(Error::DoubleFree { addr: l.addr }));
                }
                Op::Resize { idx, pages } => {
                    if live.is_empty() { continue; }
                    let i = idx % live.len();
                    let new_len = pages * 4096;
                    let (addr, old_len, f) = (live[i].addr, live[i].len, live[i].fill);
                    let others: Vec<Live> = live.iter().enumerate().filter(|(j, _)| *j != i)
                        .map(|(_, l)| Live { addr: l.addr, len: l.len, fill: l.fill }).collect();
                    if a.resize_in_place(addr as *mut u8, new_len).unwrap() {
                        prop_assert_eq!(a.usable_size(addr as *const u8), Some(new_len));
                        prop_assert!(!overlaps(&others, addr, new_len));
                        prop_assert!(all_eq(addr as *const u8, old_len.min(new_len), f));
                        unsafe { std::ptr::write_bytes(addr as *mut u8, f, new_len) };
                        live[i].len = new_len;
                    } else {
                        prop_assert_eq!(a.usable_size(addr as *const u8), Some(old_len));
                    }
                }
            }
            if let Err(e) = a.check_invariants() { prop_assert!(false, "{}", e); }
            if let Err(e) = check_free_states(&a) { prop_assert!(false, "{}", e); }
            let s = a.stats();
            prop_assert_eq!(s.live_blocks, live.len() as u64);
            prop_assert_eq!(s.bytes_in_use, live.iter().map(|l| l.len as u64).sum::<u64>());
            prop_assert_eq!(s.free_pages() * 4096 + s.bytes_in_use + s.slack_bytes + s.isolated_pages * 4096, s.reserved_bytes);
            let listed: u64 = (0..3).map(|c| s.free_blocks[c].iter().enumerate()
                .map(|(o, n)| n << o).sum::<u64>()).sum();
            prop_assert_eq!(listed, s.free_pages());
        }
        for l in live {
            a.free(l.addr as *mut u8).unwrap();
        }
        let s = a.stats();
        prop_assert_eq!(s.bytes_in_use, 0);
        if let Err(e) = a.check_invariants() { prop_assert!(false, "{}", e); }
    }
}
