//! The slab's side metadata, all from the operating system (never from `malloc`): the page map
//! (per arena, one word per 64 KiB granule naming the span descriptor that covers it, 0 for
//! none), the descriptors themselves, taken from chunks and recycled, never unmapped before the
//! slab, and the pages of the thread heaps.
//!
//! The map of an arena is reserved with `MAP_NORESERVE` when the arena's first span is made, so
//! only the parts that spans touched are committed (8 bytes per 64 KiB: 128 KiB of map for 1 GiB
//! of spans). Finding a pointer's span reads no header in front of the object: the arena's view
//! (`Shared::view_of`), then one map word.

use core::sync::atomic::{AtomicUsize, Ordering::{Acquire, Relaxed, Release}};

use super::class::GRANULE_SHIFT;
use super::span::{Span, FREE_DESCRIPTOR};
use super::thread_free::ADDRESS_LIMIT;
use super::Slab;
use crate::error::Error;
use crate::heap::MAX_ARENAS;
use crate::os::{self, PAGE_SIZE};

/// Descriptors per chunk (64 KiB of 192-byte descriptors; the first slot holds the chunk link).
const CHUNK_BYTES: usize = 64 << 10;
const PER_CHUNK: usize = CHUNK_BYTES / core::mem::size_of::<Span>();
const _: () = assert!(core::mem::size_of::<Span>() == 192);

/// The maps of the arenas (an address per arena, 0 until its first span) and their lengths.
pub(crate) struct PageMaps {
    base: [AtomicUsize; MAX_ARENAS],
    bytes: [AtomicUsize; MAX_ARENAS],
}

/// Where a pointer is, as the page map tells it.
pub(crate) enum Found<'a> {
    /// In no arena of this allocator.
    Foreign,
    /// In an arena, not in a span: a page block's, or nobody's.
    Pages,
    /// In this span.
    Span(&'a Span),
}

impl PageMaps {
    pub(crate) fn new() -> PageMaps {
        PageMaps { base: core::array::from_fn(|_| AtomicUsize::new(0)), bytes: core::array::from_fn(|_| AtomicUsize::new(0)) }
    }

    /// The map entry of `addr` in arena `ai` based at `arena_base`, if that arena has a map.
    #[inline(always)]
    fn entry(&self, ai: usize, arena_base: usize, addr: usize) -> Option<&AtomicUsize> {
        // Acquire: the map's pages were mapped before its address was published.
        let map = self.base[ai].load(Acquire);
        if map == 0 {
            return None;
        }
        // SAFETY: `addr` lies in arena `ai` (the caller found it there), and the map has one
        // word per granule of the whole arena, reserved for the slab's life.
        Some(unsafe { &*((map + ((addr - arena_base) >> GRANULE_SHIFT) * 8) as *const AtomicUsize) })
    }

    /// Reserve the map of arena `ai` (`len` bytes), unless it has one: its address.
    pub(crate) fn reserve(&self, ai: usize, len: usize) -> Result<usize, Error> {
        let have = self.base[ai].load(Acquire);
        if have != 0 {
            return Ok(have);
        }
        let bytes = ((len >> GRANULE_SHIFT) * 8).next_multiple_of(PAGE_SIZE);
        let map = os::scratch(bytes).map_err(|errno| Error::Os { op: "mmap (slab page map)", errno })?;
        self.bytes[ai].store(bytes, Relaxed);
        self.base[ai].store(map, Release);
        Ok(map)
    }

    /// Unmap every map (the slab is going away).
    fn unmap_all(&self) {
        for (b, n) in self.base.iter().zip(&self.bytes) {
            let (b, n) = (b.load(Relaxed), n.load(Relaxed));
            if b != 0 {
                // SAFETY: a map this slab reserved, referenced by nothing once the slab is dropped.
                unsafe { os::unmap(b, n) };
            }
        }
    }
}

impl Slab {
    /// Where `addr` is: in a span (its descriptor), in an arena outside spans, or in no arena.
    /// The first arena (which holds most blocks) is tested inline against the slab's own copy
    /// of its range; the others through the allocator's views.
    #[inline(always)]
    pub(crate) fn find(&self, addr: usize) -> Found<'_> {
        let e = match self.keys.first.entry(addr) {
            Some(e) => e,
            None => match self.find_other(addr) {
                Some(e) => e,
                None => return if self.shared.view_of(addr).is_some() { Found::Pages } else { Found::Foreign },
            },
        };
        // Acquire: the descriptor was set up before it was published here.
        let s = e.load(Acquire);
        if s == 0 {
            return Found::Pages;
        }
        // SAFETY: a non-zero entry is a descriptor of this slab's chunks, which live as long as
        // the slab (recycled, never unmapped); its shared fields are atomics.
        Found::Span(unsafe { &*(s as *const Span) })
    }

    /// The map entry of `addr` in an arena after the first (none: no such arena, or no map).
    #[inline(never)]
    fn find_other(&self, addr: usize) -> Option<&AtomicUsize> {
        let (ai, v) = self.shared.view_of(addr)?;
        self.maps.entry(ai, v.base(), addr)
    }

    /// The map entries of the span at `start` of `bytes` (granules), making the arena's map at
    /// its first span.
    pub(crate) fn map_entries(&self, start: usize, bytes: usize) -> Result<impl Iterator<Item = &AtomicUsize>, Error> {
        let (ai, v) = self.shared.view_of(start).ok_or(Error::InvalidPointer { addr: start })?;
        // The remote-free protocol keeps a count above an object's address in one word
        // (thread_free.rs, `HEAD`): an arena the kernel placed above it holds no span (Linux places
        // mappings below 2^47 unless asked for higher ones).
        if v.base() + v.len() > ADDRESS_LIMIT {
            return Err(Error::Os { op: "slab span above 2^48", errno: libc::ENOMEM });
        }
        if self.maps.base[ai].load(Acquire) == 0 {
            let _g = self.central.lock();
            self.maps.reserve(ai, v.len())?;
        }
        let base = v.base();
        Ok((0..bytes >> GRANULE_SHIFT).map(move |g| self.maps.entry(ai, base, start + (g << GRANULE_SHIFT)).unwrap()))
    }
}

/// Descriptors not in use, on a list through their `next` links (under the slab lock), and the
/// chunks they came from. A new chunk's descriptors are handed out in order (`fresh`) rather
/// than linked all at once: linking them wrote every one, 64 KiB resident for a process that
/// uses a few spans.
pub(crate) struct Descriptors {
    free: *mut Span,
    chunks: usize,
    /// The next never-used slot of the newest chunk (`PER_CHUNK`: none left).
    fresh: usize,
}

// SAFETY: only reached under the slab lock (`Locked<Descriptors>`); the pointers are to the
// slab's own chunks.
unsafe impl Send for Descriptors {}

impl Descriptors {
    pub(crate) const fn new() -> Descriptors {
        Descriptors { free: core::ptr::null_mut(), chunks: 0, fresh: PER_CHUNK }
    }

    /// A free descriptor: one given back, else the newest chunk's next never-used one, else the
    /// first of a new chunk from the OS.
    pub(crate) fn take(&mut self) -> Result<*mut Span, Error> {
        if !self.free.is_null() {
            let s = self.free;
            // SAFETY: `free` is a free descriptor of a chunk that lives as long as the slab.
            self.free = unsafe { (*s).next.get() };
            return Ok(s);
        }
        if self.fresh == PER_CHUNK {
            let chunk = os::scratch(CHUNK_BYTES).map_err(|errno| Error::Os { op: "mmap (slab descriptors)", errno })?;
            // The first slot links the chunks (for the slab's drop); the rest are descriptors.
            // SAFETY: `chunk` is a fresh mapping of `CHUNK_BYTES`, ours; its first word is the
            // link.
            unsafe { *(chunk as *mut usize) = self.chunks };
            self.chunks = chunk;
            self.fresh = 1;
        }
        // SAFETY: slot `fresh` (1..PER_CHUNK) of the newest chunk, never handed out: zeroed by
        // the kernel, and a zeroed `Span` is a valid free descriptor (all fields integers, null
        // pointers or cells of them).
        let s = unsafe { (self.chunks as *mut Span).add(self.fresh) };
        self.fresh += 1;
        Ok(s)
    }

    /// Objects used in every span (descriptors with an owner heap) and their bytes: racy sums
    /// of the owners' counts, for the statistics.
    pub(crate) fn used_objects(&self) -> (u64, u64) {
        let (mut objects, mut bytes) = (0u64, 0u64);
        let mut chunk = self.chunks;
        while chunk != 0 {
            for i in 1..PER_CHUNK {
                // SAFETY: a descriptor of a chunk of this slab (mapped until the slab's drop);
                // only its atomics are read.
                let s = unsafe { &*(chunk as *const Span).add(i) };
                // A claimed span's objects are all free (its descriptor waits for its owner).
                if !s.heap.load(Relaxed).is_null() && !s.is_claimed() {
                    let n = s.used() as u64;
                    objects += n;
                    bytes += n * s.size.load(Relaxed) as u64;
                }
            }
            // SAFETY: the chunk's first word links the next chunk.
            chunk = unsafe { *(chunk as *const usize) };
        }
        (objects, bytes)
    }

    /// Give back a descriptor no span uses and no list holds.
    pub(crate) fn give(&mut self, s: &Span) {
        debug_assert!(s.place() != FREE_DESCRIPTOR, "a descriptor given back twice");
        s.set_place(FREE_DESCRIPTOR);
        s.next.set(self.free);
        self.free = s as *const Span as *mut Span;
    }

    pub(super) fn unmap_all(&mut self) {
        while self.chunks != 0 {
            let c = self.chunks;
            // SAFETY: a chunk this slab mapped; its first word links the next one.
            self.chunks = unsafe { *(c as *const usize) };
            // SAFETY: no descriptor is used once the slab is dropped.
            unsafe { os::unmap(c, CHUNK_BYTES) };
        }
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        self.maps.unmap_all();
        let mut c = self.central.lock();
        c.descriptors.unmap_all();
        c.unmap_heaps();
    }
}

/// The first arena's range and its page map of spans: what the hot path of a free reads to
/// find an address's span (one range test and one map word, no call). Plain words, fixed when
/// the slab is made: the slab keeps a copy in its `Keys`, and a binding may keep one of its own
/// (`Allocator::span_map`, the preload library's `free`). The map lives as long as the slab.
#[derive(Clone, Copy)]
pub struct SpanMap {
    pub(crate) base: usize,
    pub(crate) len: usize,
    /// The page map's address: one word per granule of the arena, a descriptor or 0.
    pub(crate) map: usize,
}

impl SpanMap {
    /// A map of no arena: every address is outside it.
    pub const EMPTY: SpanMap = SpanMap { base: 0, len: 0, map: 0 };

    /// The page-map word of `addr`'s granule if `addr` lies in the first arena (one range test).
    #[inline(always)]
    pub(crate) fn entry(&self, addr: usize) -> Option<&AtomicUsize> {
        let off = addr.wrapping_sub(self.base);
        if off >= self.len {
            return None;
        }
        // SAFETY: `off` is inside arena 0, whose map (reserved with the slab, `len` not 0 only
        // then) has one word per granule, and lives as long as the slab (the `SpanMap`'s
        // contract).
        Some(unsafe { &*((self.map + (off >> GRANULE_SHIFT) * 8) as *const AtomicUsize) })
    }

    /// The span of `addr` if it lies in one of the first arena's; `None` for any other
    /// address, including spans of the other arenas (`Slab::find` answers for those).
    #[inline(always)]
    pub(crate) fn find(&self, addr: usize) -> Option<&Span> {
        // Acquire: the descriptor was set up before it was published here.
        let s = self.entry(addr)?.load(Acquire);
        // SAFETY: a non-zero entry is a descriptor of this slab's chunks, which live as long as
        // the slab (recycled, never unmapped), and a `SpanMap` is used only while its slab
        // lives (the slab's own copy, or a binding's under `Allocator::span_map`'s contract);
        // its shared fields are atomics.
        (s != 0).then(|| unsafe { &*(s as *const Span) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of `[addr, addr + len)` resident (`mincore`).
    fn resident_pages(addr: usize, len: usize) -> usize {
        let mut v = vec![0u8; len.div_ceil(PAGE_SIZE)];
        // SAFETY: `addr` is page-aligned and mapped for `len` bytes (the caller's chunk); `v`
        // has one byte per page.
        let r = unsafe { libc::mincore(addr as *mut libc::c_void, len, v.as_mut_ptr()) };
        assert_eq!(r, 0);
        v.iter().filter(|&&b| b & 1 != 0).count()
    }

    #[test]
    fn a_new_chunk_is_written_only_where_descriptors_are_handed_out() {
        let mut d = Descriptors::new();
        let a = d.take().unwrap();
        let b = d.take().unwrap();
        // SAFETY: a descriptor just taken, this test's alone; in use as a span's would be.
        unsafe {
            (*b).class.set(7);
            (*b).set_place(crate::slab::span::LEAVING);
        }
        let chunk = d.chunks;
        assert_eq!((a as usize, b as usize), (chunk + size_of::<Span>(), chunk + 2 * size_of::<Span>()));
        // The link word and two descriptors: the first page alone (linking every descriptor of
        // the chunk at its creation wrote all 16).
        assert_eq!(resident_pages(chunk, CHUNK_BYTES), 1);
        // SAFETY: `b` is a descriptor of the chunk, taken above and used by nothing.
        d.give(unsafe { &*b });
        assert_eq!(d.take().unwrap(), b, "a descriptor given back is taken first");
        for _ in 3..PER_CHUNK {
            d.take().unwrap();
        }
        assert_eq!(d.chunks, chunk, "the chunk's last descriptor came from it");
        d.take().unwrap();
        assert_ne!(d.chunks, chunk, "a new chunk once every slot is used");
        d.unmap_all();
    }
}
