//! Which connections changed lately, by the tick that changed them, with
//! what a connect asks of each as of that tick.
//!
//! "The open connections with a client packet since t" is what each target
//! connect is matched against (`attribution::connect`). Read from the whole
//! table, it visited every connection, twice a second: tens of thousands at
//! node scale (connections stay until `--quic-idle` after their last packet),
//! nearly all of them quiet. A connection's sums change only at a tick that
//! read a new packet of it, and that tick comes at or after the packet; so
//! the connections changed at ticks since t hold every one with a packet
//! since t, and a few seconds of such records answer the question.
//!
//! Each record is a [`Digest`] taken at that tick, while the tick has the
//! connection in hand: its newest record is its state now (a connection
//! changes only at a tick that records it), so answering reads no
//! connection (each a cache miss at node scale, hundreds per poll).

use std::collections::VecDeque;
use std::time::Duration;

use super::time::Mono;

/// Records are kept this long; asked about earlier, the caller reads the
/// whole table.
pub const KEEP: Duration = Duration::from_secs(5);

/// What a target's connect asks of a connection, as of the tick that
/// changed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Digest {
    pub id: u64,
    /// Its last client packet.
    pub last: Option<Mono>,
    /// Its first client packet, as the kernel stamped it (the connection
    /// itself may be set up from a later poll or sample).
    pub began: Mono,
    /// The server port of its paths when they all have one (nearly every
    /// connection: one path), else 0: its owner is then read from the
    /// connection.
    pub port: u16,
}

#[derive(Debug, Default)]
pub struct Activity {
    /// (tick, digest) in tick order.
    records: VecDeque<(Mono, Digest)>,
    /// Every change at or after this instant is in `records` (ZERO: all
    /// of them, since the table began empty).
    complete_from: Mono,
}

impl Activity {
    /// The connections `changed` changed at the tick `at` (ticks in order).
    pub fn record(&mut self, at: Mono, changed: impl IntoIterator<Item = Digest>) {
        if self.records.back().is_some_and(|(t, _)| at < *t) {
            // A clock that went back (never live; a replay could): the
            // records start again from here.
            self.records.clear();
            self.complete_from = at;
        }
        self.records.extend(changed.into_iter().map(|d| (at, d)));
        let cut = Mono(at.0.saturating_sub(KEEP.as_nanos() as u64));
        while self.records.front().is_some_and(|(t, _)| *t < cut) {
            self.records.pop_front();
        }
        self.complete_from = self.complete_from.max(cut);
    }

    /// The digests of the ticks at or after `from` (with repeats, oldest
    /// first), or None when the records do not reach back that far.
    pub fn since(&self, from: Mono) -> Option<impl DoubleEndedIterator<Item = &Digest> + '_> {
        if from < self.complete_from {
            return None;
        }
        let first = self.records.partition_point(|(t, _)| *t < from);
        Some(self.records.range(first..).map(|(_, d)| d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: f64) -> Mono {
        Mono((secs * 1e9) as u64)
    }

    #[test]
    fn changes_since_an_instant_come_from_the_records_while_they_reach_back() {
        let mut a = Activity::default();
        let d = |id| Digest { id, last: None, began: Mono::ZERO, port: 0 };
        a.record(s(1.0), [d(1), d(2)]);
        a.record(s(1.2), [d(2), d(3)]);
        a.record(s(1.4), []);
        fn ids(a: &Activity, from: Mono) -> Option<Vec<u64>> {
            a.since(from).map(|it| it.map(|d| d.id).collect())
        }
        assert_eq!(ids(&a, s(0.0)), Some(vec![1, 2, 2, 3]), "the table began empty: complete from the start");
        assert_eq!(ids(&a, s(1.1)), Some(vec![2, 3]));
        assert_eq!(ids(&a, s(1.3)), Some(vec![]));
        // Five seconds on, the first records are gone: earlier instants are
        // not answered (the caller reads the whole table).
        a.record(s(6.1), [d(4)]);
        assert_eq!(ids(&a, s(1.0)), None);
        assert_eq!(ids(&a, s(1.1)), Some(vec![2, 3, 4]));
        assert_eq!(ids(&a, s(6.0)), Some(vec![4]));
        // Time going back starts the records again.
        a.record(s(3.0), [d(5)]);
        assert_eq!(ids(&a, s(2.0)), None);
        assert_eq!(ids(&a, s(3.0)), Some(vec![5]));
    }
}
