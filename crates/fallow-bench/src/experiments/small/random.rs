//! random: the shape of rptest's small sizes. Each of `--threads` threads (at least 2) keeps
//! `LIVE` objects of random sizes up to 16 KiB (`objects::random_size`) and replaces a random one
//! at each step: it checks and frees it, then allocates one of a new size and writes it (its
//! header, one byte of each 4 KiB page and its last byte: `objects::write`). No object crosses
//! threads; the threads share only the allocator.

use std::sync::Barrier;

use super::objects::{self, random_size};
use crate::measure::XorShift;

/// The objects each thread keeps live.
pub const LIVE: usize = 256;

fn thread_work(steps: usize, rng: &mut XorShift, start: &Barrier) -> Result<(), String> {
    let mut live = [core::ptr::null_mut::<u8>(); LIVE];
    let mut result = live.iter_mut().enumerate().try_for_each(|(i, slot)| {
        *slot = objects::new(random_size(rng), i as u8)?;
        Ok(())
    });
    start.wait();
    if result.is_ok() {
        result = (0..steps).try_for_each(|k| {
            let slot = &mut live[rng.range(0, LIVE - 1)];
            let old = std::mem::replace(slot, core::ptr::null_mut());
            // SAFETY: every slot holds a live object from `objects::new` (all were filled), this
            // thread's alone; taken out of its slot, it is freed once.
            unsafe { objects::release(old) }?;
            *slot = objects::new(random_size(rng), k as u8)?;
            Ok(())
        });
    }
    for p in live.into_iter().filter(|p| !p.is_null()) {
        // SAFETY: as above: a live object of this thread's, freed once.
        let r = unsafe { objects::release(p) };
        result = result.and(r.map(drop));
    }
    result
}

/// `steps` replacements per thread on `threads` threads started together (thread t with its own
/// stream of `seed`); the replacements done, all threads.
pub fn workload(steps: usize, threads: usize, seed: u64) -> Result<u64, String> {
    let threads = threads.max(2);
    let start = Barrier::new(threads);
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads as u64)
            .map(|t| {
                let start = &start;
                sc.spawn(move || thread_work(steps, &mut XorShift::new(seed.wrapping_mul(1 << 16).wrapping_add(t)), start))
            })
            .collect();
        for h in hs {
            h.join().map_err(|_| "a random thread panicked".to_string())??;
        }
        Ok((steps * threads) as u64)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn random_runs_on_two_threads_and_checks_its_objects() {
        assert_eq!(super::workload(2000, 2, 1), Ok(4000));
    }
}
