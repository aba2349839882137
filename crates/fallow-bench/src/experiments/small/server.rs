//! server: the shape of larson, a server whose threads free what other threads allocated. Every
//! thread (`--threads`, at least 2) replaces random slots of one shared array of `SLOTS` objects
//! per thread (`objects::server_size`: 8-1000 bytes): it allocates and writes the new object,
//! swaps it into the slot (one atomic exchange, the same for every peer) and checks and frees the
//! object it took out, whichever thread made it: with T threads about (T-1)/T of the frees are of
//! another thread's objects, which an allocator with per-thread heaps must send back to their
//! owner. Each thread fills its share of the array first; at the end each frees its share.

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Barrier;

use super::objects::{self, server_size};
use crate::measure::XorShift;

/// The slots of the shared array per thread.
pub const SLOTS: usize = 1000;

/// `steps` replacements per thread on `threads` threads (thread t with its own stream of `seed`);
/// the replacements done (one `malloc` and one `free` each, all threads).
pub fn workload(steps: usize, threads: usize, seed: u64) -> Result<u64, String> {
    let threads = threads.max(2);
    let slots: Vec<AtomicPtr<u8>> = (0..SLOTS * threads).map(|_| AtomicPtr::new(core::ptr::null_mut())).collect();
    let (filled, done) = (Barrier::new(threads), Barrier::new(threads));
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (slots, filled, done) = (&slots, &filled, &done);
                sc.spawn(move || -> Result<(), String> {
                    let mut rng = XorShift::new(seed.wrapping_mul(1 << 16).wrapping_add(t as u64));
                    // A thread that fails still meets the others at both barriers, so none waits forever.
                    let mut result = (t..slots.len()).step_by(threads).try_for_each(|i| {
                        slots[i].store(objects::new(server_size(&mut rng), i as u8)?, Ordering::Release);
                        Ok(())
                    });
                    filled.wait();
                    if result.is_ok() {
                        result = (0..steps).try_for_each(|k| {
                            let p = objects::new(server_size(&mut rng), k as u8)?;
                            let old = slots[rng.range(0, slots.len() - 1)].swap(p, Ordering::AcqRel);
                            // SAFETY: a slot holds a live object from `objects::new` (every slot was
                            // filled before the barrier) or, were a filler to have failed, null; the
                            // exchange gave it to this thread alone, which frees it once.
                            (!old.is_null()).then(|| unsafe { objects::release(old) }).transpose().map(drop)
                        });
                    }
                    done.wait();
                    for i in (t..slots.len()).step_by(threads) {
                        let p = slots[i].swap(core::ptr::null_mut(), Ordering::AcqRel);
                        if !p.is_null() {
                            // SAFETY: as above: taken out of its slot by this thread alone, freed once.
                            let r = unsafe { objects::release(p) };
                            result = result.and(r.map(drop));
                        }
                    }
                    result
                })
            })
            .collect();
        for h in hs {
            h.join().map_err(|_| "a server thread panicked".to_string())??;
        }
        Ok((steps * threads) as u64)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_server_runs_on_two_threads_and_checks_its_objects() {
        assert_eq!(super::workload(3000, 2, 1), Ok(6000));
    }
}
