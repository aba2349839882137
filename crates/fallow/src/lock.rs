//! The allocator lock: a futex mutex with explicit `lock`/`unlock`, so that `fork` handlers can
//! take it in the parent and release it in both parent and child (a guard-based mutex cannot).
//! It never allocates. States: 0 unlocked, 1 locked, 2 locked with waiters (Drepper's
//! "Futexes are tricky", mutex 3).

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU32, Ordering};

use crate::os;

/// How long a waiter spins on the lock word before it sleeps, for locks whose critical
/// sections are a few hundred nanoseconds (the slab's central lists): 1.5 us.
pub(crate) const SPIN_NS_SHORT: u32 = 1_500;
/// The same for the page heap's lock, held for a run search (thousands of instructions, with a
/// cache miss at most of the records it reads): 15 us. With 1-2 us, two threads replacing random
/// 64 KiB-4 MiB blocks, most requests on the locked path, slept and woke each other at every
/// other call: 86-90 k operations per second against 106-108 k with 10-17 us (`bench mixed`;
/// four threads on two CPUs: 78-82 k against 100-103 k). The slab's lock keeps the short spin:
/// with the long one, larson (two threads freeing each other's small objects) did 79-80 M
/// operations a second against 82-87 M, no gain within its noise (73-113 M between rounds).
pub(crate) const SPIN_NS_LONG: u32 = 15_000;
/// Checks of the lock word between two reads of the clock while spinning (`pause` between
/// checks: 10-17 ns each on this project's test machine, about 40 on others).
const CHECKS_PER_CLOCK: u32 = 32;

pub struct RawLock {
    state: AtomicU32,
    /// How long a waiter spins before it sleeps, ns (`SPIN_NS_SHORT`, `SPIN_NS_LONG`): a time,
    /// not a count of checks, since `pause` takes 10 to 140 cycles depending on the CPU.
    spin_ns: u32,
}

impl Default for RawLock {
    fn default() -> Self {
        Self::new()
    }
}

impl RawLock {
    pub const fn new() -> Self {
        Self::with_spin_ns(SPIN_NS_SHORT)
    }

    /// A lock whose waiters spin for `spin_ns` before they sleep.
    pub const fn with_spin_ns(spin_ns: u32) -> Self {
        RawLock { state: AtomicU32::new(0), spin_ns }
    }

    #[inline]
    pub fn lock(&self) {
        if self
            .state
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
    }

    /// Take the lock if it is free; `false` (nothing taken) if anyone holds it.
    #[inline]
    pub fn try_lock(&self) -> bool {
        self.state.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    #[cold]
    fn lock_contended(&self) {
        // Spin first (for `spin_ns`): the critical sections are bookkeeping, shorter than a
        // futex sleep and wake.
        let start = os::now_ns();
        loop {
            for _ in 0..CHECKS_PER_CLOCK {
                core::hint::spin_loop();
                if self.state.load(Ordering::Relaxed) == 0
                    && self
                        .state
                        .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                {
                    return;
                }
            }
            if os::now_ns().saturating_sub(start) >= self.spin_ns as u64 {
                break;
            }
        }
        while self.state.swap(2, Ordering::Acquire) != 0 {
            os::futex_wait(&self.state, 2, None);
        }
    }

    /// # Safety
    /// The caller holds the lock.
    #[inline]
    pub unsafe fn unlock(&self) {
        if self.state.swap(0, Ordering::Release) == 2 {
            os::futex_wake_one(&self.state);
        }
    }

    /// Make the lock free again in a `fork` child, where the holder no longer exists.
    ///
    /// # Safety
    /// Only in a single-threaded child right after `fork`.
    pub unsafe fn reset_after_fork(&self) {
        self.state.store(0, Ordering::Relaxed);
    }
}

/// Data behind a [`RawLock`].
pub struct Locked<T> {
    lock: RawLock,
    data: UnsafeCell<T>,
}

// SAFETY: the data is reached only through a `Guard`, one at a time (the lock is held for its
// life), so sharing `Locked` shares `T` between threads one at a time, as a `Mutex<T>` does:
// `T: Send` suffices.
unsafe impl<T: Send> Sync for Locked<T> {}
// SAFETY: `Locked` owns its `T`; moving it moves the `T`.
unsafe impl<T: Send> Send for Locked<T> {}

pub struct Guard<'a, T> {
    owner: &'a Locked<T>,
}

impl<T> Locked<T> {
    pub const fn new(data: T) -> Self {
        Self::with_spin_ns(data, SPIN_NS_SHORT)
    }

    /// Its waiters spin for `spin_ns` before they sleep.
    pub const fn with_spin_ns(data: T, spin_ns: u32) -> Self {
        Locked { lock: RawLock::with_spin_ns(spin_ns), data: UnsafeCell::new(data) }
    }

    /// Set up a `Locked` at `dst` in place, free, its waiters spinning for `spin_ns`: `init`
    /// writes the data at the pointer it is given (for data too large to build on the stack
    /// and move).
    ///
    /// # Safety
    /// `dst` is valid for writes of a `Locked<T>` and aligned for it; whatever it held is
    /// overwritten without being dropped. `init` must write a whole valid `T` at its pointer
    /// (valid for writes of a `T`, aligned, uninitialised) before it returns.
    pub unsafe fn init_in(dst: *mut Self, spin_ns: u32, init: impl FnOnce(*mut T)) {
        // SAFETY: `dst` is valid for writes (the caller's contract); the places are its fields.
        unsafe { (&raw mut (*dst).lock).write(RawLock::with_spin_ns(spin_ns)) };
        // SAFETY: as above; `raw_get` gives the data's place without a reference to it.
        init(UnsafeCell::raw_get(unsafe { &raw const (*dst).data }));
    }

    #[inline]
    pub fn lock(&self) -> Guard<'_, T> {
        self.lock.lock();
        Guard { owner: self }
    }

    /// The guard if the lock is free now (see `RawLock::try_lock`).
    pub fn try_lock(&self) -> Option<Guard<'_, T>> {
        self.lock.try_lock().then_some(Guard { owner: self })
    }

    pub fn raw(&self) -> &RawLock {
        &self.lock
    }
}

impl<T> core::ops::Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while its thread holds the lock, so no other reference to
        // the data is live.
        unsafe { &*self.owner.data.get() }
    }
}

impl<T> core::ops::DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as `deref`, and `&mut self` makes this the guard's only borrow.
        unsafe { &mut *self.owner.data.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: a guard is made only by `lock`, which took the lock for it.
        unsafe { self.owner.lock.unlock() }
    }
}
