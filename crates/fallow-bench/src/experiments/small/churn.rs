//! churn: the shape of cfrac and espresso, one thread's mixed small sizes. A ring of `RING` live
//! objects (`objects::churn_size`: mostly 16-512 bytes, some up to 4 KiB); each step frees the
//! oldest (checking it) and allocates one in its place, which it writes (`objects::write`): one
//! `free` and one `malloc` per step, the objects freed in the order they were made.

use super::objects::{self, churn_size};
use crate::measure::XorShift;

/// The objects live at once.
pub const RING: usize = 512;

/// `steps` steps from the generator of `seed` after filling the ring, then every object checked
/// and freed; the steps done (one `malloc` and one `free` each).
pub fn workload(steps: usize, seed: u64) -> Result<u64, String> {
    let mut rng = XorShift::new(seed);
    let mut ring = [core::ptr::null_mut::<u8>(); RING];
    for (i, slot) in ring.iter_mut().enumerate() {
        *slot = objects::new(churn_size(&mut rng), (i % 251) as u8)?;
    }
    for k in 0..steps {
        let slot = &mut ring[k % RING];
        // SAFETY: every ring entry is a live object from `objects::new`, replaced just below and
        // never used again.
        let (_, value) = unsafe { objects::release(*slot) }?;
        if value != (k % 251) as u8 {
            return Err(format!("step {k}: the oldest object reads {value}, not {}", k % 251));
        }
        *slot = objects::new(churn_size(&mut rng), ((k + RING) % 251) as u8)?;
    }
    for p in ring {
        // SAFETY: as above: the ring's live objects, each freed once.
        unsafe { objects::release(p) }?;
    }
    Ok(steps as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_churn_runs_and_checks_its_objects() {
        assert_eq!(super::workload(5000, 1), Ok(5000));
    }
}
