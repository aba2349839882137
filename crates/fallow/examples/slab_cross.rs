//! Memory the slab holds under rptest's shape, made repeatable: two threads each keep up to
//! `LIVE` objects of 8-16000 bytes (sizes falling off linearly, as rptest's `linear`), replace
//! some at each step, and every other step hand a batch of new objects to the other thread,
//! which frees them at its next step (remote frees). The threads meet at a barrier after each
//! step, so the amounts are the same in every run (only the order of the frees within a step
//! varies). Prints the most span bytes the slab held and the process's peak resident memory
//! (`VmHWM`: reporting off, so every page touched once counts), and the program's own peak
//! live bytes (requested sizes), both read after each step.
//!
//! ```text
//! cargo run --release -p fallow --example slab_cross [STEPS]
//! ```

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Barrier, Mutex};

/// The program's own live bytes (requested sizes).
static LIVE_BYTES: AtomicU64 = AtomicU64::new(0);

use fallow::{Allocator, Config, Flags, Tunables};

/// Objects (address, size) one thread made for the other to free.
type Inbox = Mutex<Vec<(usize, usize)>>;

const LIVE: usize = 1000;
const MIN: usize = 8;
const MAX: usize = 16000;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// A size in MIN..=MAX whose density falls off linearly to MAX.
    fn size(&mut self) -> usize {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        MAX - ((MAX - MIN) as f64 * u.sqrt()) as usize
    }
}

fn vm_hwm_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let l = s.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    l.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn main() {
    let steps: usize = std::env::args().nth(1).map_or(2000, |s| s.parse().unwrap());
    let a = Allocator::new(Config { small_objects: true, tunables: Tunables::off(), ..Config::default() }).unwrap();
    let barrier = Arc::new(Barrier::new(2));
    // Each thread's inbox of objects the other made for it to free.
    let inbox: Arc<[Inbox; 2]> = Arc::new([Mutex::new(Vec::new()), Mutex::new(Vec::new())]);
    let peak = Arc::new(Mutex::new((0u64, 0u64)));
    let threads: Vec<_> = (0..2usize)
        .map(|t| {
            let (a, barrier, inbox, peak) = (a.clone(), barrier.clone(), inbox.clone(), peak.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((t as u64 + 1) * 0x1234_5678_9abc));
                let mut live = vec![(0usize, 0usize); LIVE];
                let new = |rng: &mut Rng| {
                    let size = rng.size();
                    let p = a.malloc(size, 16, Flags::NONE).unwrap().as_ptr();
                    // SAFETY: a live object of `size` bytes: its first byte, one a page and its last.
                    unsafe {
                        for off in (0..size).step_by(4096) {
                            *p.add(off) = 1;
                        }
                        *p.add(size - 1) = 1;
                    }
                    LIVE_BYTES.fetch_add(size as u64, Relaxed);
                    (p as usize, size)
                };
                let free = |(p, size): (usize, usize)| {
                    LIVE_BYTES.fetch_sub(size as u64, Relaxed);
                    a.free_any(p as *mut u8).unwrap();
                };
                let (mut free_at, mut alloc_at) = (0usize, 0usize);
                for step in 0..steps {
                    let ops = 20 + (rng.next() % 180) as usize;
                    for _ in 0..ops {
                        let slot = &mut live[free_at];
                        if slot.0 != 0 {
                            free(*slot);
                            *slot = (0, 0);
                        }
                        free_at = (free_at + 7) % LIVE;
                    }
                    for o in std::mem::take(&mut *inbox[t].lock().unwrap()) {
                        free(o);
                    }
                    for _ in 0..ops {
                        let slot = &mut live[alloc_at];
                        if slot.0 != 0 {
                            free(*slot);
                        }
                        *slot = new(&mut rng);
                        alloc_at = (alloc_at + 13) % LIVE;
                    }
                    if step % 2 == 0 {
                        let batch: Vec<_> = (0..ops).map(|_| new(&mut rng)).collect();
                        inbox[1 - t].lock().unwrap().extend(batch);
                    }
                    barrier.wait();
                    if t == 0 {
                        let s = a.stats();
                        let mut pk = peak.lock().unwrap();
                        pk.0 = pk.0.max(s.small_span_bytes);
                        pk.1 = pk.1.max(LIVE_BYTES.load(Relaxed));
                    }
                    barrier.wait();
                }
                for o in live.into_iter().filter(|o| o.0 != 0) {
                    free(o);
                }
                barrier.wait();
                for o in std::mem::take(&mut *inbox[t].lock().unwrap()) {
                    free(o);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let (spans, live) = *peak.lock().unwrap();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!("peak span bytes {:.1} MiB, peak live bytes {:.1} MiB (requested), VmHWM {:.1} MiB", mib(spans), mib(live), vm_hwm_kib() as f64 / 1024.0);
}
