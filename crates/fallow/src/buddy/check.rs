//! The checks of the free lists' invariants (stated at the top of `mod.rs`), for
//! `Allocator::check_invariants` and the tests: they read every listed block and its state bytes,
//! so they are for checking only, never for the allocation paths.

use super::*;

impl Buddy {
    /// Check the half records of a free block whose real counts are `c` (invariant 5).
    fn check_records(&self, pfn: u32, order: u8, c: StateCounts) -> Result<(), String> {
        if order == 0 || c.uniform_state(1 << order).is_some() {
            return Ok(());
        }
        let half = 1u32 << (order - 1);
        let high = self.count_states(pfn + half, half);
        if self.meta(pfn + half).counts() != high {
            return Err(format!("half record at {} is {:?}, pages say {high:?}", pfn + half, self.meta(pfn + half).counts()));
        }
        self.check_records(pfn, order - 1, c.minus(high))?;
        self.check_records(pfn + half, order - 1, high)
    }

    /// Check the invariants stated at the top of this file; returns the listed pages.
    #[allow(clippy::needless_range_loop)]
    pub fn check_lists(&self) -> Result<u64, String> {
        let mut pages = 0u64;
        let mut blocks = [[0u32; crate::config::ORDERS]; crate::page::CLASSES];
        // Listed blocks that start below `used_end`: the records there tagged `Free`.
        let mut below_used = 0usize;
        for class in 0..self.heads.len() {
            for order in 0..=self.max_order {
                let mut p = self.heads[class][order as usize];
                let mut prev = NIL;
                if (p != NIL) != (self.nonempty[class] & (1 << order) != 0) {
                    return Err(format!("nonempty bit wrong for class {class} order {order}"));
                }
                while p != NIL {
                    let m = self.meta(p).get();
                    let size = 1u32 << order;
                    if m.tag != Tag::Free || m.order != order || m.prev != prev {
                        return Err(format!("block {p} on list {class}/{order} has meta {m:?}"));
                    }
                    if p & (size - 1) != 0 || p + size > self.npages {
                        return Err(format!("block {p} of order {order} misaligned or out of range"));
                    }
                    if p + size > self.unwritten {
                        return Err(format!("block {p} of order {order} listed past the unwritten top-level blocks at {}", self.unwritten));
                    }
                    let real = self.count_states(p, size);
                    if real != m.counts || m.counts.class(size) as usize != class {
                        return Err(format!("block {p}: counts {:?}, pages say {real:?}", m.counts));
                    }
                    self.check_records(p, order, real)?;
                    if (p..p + size).any(|q| self.state(q) == PageState::Allocated) {
                        return Err(format!("free block {p} holds an allocated page"));
                    }
                    if order < self.max_order {
                        let b = self.meta(p ^ size).get();
                        if b.tag == Tag::Free && b.order == order && !self.is_unmerged_pair(p, order) {
                            return Err(format!("free buddies {p} and {} not merged", p ^ size));
                        }
                    }
                    blocks[class][order as usize] += 1;
                    below_used += (p < self.used_end) as usize;
                    pages += size as u64;
                    prev = p;
                    p = m.next;
                }
                if self.tails[class][order as usize] != prev {
                    return Err(format!("tail wrong for class {class} order {order}"));
                }
            }
        }
        // The unwritten top-level blocks (`tops.rs`): counted, on no list yet.
        let (unwritten, top) = (self.unwritten_count(), 1u64 << self.max_order);
        blocks[Class::Reported as usize][self.max_order as usize] += unwritten;
        pages += unwritten as u64 * top;
        if self.unwritten < self.used_end || self.unwritten > self.npages || !self.unwritten.is_multiple_of(top as u32) {
            return Err(format!("unwritten top-level blocks from {}: below used_end {}, past the arena or misaligned", self.unwritten, self.used_end));
        }
        if unwritten > 0 && self.heads[Class::Reported as usize][self.max_order as usize] == NIL {
            return Err(format!("unwritten top-level blocks from {} behind an empty list", self.unwritten));
        }
        if blocks != self.listed.blocks || pages != self.listed.pages {
            return Err("listed counters disagree with the lists".into());
        }
        // Only the first page of a listed block says `Tag::Free`: the runs of free blocks are
        // found from the records beside them (`span.rs`, `free_block_containing`), which trust
        // it. (Past `used_end` every page is a never-touched part of a listed block.)
        let tagged = (0..self.used_end).filter(|&q| self.meta(q).tag() == Tag::Free).count();
        if tagged != below_used {
            return Err(format!("{tagged} records below used_end say Free, {below_used} listed blocks start there"));
        }
        if let Some(q) = (self.used_end..self.npages).find(|&q| self.state(q) != PageState::Reported) {
            return Err(format!("page {q} past used_end {} is {}", self.used_end, self.state(q).name()));
        }
        // The free-page map says which pages the lists hold (`arena/free_map/`).
        self.free_map_ref().check(|f| self.for_each_listed(|p, order| f(p, 1u32 << order)), pages)?;
        Ok(pages)
    }
}
