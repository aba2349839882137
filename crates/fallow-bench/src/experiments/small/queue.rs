//! queue: the shape of xmalloc-test, a producer and a consumer. One thread allocates 64-byte
//! objects and writes them; another checks and frees them. They pass through a bounded queue of
//! `DEPTH` batches of `BATCH` pointers under a mutex, the producer waiting on a condition variable
//! while the queue is full and the consumer while it is empty (neither spins, so that the CPU time
//! is the allocator's and the objects', not a wait's). Every object is freed by the thread that did
//! not make it: the allocator's cross-thread free in its purest form, and a stream of memory from
//! one thread's heap to another's.

use std::sync::{Condvar, Mutex};

use super::objects::{self, QUEUE_SIZE};

/// Pointers per batch: one lock per batch on each side.
pub const BATCH: usize = 256;
/// Batches in flight at most.
pub const DEPTH: usize = 8;

/// The batches between the two threads (pointers as addresses, so the state is `Send`).
struct Ring {
    batches: [[usize; BATCH]; DEPTH],
    lens: [usize; DEPTH],
    head: usize,
    len: usize,
    /// The producer has sent its last batch (or failed).
    done: bool,
}

struct Channel {
    ring: Mutex<Ring>,
    not_full: Condvar,
    not_empty: Condvar,
}

impl Channel {
    fn send(&self, batch: &[usize]) {
        let mut r = self.ring.lock().unwrap();
        while r.len == DEPTH {
            r = self.not_full.wait(r).unwrap();
        }
        let at = (r.head + r.len) % DEPTH;
        r.batches[at][..batch.len()].copy_from_slice(batch);
        r.lens[at] = batch.len();
        r.len += 1;
        self.not_empty.notify_one();
    }

    fn finish(&self) {
        self.ring.lock().unwrap().done = true;
        self.not_empty.notify_one();
    }

    /// The next batch into `out`, its length; 0 once the producer is done and the queue empty.
    fn receive(&self, out: &mut [usize; BATCH]) -> usize {
        let mut r = self.ring.lock().unwrap();
        while r.len == 0 && !r.done {
            r = self.not_empty.wait(r).unwrap();
        }
        if r.len == 0 {
            return 0;
        }
        let (at, n) = (r.head, r.lens[r.head]);
        out[..n].copy_from_slice(&r.batches[at][..n]);
        r.head = (at + 1) % DEPTH;
        r.len -= 1;
        self.not_full.notify_one();
        n
    }
}

fn produce(ch: &Channel, objects: usize) -> Result<(), String> {
    let mut batch = [0usize; BATCH];
    let mut n = 0;
    for k in 0..objects {
        batch[n] = objects::new(QUEUE_SIZE, k as u8)? as usize;
        n += 1;
        if n == BATCH || k + 1 == objects {
            ch.send(&batch[..n]);
            n = 0;
        }
    }
    Ok(())
}

/// Free everything received, checking that the objects come in the order they were made; the
/// objects freed.
fn consume(ch: &Channel) -> Result<usize, String> {
    let mut batch = [0usize; BATCH];
    let mut seen = 0usize;
    let mut result = Ok(());
    loop {
        let n = ch.receive(&mut batch);
        if n == 0 {
            return result.map(|()| seen);
        }
        for &p in &batch[..n] {
            // SAFETY: the producer sends each object it made once, live and written, and no longer
            // touches it; this thread frees it once.
            let got = unsafe { objects::release(p as *mut u8) };
            if result.is_ok() {
                result = match got {
                    Ok((_, v)) if v == seen as u8 => Ok(()),
                    Ok((_, v)) => Err(format!("object {seen} came as {v}: out of order or handed out twice")),
                    Err(e) => Err(e),
                };
            }
            seen += 1;
        }
    }
}

/// `objects` objects from a producer thread to a consumer thread; the objects passed (one `malloc`
/// in one thread and one `free` in the other each).
pub fn workload(objects: usize) -> Result<u64, String> {
    let ch = Channel {
        ring: Mutex::new(Ring { batches: [[0; BATCH]; DEPTH], lens: [0; DEPTH], head: 0, len: 0, done: false }),
        not_full: Condvar::new(),
        not_empty: Condvar::new(),
    };
    std::thread::scope(|sc| {
        let consumer = sc.spawn(|| consume(&ch));
        let produced = produce(&ch, objects);
        ch.finish();
        let freed = consumer.join().map_err(|_| "the consumer panicked".to_string())??;
        produced?;
        if freed != objects {
            return Err(format!("{freed} objects freed of {objects}"));
        }
        Ok(objects as u64)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_object_goes_through_in_order() {
        assert_eq!(super::workload(10_000), Ok(10_000));
        assert_eq!(super::workload(1), Ok(1));
    }
}
