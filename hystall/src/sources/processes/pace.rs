//! Pacing of the periodic reads whose cost grows with the node (sock_diag
//! dumps, fd walks): each runs at most every `min` and takes at most a fixed
//! share of the time, so a node with tens of thousands of sockets is read
//! less often instead of costing a core.

use std::time::{Duration, Instant};

/// A read takes at most 1/this of the time.
const TIME_SHARE: u32 = 50;

#[derive(Clone, Copy, Debug)]
pub struct Pace {
    min: Duration,
    last: Option<Instant>,
    /// How long the last run took.
    cost: Duration,
}

impl Pace {
    pub const fn every(min: Duration) -> Pace {
        Pace { min, last: None, cost: Duration::ZERO }
    }

    /// The gap before the next run may start.
    pub fn gap(&self) -> Duration {
        if self.min.is_zero() { Duration::ZERO } else { self.min.max(self.cost * TIME_SHARE) }
    }

    /// Whether a run is due now.
    pub fn due(&self) -> bool {
        self.last.is_none_or(|t| t.elapsed() >= self.gap())
    }

    /// Whether a run is due now at a period of `min` instead (still paced
    /// by its cost).
    pub fn due_every(&self, min: Duration) -> bool {
        self.last.is_none_or(|t| t.elapsed() >= min.max(self.cost * TIME_SHARE))
    }

    /// Runs `f` and times it.
    pub fn run<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        self.last = Some(start);
        self.cost = start.elapsed();
        out
    }

    /// How long since the last run started (None before the first).
    pub fn since_last(&self) -> Option<Duration> {
        self.last.map(|t| t.elapsed())
    }

    pub fn min(&self) -> Duration {
        self.min
    }

    pub fn cost(&self) -> Duration {
        self.cost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_costly_run_waits_fifty_times_its_cost() {
        let mut p = Pace::every(Duration::from_millis(1));
        assert!(p.due());
        p.run(|| std::thread::sleep(Duration::from_millis(20)));
        assert!(p.gap() >= Duration::from_millis(1000), "{:?}", p.gap());
        assert!(!p.due());
        let mut cheap = Pace::every(Duration::from_millis(5));
        cheap.run(|| ());
        assert_eq!(cheap.gap(), Duration::from_millis(5));
        std::thread::sleep(Duration::from_millis(6));
        assert!(cheap.due());
        assert_eq!(Pace::every(Duration::ZERO).gap(), Duration::ZERO);
    }
}
