//! The pressure experiment's arithmetic, apart from its processes so that it can be tested: the
//! default budget, and what a series of resident-set samples says (peak, mean, time over the
//! budget, a shorter series for the JSON record and the plot).

/// One sample: milliseconds since the start of a run, and the guests' summed resident bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub ms: f64,
    pub bytes: usize,
}

/// What a series of samples says.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summary {
    pub peak: usize,
    /// Mean over time (each sample weighs the time until the next one; a lone sample alone).
    pub mean: f64,
    /// Time during which the samples were above the budget (each sample above it counts until
    /// the next one).
    pub over_ms: f64,
}

/// The default budget for `guests` guests working W = `size` bytes in turns while each keeps
/// `keep`: the live data, W + (guests - 1) x keep, plus half of what one sleeping guest freed,
/// (W - keep) / 2. The live data fits with room to spare for the programs themselves; one
/// neighbour that keeps its freed memory resident does not.
pub fn default_budget(size: usize, keep: usize, guests: usize) -> usize {
    let live = size + guests.saturating_sub(1) * keep;
    (live + size.saturating_sub(keep) / 2).next_multiple_of(1 << 20)
}

pub fn summarize(points: &[Point], budget: usize) -> Summary {
    let mut s = Summary { peak: points.iter().map(|p| p.bytes).max().unwrap_or(0), ..Summary::default() };
    if points.len() < 2 {
        s.mean = points.first().map(|p| p.bytes as f64).unwrap_or(0.0);
        return s;
    }
    let mut weighted = 0.0;
    for w in points.windows(2) {
        let dt = (w[1].ms - w[0].ms).max(0.0);
        weighted += w[0].bytes as f64 * dt;
        if w[0].bytes > budget {
            s.over_ms += dt;
        }
    }
    let span = points[points.len() - 1].ms - points[0].ms;
    s.mean = if span > 0.0 { weighted / span } else { points[0].bytes as f64 };
    s
}

/// At most `n` points of `points`, each the highest of its stretch (so that no peak is lost), at
/// the time of that highest sample; `points` itself when it is short enough.
pub fn downsample(points: &[Point], n: usize) -> Vec<Point> {
    if points.len() <= n || n == 0 {
        return points.to_vec();
    }
    let per = points.len().div_ceil(n);
    points
        .chunks(per)
        .map(|c| *c.iter().max_by(|a, b| a.bytes.cmp(&b.bytes).then(b.ms.total_cmp(&a.ms))).unwrap())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn the_default_budget_fits_the_live_data_but_not_a_neighbours_freed_memory() {
        for (size, guests) in [(256 * MIB, 4), (64 * MIB, 4), (16 * MIB, 3), (8 * MIB, 2), (1024 * MIB, 8)] {
            let keep = size / 8;
            let b = default_budget(size, keep, guests);
            let live = size + (guests - 1) * keep;
            assert!(b > live, "{size} x {guests}: budget {b} below the live data {live}");
            // One sleeping guest that kept what it freed (size - keep more) does not fit.
            assert!(b < live + size - keep, "{size} x {guests}: budget {b} fits a neighbour's freed memory");
            assert_eq!(b % MIB, 0);
        }
        assert_eq!(default_budget(256 * MIB, 32 * MIB, 4), 464 * MIB);
    }

    #[test]
    fn a_summary_weighs_time_and_counts_time_over_budget() {
        let p = |ms: f64, mib: usize| Point { ms, bytes: mib * MIB };
        let pts = [p(0.0, 10), p(10.0, 30), p(40.0, 10), p(50.0, 10)];
        let s = summarize(&pts, 20 * MIB);
        assert_eq!(s.peak, 30 * MIB);
        // 10 MiB for 10 ms, 30 MiB for 30 ms, 10 MiB for 10 ms over 50 ms.
        assert!((s.mean - (10.0 * 10.0 + 30.0 * 30.0 + 10.0 * 10.0) / 50.0 * MIB as f64).abs() < 1.0);
        assert_eq!(s.over_ms, 30.0);
        assert_eq!(summarize(&pts, 30 * MIB).over_ms, 0.0);
        assert_eq!(summarize(&[p(5.0, 7)], MIB), Summary { peak: 7 * MIB, mean: (7 * MIB) as f64, over_ms: 0.0 });
        assert_eq!(summarize(&[], MIB), Summary::default());
    }

    #[test]
    fn downsampling_keeps_the_peaks() {
        let pts: Vec<Point> = (0..1000).map(|i| Point { ms: i as f64, bytes: if i == 537 { 99 } else { i % 7 } }).collect();
        let d = downsample(&pts, 100);
        assert!(d.len() <= 100 && d.len() >= 90, "{}", d.len());
        assert!(d.contains(&Point { ms: 537.0, bytes: 99 }));
        assert_eq!(d.iter().map(|p| p.bytes).max(), Some(99));
        assert!(d.windows(2).all(|w| w[0].ms < w[1].ms), "times stay in order");
        assert_eq!(downsample(&pts[..50], 100), pts[..50].to_vec());
    }
}
