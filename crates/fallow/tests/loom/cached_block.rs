//! A cached block against the reporter (`cache/`, `report.rs`, `heap/`; mirrored).

use super::*;

// ---- A cached block against the reporter (cache/, report.rs, heap/; mirrored) ----
//
// One block of one page and one thread's cache, seen whole: the owner takes the block from its
// cache and gives it back on the hit paths, while the reporter asks the caches to drain, drains
// the unanswered one itself, and isolates, reports and returns whatever the lists then hold. The
// block's record word (`HitWord`: here its tag), its page state byte and the cache's stack sizes,
// pages and generations are atomics accessed as the real code accesses them (`Relaxed` but for
// the handshake); the cache's entries and the page's memory are loom `UnsafeCell`s, so two
// accesses to either without a happens-before edge between them fail the model. What the lock
// guards of the block (on a list or not, its record's counts, the in-flight slot) is a loom
// `Mutex`. `membarrier` is a SeqCst fence pair, as in the handshake model above. Left out: the
// counters that only the statistics read, the clock (every block is old enough to report), and
// the workers' wake-ups. Each function names the one it mirrors; with one block of order 0,
// `drain_to_half` never has anything to do and `pop`'s preference for a `Zeroed` block never
// applies (nothing here is zeroed).

const TAG_NONE: u32 = 0;
const TAG_FREE: u32 = 1;
const TAG_ALLOC: u32 = 2;
const TAG_ISOLATED: u32 = 3;
const TAG_CACHED: u32 = 4;

const REPORTED: u8 = 0;
const DIRTY: u8 = 1;
const ALLOCATED: u8 = 4;

/// Entry words: the block, and whether it is a mixed entry whose counts say every page is
/// `Reported` (it then sits on the zero stack). 0 is an empty slot (never read as an entry).
const ENTRY_PLAIN: u8 = 1;
const ENTRY_REPORTED: u8 = 2;
/// Entries of the one order (both stacks: dirty from slot 0 up, zero from slot 1 down) and the
/// high mark, in pages.
const CAP: u32 = 2;
const HIGH: u32 = 2;
/// `ISOLATION_WAITS` (heap/locked.rs), cut to one: after that `alloc_locked` grows the heap.
const WAITS: u32 = 1;

/// Which part of the protocols is broken on purpose.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Break {
    None,
    /// `drain_unanswered` drains a frozen cache without looking at `busy`.
    DrainIgnoresBusy,
    /// `report_one_batch` returns the batch to the lists (pages `Reported`) before its `madvise`.
    ReturnBeforeReport,
}

/// What the allocator lock guards of the block: whether it is on a free list, what its record's
/// counts say (every page `Reported`, else every page `Dirty`), and whether the reporter holds it
/// isolated (its in-flight slot).
#[derive(Default)]
struct Guarded {
    listed: bool,
    reported: bool,
    isolated: bool,
}

/// The block, the owner's cache, and what the lock guards.
struct World {
    lists: Mutex<Guarded>,
    /// The block record's `HitWord` (its tag).
    tag: AtomicU32,
    /// The page's state byte.
    state: AtomicU8,
    /// The page: what the program and `madvise` write.
    mem: UnsafeCell<u8>,
    /// Not in the real code: how many of the owner (from hand-out to free) and the reporter
    /// (from `isolate` to `unisolate`) hold the block. A relaxed read-modify-write orders
    /// nothing, so it adds no happens-before edge that the protocol lacks.
    holders: AtomicU32,
    // `ThreadCache`.
    hs: Handshake,
    entries: UnsafeCell<[u8; CAP as usize]>,
    ndirty: AtomicU32,
    nzero: AtomicU32,
    pages: AtomicU32,
    seen_generation: AtomicU64,
    /// `ThreadCache::drain_asked`.
    asked: AtomicU32,
    /// `HitPath::drain_generation`.
    generation: AtomicU64,
    broken: Break,
}

impl World {
    /// The block as a program holds it after writing to it (`live: true`, the cache empty), or
    /// in the owner's cache, dirty, after the program freed it.
    fn new(live: bool, broken: Break) -> World {
        World {
            lists: Mutex::new(Guarded::default()),
            tag: AtomicU32::new(if live { TAG_ALLOC } else { TAG_CACHED }),
            state: AtomicU8::new(if live { ALLOCATED } else { DIRTY }),
            mem: UnsafeCell::new(1),
            holders: AtomicU32::new(live as u32),
            hs: Handshake::new(),
            entries: UnsafeCell::new([if live { 0 } else { ENTRY_PLAIN }, 0]),
            ndirty: AtomicU32::new(!live as u32),
            nzero: AtomicU32::new(0),
            pages: AtomicU32::new(!live as u32),
            seen_generation: AtomicU64::new(0),
            asked: AtomicU32::new(0),
            generation: AtomicU64::new(0),
            broken,
        }
    }

    /// Instrumentation: `who` now holds the block, and nobody else may.
    fn take_hold(&self, who: &str) {
        assert_eq!(self.holders.fetch_add(1, Relaxed), 0, "{who} got the block while someone else held it");
    }

    fn let_go(&self) {
        self.holders.fetch_sub(1, Relaxed);
    }

    // -- The owner. --

    /// The entry at `i` (`ThreadCache::read`, a plain read).
    fn read(&self, i: u32) -> u8 {
        // SAFETY: `e` is the cell's own pointer, valid for the closure; the owner reads between
        // `enter` and `leave`, the reporter while the owner is kept out (loom fails a racing access).
        let e = self.entries.with(|e| unsafe { (*e)[i as usize] });
        assert_ne!(e, 0, "an empty slot read as an entry");
        e
    }

    /// `ThreadCache::write`, a plain write.
    fn write(&self, i: u32, e: u8) {
        // SAFETY: as in `read`.
        self.entries.with_mut(|a| unsafe { (*a)[i as usize] = e });
    }

    fn sub_page(&self) {
        self.pages.store(self.pages.load(Relaxed) - 1, Relaxed);
    }

    /// Mirrors `ThreadCache::alloc_hit` (order 0): the top of the dirty stack, if it is a plain
    /// entry whose block is still `Cached`.
    fn alloc_hit(&self) -> bool {
        let nd = self.ndirty.load(Relaxed);
        if nd == 0 {
            return false;
        }
        if self.read(nd - 1) != ENTRY_PLAIN {
            return false;
        }
        if self.tag.load(Relaxed) != TAG_CACHED {
            return false;
        }
        self.ndirty.store(nd - 1, Relaxed);
        self.tag.store(TAG_ALLOC, Relaxed);
        self.take_hold("a hit alloc");
        self.sub_page();
        true
    }

    /// Mirrors `ThreadCache::pop` (without the preference for a `Zeroed` block, see the top):
    /// `pop_dirty`, else `pop_zero`.
    fn pop(&self) -> Option<u8> {
        let nd = self.ndirty.load(Relaxed);
        if nd > 0 {
            self.ndirty.store(nd - 1, Relaxed);
            return Some(self.read(nd - 1));
        }
        let nz = self.nzero.load(Relaxed);
        if nz > 0 {
            self.nzero.store(nz - 1, Relaxed);
            return Some(self.read(CAP - nz));
        }
        None
    }

    /// Mirrors `ThreadCache::push`: a mixed entry that needs no zeroing on the zero stack, any
    /// other on the dirty stack.
    fn push(&self, e: u8) {
        let (nd, nz) = (self.ndirty.load(Relaxed), self.nzero.load(Relaxed));
        assert!(nd + nz < CAP);
        if e == ENTRY_REPORTED {
            self.write(CAP - 1 - nz, e);
            self.nzero.store(nz + 1, Relaxed);
        } else {
            self.write(nd, e);
            self.ndirty.store(nd + 1, Relaxed);
        }
    }

    /// Mirrors `Allocator::prepare`: a `ZERO` request memsets the pages whose state does not read
    /// zero, unless the counts say none needs it; then the pages are `Allocated`.
    fn prepare(&self, zero: bool, reported: bool) {
        if zero && !reported && self.state.load(Relaxed) != REPORTED {
            // SAFETY: `m` is the cell's own pointer, valid for the closure; the owner holds the block
            // (loom fails an access of the reporter's not ordered with this one).
            self.mem.with_mut(|m| unsafe { *m = 0 });
        }
        self.state.store(ALLOCATED, Relaxed);
    }

    /// Mirrors `ThreadCache::alloc` (order 0, inside `enter` / `leave`): pop, else refill and pop
    /// (`alloc_slow`); skip an entry whose block is no longer `Cached`; hand out; prepare.
    fn cache_alloc(&self, zero: bool) -> bool {
        loop {
            let e = match self.pop() {
                Some(e) => e,
                None => {
                    self.refill();
                    match self.pop() {
                        Some(e) => e,
                        None => return false,
                    }
                }
            };
            if self.tag.load(Relaxed) != TAG_CACHED {
                self.sub_page();
                continue;
            }
            self.tag.store(TAG_ALLOC, Relaxed); // hand_out
            self.take_hold("a cache alloc");
            self.sub_page();
            self.prepare(zero, e == ENTRY_REPORTED);
            return true;
        }
    }

    /// Mirrors `ThreadCache::refill` (order 0, the one block): obey a drain request, then take
    /// the block off the lists if it is there (`Arena::take`) into the cache.
    fn refill(&self) {
        let mut h = self.lists.lock().unwrap();
        self.obey_drain_request(&mut h);
        if h.listed {
            h.listed = false;
            self.tag.store(TAG_CACHED, Relaxed);
            self.push(if h.reported { ENTRY_REPORTED } else { ENTRY_PLAIN });
            self.pages.store(self.pages.load(Relaxed) + 1, Relaxed);
        }
    }

    /// Mirrors `Allocator::alloc_locked`: take the block off the lists; while the reporter holds
    /// it isolated, wait (`WAITS` times); then grow the heap (a new arena's block: `false`).
    fn alloc_locked(&self, zero: bool) -> bool {
        let mut waits = 0;
        loop {
            let mut h = self.lists.lock().unwrap();
            if h.listed {
                h.listed = false;
                self.tag.store(TAG_ALLOC, Relaxed);
                self.take_hold("a locked alloc");
                let reported = h.reported;
                drop(h);
                self.prepare(zero, reported);
                return true;
            }
            let isolated = h.isolated;
            drop(h);
            if isolated && waits < WAITS {
                waits += 1;
                thread::yield_now(); // os::sleep_ns(100_000)
                continue;
            }
            return false;
        }
    }

    /// Mirrors `Allocator::alloc` of one page (`zero`: with `Flags::ZERO`): the hit path for a
    /// plain request (`alloc_hit`, then the page `Allocated` after `leave`), else `alloc_slow`:
    /// `alloc_cached` (`ThreadCache::alloc` inside `enter` / `leave`), else `alloc_locked`.
    /// `true`: the program got the block (else a new arena's page).
    fn alloc(&self, zero: bool) -> bool {
        if !zero && self.hs.enter(true) {
            let hit = self.alloc_hit();
            self.hs.leave();
            if hit {
                self.state.store(ALLOCATED, Relaxed); // fill_block
                return true;
            }
        }
        if self.hs.enter(true) {
            let got = self.cache_alloc(zero);
            self.hs.leave();
            if got {
                return true;
            }
        }
        self.alloc_locked(zero)
    }

    /// Mirrors `ThreadCache::needs_room_at`: the request is the flag on the hit path
    /// (`may_drain` false), the generation off it.
    fn needs_room(&self, may_drain: bool) -> bool {
        self.pages.load(Relaxed) + 1 > HIGH
            || self.ndirty.load(Relaxed) == CAP - self.nzero.load(Relaxed)
            || if may_drain { self.generation.load(Relaxed) != self.seen_generation.load(Relaxed) } else { self.asked.load(Relaxed) != 0 }
    }

    /// Mirrors `ThreadCache::take_freed` (`free_hit`: `may_drain` false; `free`: true) for the
    /// live block.
    fn take_freed(&self, may_drain: bool) -> bool {
        if self.tag.load(Relaxed) != TAG_ALLOC {
            return false; // live_unlocked
        }
        if self.needs_room(may_drain) {
            if !may_drain {
                return false;
            }
            self.make_room();
        }
        self.tag.store(TAG_CACHED, Relaxed);
        let nd = self.ndirty.load(Relaxed);
        self.write(nd, ENTRY_PLAIN);
        self.ndirty.store(nd + 1, Relaxed);
        self.pages.store(self.pages.load(Relaxed) + 1, Relaxed);
        self.state.store(DIRTY, Relaxed); // fill_block, before `leave`
        true
    }

    /// Mirrors `ThreadCache::make_room`: obey a drain request (else `drain_to_half`, which finds
    /// nothing over half here).
    fn make_room(&self) {
        let mut h = self.lists.lock().unwrap();
        self.obey_drain_request(&mut h);
    }

    /// Mirrors `ThreadCache::obey_drain_request`.
    fn obey_drain_request(&self, h: &mut Guarded) -> bool {
        let g = self.generation.load(Relaxed);
        if g == self.seen_generation.load(Relaxed) {
            return false;
        }
        self.seen_generation.store(g, Relaxed);
        self.asked.store(0, Relaxed);
        self.drain_all_locked(h);
        true
    }

    /// Mirrors `Allocator::free_checked`: the hit path (`free_hit` between `enter` and `leave`),
    /// else `free_slow`: `ThreadCache::free` inside `enter` / `leave`, else `free_locked`.
    fn free(&self) {
        self.let_go();
        if self.hs.enter(true) {
            let hit = self.take_freed(false);
            self.hs.leave();
            if hit {
                return;
            }
        }
        if self.hs.enter(true) {
            let hit = self.take_freed(true);
            self.hs.leave();
            if hit {
                return;
            }
        }
        // free_locked: `live_block` checks the record, the pages become `Dirty`, the block listed.
        let mut h = self.lists.lock().unwrap();
        assert_eq!(self.tag.load(Relaxed), TAG_ALLOC, "the locked free found no live block");
        self.state.store(DIRTY, Relaxed);
        self.list(&mut h, false);
    }

    /// The program writes to the block it holds.
    fn write_mem(&self, v: u8) {
        // SAFETY: `m` is the cell's own pointer, valid for the closure; the program holds the block
        // (loom fails an access of the reporter's not ordered with this one).
        self.mem.with_mut(|m| unsafe { *m = v });
    }

    fn read_mem(&self) -> u8 {
        // SAFETY: as in `write_mem`.
        self.mem.with(|m| unsafe { *m })
    }

    // -- Under the lock. --

    /// `Arena::free_block` of the block: tag `Free`, on a list, its counts.
    fn list(&self, h: &mut Guarded, reported: bool) {
        assert!(!h.listed, "the block was listed twice");
        self.tag.store(TAG_FREE, Relaxed);
        h.listed = true;
        h.reported = reported;
    }

    /// Mirrors `ThreadCache::drain_all_locked` -> `drain_locked` -> `give_back`: every entry
    /// back to the lists unless its block is no longer `Cached`.
    fn drain_all_locked(&self, h: &mut Guarded) {
        let (nd, nz) = (self.ndirty.load(Relaxed), self.nzero.load(Relaxed));
        if nd + nz == 0 {
            return;
        }
        let entries = (0..nd).map(|i| self.read(i)).chain((0..nz).map(|i| self.read(CAP - 1 - i)));
        for e in entries.collect::<Vec<_>>() {
            self.sub_page();
            if self.tag.load(Relaxed) != TAG_CACHED {
                continue;
            }
            self.tag.store(TAG_NONE, Relaxed);
            self.list(h, e == ENTRY_REPORTED);
        }
        self.ndirty.store(0, Relaxed);
        self.nzero.store(0, Relaxed);
    }

    // -- The reporter. --

    /// Mirrors `report::caches_step` from the request (`ask_to_drain`: under the lock, the
    /// generation bumped and the cache's flag set) through its nap to `cache::drain_unanswered`
    /// of that generation. Returns whether it drained the cache, and whether it found the owner
    /// inside.
    fn caches_step(&self) -> (bool, bool) {
        let g = {
            let _h = self.lists.lock().unwrap();
            let g = self.generation.fetch_add(1, Relaxed) + 1;
            self.asked.store(1, Relaxed);
            g
        };
        self.drain_unanswered(g)
    }

    /// Mirrors `cache::drain_unanswered`: freeze under the lock, `membarrier`, then under the
    /// lock again drain if the owner is not `busy`, and thaw.
    fn drain_unanswered(&self, g: u64) -> (bool, bool) {
        {
            let _h = self.lists.lock().unwrap();
            if self.pages.load(Relaxed) == 0 || self.seen_generation.load(Relaxed) == g {
                return (false, false);
            }
            self.hs.frozen.store(1, Relaxed);
        }
        fence(SeqCst); // crate::os::membarrier()
        let mut h = self.lists.lock().unwrap();
        let (mut drained, mut busy) = (false, false);
        if self.hs.frozen.load(Relaxed) != 0 {
            busy = self.hs.busy.load(Acquire) != 0;
            if !busy || self.broken == Break::DrainIgnoresBusy {
                self.drain_all_locked(&mut h);
                self.seen_generation.store(g, Relaxed);
                self.asked.store(0, Relaxed); // no later request here
                drained = true;
            }
            self.hs.frozen.store(0, Release);
        }
        (drained, busy)
    }

    /// Mirrors `report::report_one_batch` for the block: isolate it if it is listed and not yet
    /// reported (the scan looks at the `Dirty` and `Zeroed` lists), report it without the lock
    /// (`MADV_DONTNEED`, which zeroes the page), return it under the lock (`Heap::unisolate`:
    /// pages `Reported`, listed).
    fn report_one_batch(&self) {
        {
            let mut h = self.lists.lock().unwrap();
            if !h.listed || h.reported {
                return;
            }
            h.listed = false; // Heap::isolate: unlink, tag `Isolated`, the in-flight slot
            self.tag.store(TAG_ISOLATED, Relaxed);
            h.isolated = true;
            self.take_hold("the reporter's isolation");
        }
        if self.broken == Break::ReturnBeforeReport {
            self.unisolate();
        }
        // SAFETY: `m` is the cell's own pointer, valid for the closure; the reporter holds the block
        // isolated (loom fails an access of the owner's not ordered with this one).
        self.mem.with_mut(|m| unsafe { *m = 0 }); // madvise(MADV_DONTNEED)
        if self.broken != Break::ReturnBeforeReport {
            self.unisolate();
        }
    }

    /// `Heap::unisolate` of the reported block, under the lock.
    fn unisolate(&self) {
        let mut h = self.lists.lock().unwrap();
        self.state.store(REPORTED, Relaxed);
        h.isolated = false;
        self.let_go();
        self.tag.store(TAG_NONE, Relaxed);
        self.list(&mut h, true);
    }

    /// Where the block is once every thread is done: `(listed, in the cache)`.
    fn settle(&self) -> (bool, bool) {
        let h = self.lists.lock().unwrap();
        assert!(!h.isolated);
        let cached = self.ndirty.load(Relaxed) + self.nzero.load(Relaxed);
        assert!(cached <= 1);
        assert_eq!(self.pages.load(Relaxed), cached, "the cache's page count is off");
        if cached == 1 {
            assert_eq!(self.tag.load(Relaxed), TAG_CACHED);
        }
        if h.listed {
            assert_eq!(self.tag.load(Relaxed), TAG_FREE);
        }
        (h.listed, cached == 1)
    }
}

/// The owner takes the cached block on the hit path, writes to it and (`free`) frees it (the hit
/// path, or the locked one if frozen), while the reporter drains the cache as unanswered and
/// reports what the lists then hold: the block is never the owner's while the reporter has it
/// isolated, never listed twice, and ends in exactly one place.
fn hit_alloc_free_model(broken: Break, free: bool) {
    model(move || {
        let w = Arc::new(World::new(false, broken));
        let w2 = w.clone();
        let owner = thread::spawn(move || {
            let got = w2.alloc(false);
            if got {
                w2.write_mem(2);
                if free {
                    w2.free();
                }
            }
            got && !free
        });
        w.caches_step();
        w.report_one_batch();
        let holds = owner.join().unwrap();
        let (listed, cached) = w.settle();
        let places = [listed, cached, holds].iter().filter(|&&x| x).count();
        assert_eq!(places, 1, "the block is listed {listed}, cached {cached}, held {holds}");
        assert_eq!(w.holders.load(Relaxed), holds as u32);
    });
}

/// The owner frees the block it wrote to (the hit path; the cache then holds it), then asks for
/// a zeroed page (`Flags::ZERO`: from its cache, by a refill from the lists, or on the locked
/// path), while the reporter drains the cache as unanswered and reports what the lists hold: a
/// page handed out as zeroed reads zero (a reported block skips the memset only because its
/// pages read zero), and the block is never the owner's while the reporter has it isolated.
fn free_then_zero_alloc_model(broken: Break) {
    model(move || {
        let w = Arc::new(World::new(true, broken));
        let w2 = w.clone();
        let owner = thread::spawn(move || {
            w2.free();
            if w2.alloc(true) {
                assert_eq!(w2.read_mem(), 0, "a page handed out as zeroed does not read zero");
                w2.write_mem(3);
            }
        });
        w.caches_step();
        w.report_one_batch();
        owner.join().unwrap();
        w.settle();
    });
}

#[test]
fn a_cached_block_is_never_the_owners_while_the_reporter_isolates_it() {
    hit_alloc_free_model(Break::None, true);
}

#[test]
fn a_block_handed_out_as_zeroed_reads_zero_though_the_reporter_drained_and_reported_it() {
    free_then_zero_alloc_model(Break::None);
}

// `drain_unanswered` draining a frozen cache without looking at `busy`: the owner's hit alloc
// takes the block while the reporter drains and isolates it. (The owner does not free it here:
// its push would race with the drain's read of the entries, which loom reports first, as in the
// handshake model above.)
broken_on_purpose!(
    broken_drain_ignoring_busy,
    a_drain_that_ignores_busy_hands_the_block_out_twice,
    "while someone else held it",
    hit_alloc_free_model(Break::DrainIgnoresBusy, false)
);

// The reporter returning the block (pages `Reported`) before its `madvise`: the owner's `ZERO`
// request takes it and skips the memset, and its read of the page is not ordered after the
// `madvise` (it may see the program's old data): loom reports the read racing the write.
broken_on_purpose!(
    broken_return_before_report,
    a_block_returned_before_its_report_is_handed_out_unzeroed,
    "Causality violation",
    free_then_zero_alloc_model(Break::ReturnBeforeReport)
);
