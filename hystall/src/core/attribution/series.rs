//! Cumulative byte counts at the kernel's timestamps (from byte marks), bounded,
//! and what the attribution asks of them: the count as of a moment.

use std::collections::VecDeque;

use crate::core::time::Mono;

/// (time, cumulative bytes), oldest first; at most `cap` points.
#[derive(Clone, Debug, Default)]
pub struct ByteSeries {
    points: VecDeque<(Mono, u64)>,
    cap: usize,
    /// Points were dropped from the front (the cap, or `forget_before`):
    /// before the first point left, the count is no longer known.
    forgot: bool,
}

impl ByteSeries {
    pub fn new(cap: usize) -> ByteSeries {
        ByteSeries { points: VecDeque::new(), cap: cap.max(2), forgot: false }
    }

    /// Adds a point; a count that did not grow, or a time before the last
    /// point's, is merged into it (marks of two CPUs can arrive out of order).
    pub fn push(&mut self, at: Mono, cum: u64) {
        if let Some(last) = self.points.back_mut()
            && (at <= last.0 || cum <= last.1)
        {
            last.1 = last.1.max(cum);
            return;
        }
        if self.points.len() == self.cap {
            self.points.pop_front();
            self.forgot = true;
        }
        self.points.push_back((at, cum));
    }

    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    pub fn first(&self) -> Option<(Mono, u64)> {
        self.points.front().copied()
    }

    pub fn last(&self) -> Option<(Mono, u64)> {
        self.points.back().copied()
    }

    /// The `i`-th point, oldest first.
    pub fn point(&self, i: usize) -> Option<(Mono, u64)> {
        self.points.get(i).copied()
    }

    /// Drops the points before `t`.
    pub fn forget_before(&mut self, t: Mono) {
        while self.points.len() > 1 && self.points.front().is_some_and(|p| p.0 < t) {
            self.points.pop_front();
            self.forgot = true;
        }
    }

    /// The count as of `t` (the last point at or before it; the first point's
    /// count before the series starts).
    pub fn at(&self, t: Mono) -> u64 {
        let i = self.points.partition_point(|p| p.0 <= t);
        match i {
            0 => self.points.front().map_or(0, |p| p.1),
            i => self.points[i - 1].1,
        }
    }

    /// The least the count can have been at `t`: `at`, except before the
    /// first point left once earlier ones were dropped, where only the
    /// series' start (0) is certain. What a series carried *since* a moment
    /// must not be understated (the carried rule rules connections out by
    /// it): with the early points gone, the first one left says what was
    /// counted by then, not before.
    pub fn least_at(&self, t: Mono) -> u64 {
        match self.points.front() {
            Some(p) if self.forgot && t < p.0 => 0,
            _ => self.at(t),
        }
    }

    /// Bytes counted in (a, b].
    pub fn between(&self, a: Mono, b: Mono) -> u64 {
        self.at(b).saturating_sub(self.at(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Mono {
        Mono(v * 1_000_000)
    }

    #[test]
    fn counts_as_of_moments_and_between_them() {
        let mut s = ByteSeries::new(16);
        for (t, c) in [(10, 100), (20, 200), (30, 200), (45, 500)] {
            s.push(ms(t), c);
        }
        assert_eq!(s.len(), 3, "a point that did not grow is merged");
        assert_eq!(s.at(ms(5)), 100);
        assert_eq!(s.between(ms(10), ms(45)), 400);
        assert_eq!(s.between(ms(21), ms(44)), 0);
    }

    #[test]
    fn the_oldest_points_go_first() {
        let mut s = ByteSeries::new(3);
        for i in 1..=5u64 {
            s.push(ms(i), i * 10);
        }
        assert_eq!(s.first(), Some((ms(3), 30)));
        s.forget_before(ms(5));
        assert_eq!(s.first(), Some((ms(5), 50)));
    }

    #[test]
    fn before_forgotten_points_the_least_count_is_the_start() {
        let mut s = ByteSeries::new(16);
        for (t, c) in [(10, 0), (20, 100), (30, 200)] {
            s.push(ms(t), c);
        }
        assert_eq!(s.least_at(ms(5)), 0);
        assert_eq!(s.least_at(ms(25)), 100);
        // Once the points before 30 ms are gone, the count at 15 ms is
        // unknown: 200 (the first point left) would understate what was
        // carried since then.
        s.forget_before(ms(30));
        assert_eq!(s.at(ms(15)), 200);
        assert_eq!(s.least_at(ms(15)), 0);
        assert_eq!(s.least_at(ms(30)), 200);
    }
}
