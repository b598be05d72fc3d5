//! Stalled targets a connection holds whatever the split (`solve.rs`
//! `Floor`): when clients start together, which stalled target is whose may
//! stay open while every assignment the evidence allows gives a connection
//! at least so many of them. That count is what starves it; the targets
//! themselves stay shared (listed with the connections they may be), never
//! its own.
//!
//! Kept once found: the evidence behind a floor does not go away, only our
//! memory of it (the byte series keep 30 s; a later search over less may
//! find less). A floor is worth less as its targets change: one that stops
//! being stalled (it moved, or closed) may have been one of this
//! connection's, and one later linked to this connection counts as its own
//! instead. One linked to another connection leaves the floor whole: every
//! assignment with it there still gives this connection as many of the rest.

use super::solve::Floor;
use super::{Link, Map};

/// A connection's share of stalled targets no evidence splits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shared {
    /// It holds at least this many of `targets`.
    pub at_least: usize,
    /// The stalled targets it may hold, none of them linked.
    pub targets: Vec<u64>,
    /// The other connections those targets may be.
    pub with: Vec<u64>,
}

#[derive(Default)]
pub struct Floors {
    by_conn: Map<u64, Floor>,
}

impl Floors {
    /// What is left of `f` now: `stalled` says which targets still are,
    /// `link` which connection a target is linked to.
    fn worth(f: &Floor, stalled: &dyn Fn(u64) -> bool, link: &dyn Fn(u64) -> Option<Link>) -> Shared {
        let mut lost = 0;
        let mut targets = Vec::new();
        for &t in &f.targets {
            match link(t) {
                Some(l) if l.conn == f.conn => lost += 1,
                Some(_) => {}
                None if !stalled(t) => lost += 1,
                None => targets.push(t),
            }
        }
        Shared { at_least: f.at_least.saturating_sub(lost).min(targets.len()), targets, with: f.with.clone() }
    }

    /// The floors a deduction found; an old one worth more stays.
    pub fn update(&mut self, found: Vec<Floor>, stalled: &dyn Fn(u64) -> bool, link: &dyn Fn(u64) -> Option<Link>) {
        for f in found {
            let keep_old =
                self.by_conn.get(&f.conn).is_some_and(|old| Self::worth(old, stalled, link).at_least > f.at_least);
            if !keep_old {
                self.by_conn.insert(f.conn, f);
            }
        }
    }

    /// Connection `conn`'s share now, when it holds one or more.
    pub fn of(&self, conn: u64, stalled: &dyn Fn(u64) -> bool, link: &dyn Fn(u64) -> Option<Link>) -> Option<Shared> {
        let f = self.by_conn.get(&conn)?;
        Some(Self::worth(f, stalled, link)).filter(|s| s.at_least > 0)
    }

    /// Drops the floors of connections `keep` says are gone, and those
    /// worth nothing any more.
    pub fn retain(
        &mut self,
        keep: impl Fn(u64) -> bool,
        stalled: &dyn Fn(u64) -> bool,
        link: &dyn Fn(u64) -> Option<Link>,
    ) {
        self.by_conn.retain(|c, f| keep(*c) && Self::worth(f, stalled, link).at_least > 0);
    }
}

#[cfg(test)]
mod tests {
    use super::super::Evidence;
    use super::*;
    use crate::core::time::Mono;

    fn linked(conn: u64) -> Option<Link> {
        Some(Link { conn, evidence: Evidence::default(), score: 1.0, since: Mono::ZERO })
    }

    #[test]
    fn a_floor_loses_what_may_have_been_its_and_keeps_what_went_elsewhere() {
        let mut fl = Floors::default();
        let f = Floor { conn: 1, at_least: 3, targets: vec![10, 11, 12, 13, 14, 15, 16, 17], with: vec![2] };
        let all = |_: u64| true;
        let none = |_: u64| None;
        fl.update(vec![f], &all, &none);
        let s = fl.of(1, &all, &none).unwrap();
        assert_eq!((s.at_least, s.targets.len(), s.with.clone()), (3, 8, vec![2]));
        // 10 linked to the other connection: still 3 of the 7 left.
        let other = |t: u64| if t == 10 { linked(2) } else { None };
        assert_eq!(fl.of(1, &all, &other).unwrap().at_least, 3);
        // 11 linked to it: one of the three is now its own.
        let own = |t: u64| if t == 11 { linked(1) } else { None };
        assert_eq!(fl.of(1, &all, &own).unwrap().at_least, 2);
        // Two that moved again may have been two of its three.
        let moving = |t: u64| t != 12 && t != 13;
        assert_eq!(fl.of(1, &moving, &none).unwrap().at_least, 1);
        // A later, weaker deduction (less history) does not lower it.
        fl.update(vec![Floor { conn: 1, at_least: 1, targets: vec![10, 11], with: vec![2] }], &all, &none);
        assert_eq!(fl.of(1, &all, &none).unwrap().at_least, 3);
        // Gone when nothing is left of it.
        let still = |t: u64| t == 17;
        fl.retain(|_| true, &still, &none);
        assert!(fl.of(1, &all, &none).is_none());
    }
}
