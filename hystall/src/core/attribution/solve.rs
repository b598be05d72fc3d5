//! Which connection fed each open target, deduced from the byte rules
//! (`fit.rs`) over all of a server's targets at once: a target whose every
//! possible connection but one breaks a rule is that one's; what is left is
//! searched (bounded), and a target that takes the same connection in every
//! assignment obeying the rules is tied to it. Anything else stays open.
//!
//! Cost: the rules are checked per connection against its own targets only;
//! the search runs on small groups of targets that share candidates (others
//! are left open, never guessed). A group whose search ran out of its budget
//! is not searched again for a while (the caller says which): at node scale,
//! marks make every tick a deduction, and one such group searched each tick
//! took half a core.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::fit::{carried, took_between, unexplained};
use super::{ConnSeries, Map, Target};
use crate::core::time::Mono;

/// Largest group of open targets searched.
const MAX_GROUP: usize = 16;

/// The problem: connections, targets, the links made so far, and the open
/// targets with the connections they may belong to.
pub struct Problem<'a> {
    pub conns: &'a Map<u64, ConnSeries>,
    pub targets: &'a Map<u64, Target>,
    pub linked: Map<u64, BTreeSet<u64>>,
    pub open: BTreeMap<u64, Vec<u64>>,
    pub now: Mono,
    pub windows: super::fit::Windows,
    /// Groups not to search (their last search ran out of budget, when).
    pub skip: &'a Map<Vec<u64>, Mono>,
    /// Nodes one group's search may visit.
    pub budget: usize,
}

/// What the deduction found: (target, connection, by the search).
pub type Deduced = Vec<(u64, u64, bool)>;

/// The deduction's ties, and the groups whose search ran out of budget.
#[derive(Debug, Default)]
pub struct Solved {
    pub deduced: Deduced,
    pub aborted: Vec<Vec<u64>>,
    /// Groups searched.
    pub searched: u64,
}

impl Problem<'_> {
    fn set_of(&self, conn: u64, extra: &[u64]) -> Vec<&Target> {
        self.linked.get(&conn).into_iter().flatten().chain(extra).filter_map(|c| self.targets.get(c)).collect()
    }

    /// Whether `conn` can carry its linked targets plus `extra`.
    fn carries(&self, conn: u64, extra: &[u64]) -> bool {
        let set = self.set_of(conn, extra);
        match self.conns.get(&conn) {
            Some(c) => carried(c, &set),
            // No byte marks of it: it carried less than a mark, so only
            // targets that took less than one can be its.
            None => set.iter().all(|t| t.marks() <= 1),
        }
    }

    /// Ties what the rules force.
    pub fn solve(mut self) -> Solved {
        let mut out = Vec::new();
        let mut aborted = Vec::new();
        let mut searched = 0;
        // 1. Each open target against each of its candidates, given what is
        //    tied already: drop those that cannot have carried it; one left →
        //    tied, and it loads that connection for the next ones.
        loop {
            let mut changed = false;
            let keys: Vec<u64> = self.open.keys().copied().collect();
            for t in keys {
                let cands: Vec<u64> = self.open[&t].iter().copied().filter(|c| self.carries(*c, &[t])).collect();
                match cands.as_slice() {
                    [] => {
                        self.open.remove(&t);
                    }
                    [c] => {
                        let c = *c;
                        self.open.remove(&t);
                        self.linked.entry(c).or_default().insert(t);
                        out.push((t, c, false));
                        changed = true;
                    }
                    // Fewer than before (the filter only drops): kept.
                    _ if cands.len() < self.open[&t].len() => {
                        self.open.insert(t, cands);
                    }
                    _ => {}
                }
            }
            if !changed {
                break;
            }
        }
        // 2. Groups of open targets that share candidates, searched.
        for group in groups(&self.open) {
            if group.len() <= MAX_GROUP && !self.skip.contains_key(&group) {
                searched += 1;
                match self.search(&group) {
                    Some(ties) => out.extend(ties.into_iter().map(|(t, c)| (t, c, true))),
                    None => aborted.push(group),
                }
            }
        }
        Solved { deduced: out, aborted, searched }
    }

    /// Every assignment of `group` that obeys both rules; a target that takes
    /// the same connection in all of them (and there is one at least) is tied.
    /// None: the search ran out of its node budget.
    fn search(&self, group: &[u64]) -> Option<Vec<(u64, u64)>> {
        let cands: Vec<&Vec<u64>> = group.iter().map(|t| &self.open[t]).collect();
        let members: Vec<Option<&Target>> = group.iter().map(|t| self.targets.get(t)).collect();
        // The connections the explained rule prunes by, with what their
        // linked targets and every group target that may be theirs took.
        // A connection that not even all of those explain (its bytes went
        // elsewhere: UDP relayed in full-size datagrams, streams to targets
        // we never saw) says nothing here; nor does one seen only in part.
        let mut slots = Vec::new();
        let mut slot_of = HashMap::new();
        for c in cands.iter().flat_map(|v| v.iter().copied()).collect::<BTreeSet<u64>>() {
            let Some(series) = self.conns.get(&c) else { continue };
            let Some(from) = series.known_from else { continue };
            let mine = members.iter().zip(&cands).filter(|(_, v)| v.contains(&c)).filter_map(|(t, _)| *t);
            let set: Vec<&Target> = self.set_of(c, &[]).into_iter().chain(mine).collect();
            let into = set.iter().map(|t| took_between(t, from, self.now)).sum();
            let slot = Slot { series, from, into, n: set.len() };
            if self.explains(&slot) {
                slot_of.insert(c, slots.len());
                slots.push(slot);
            }
        }
        // Each target's share of each candidate's slot (its first listing).
        let shares = members
            .iter()
            .zip(&cands)
            .map(|(t, v)| {
                v.iter()
                    .enumerate()
                    .map(|(k, c)| {
                        let t = (*t)?;
                        let s = *slot_of.get(c).filter(|_| !v[..k].contains(c))?;
                        Some((s, took_between(t, slots[s].from, self.now)))
                    })
                    .collect()
            })
            .collect();
        let mut s = Search {
            p: self,
            group,
            cands: &cands,
            slots,
            shares,
            pick: vec![0; group.len()],
            fixed: None,
            found: false,
            extra: Vec::with_capacity(group.len()),
            nodes: 0,
            out_of_budget: false,
        };
        // Witnesses: for each target and each connection it was not yet seen
        // on, one assignment obeying the rules that puts it there (each found
        // shows every target's connection in it). A target left with one
        // connection is tied. Where the rules barely bind, this is a few
        // short descents; enumerating every assignment was exponential.
        let mut seen: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); group.len()];
        for i in 0..group.len() {
            for &c in cands[i].iter() {
                if seen[i].len() > 1 || seen[i].contains(&c) {
                    continue;
                }
                s.fixed = Some((i, c));
                s.found = false;
                s.dfs(0);
                if s.out_of_budget {
                    tracing::debug!(?group, "attribution: search out of budget");
                    return None;
                }
                if s.found {
                    for (j, v) in seen.iter_mut().enumerate() {
                        v.insert(cands[j][s.pick[j]]);
                    }
                }
            }
            if seen[i].is_empty() {
                // No assignment obeys the rules: nothing can be said.
                tracing::debug!(?group, "attribution: no assignment obeys the rules");
                return Some(Vec::new());
            }
        }
        Some(
            group
                .iter()
                .zip(&seen)
                .filter(|(_, v)| v.len() == 1)
                .map(|(t, v)| (*t, *v.first().expect("one")))
                .collect(),
        )
    }

    /// The explained rule for a slot as it stands.
    fn explains(&self, s: &Slot) -> bool {
        unexplained(s.series, s.n, s.into, s.from, self.now, self.windows) == 0
    }
}

/// A connection the search prunes by: its linked targets and the group's
/// targets that may still be its, as the bytes they took since `from` and
/// how many they are (all the explained rule needs of them).
struct Slot<'a> {
    series: &'a ConnSeries,
    from: Mono,
    into: u64,
    n: usize,
}

struct Search<'a, 'p> {
    p: &'a Problem<'p>,
    group: &'a [u64],
    cands: &'a [&'a Vec<u64>],
    slots: Vec<Slot<'p>>,
    /// Per target, per candidate: its slot and what the target took of it
    /// (None: a connection the rule does not prune by, a repeated listing,
    /// or a target no longer known, which `set_of` leaves out too).
    shares: Vec<Vec<Option<(usize, u64)>>>,
    /// The candidate index chosen for each target so far (at a witness:
    /// the whole assignment).
    pick: Vec<usize>,
    /// The target and connection the witness being looked for must have.
    fixed: Option<(usize, u64)>,
    /// A witness was found (the search unwinds).
    found: bool,
    /// Reused: the targets a connection takes with the one being placed.
    extra: Vec<u64>,
    /// Nodes visited by all of this group's descents.
    nodes: usize,
    out_of_budget: bool,
}

impl Search<'_, '_> {
    /// Target `i` placed on its candidate `k`: it leaves (`gone`) or comes
    /// back to the slots of its other candidates.
    fn place(&mut self, i: usize, k: usize, gone: bool) {
        let conn = self.cands[i][k];
        for (k2, share) in self.shares[i].iter().enumerate() {
            let Some((s, took)) = *share else { continue };
            if self.cands[i][k2] == conn {
                continue;
            }
            let slot = &mut self.slots[s];
            if gone {
                slot.into -= took;
                slot.n -= 1;
            } else {
                slot.into += took;
                slot.n += 1;
            }
        }
    }

    /// Looks for a witness below a node at depth `i`.
    fn dfs(&mut self, i: usize) {
        self.nodes += 1;
        if self.nodes > self.p.budget {
            self.out_of_budget = true;
            return;
        }
        // Prune: a connection whose bytes stay unexplained even if every
        // target still open that may be its were given to it. Only the
        // slots the last target left changed since the node above (whose
        // slots all passed; at the root they all pass by construction).
        if let Some(prev) = i.checked_sub(1) {
            let conn = self.cands[prev][self.pick[prev]];
            let left = self.shares[prev].iter().enumerate().filter(|(k, _)| self.cands[prev][*k] != conn);
            if left.filter_map(|(_, s)| *s).any(|(s, _)| !self.p.explains(&self.slots[s])) {
                return;
            }
        }
        if i == self.group.len() {
            self.found = true;
            return;
        }
        for k in 0..self.cands[i].len() {
            let c = self.cands[i][k];
            if self.fixed.is_some_and(|(fi, fc)| fi == i && fc != c) {
                continue;
            }
            self.pick[i] = k;
            self.extra.clear();
            self.extra.extend((0..i).filter(|&j| self.cands[j][self.pick[j]] == c).map(|j| self.group[j]));
            self.extra.push(self.group[i]);
            if self.p.carries(c, &self.extra) {
                self.place(i, k, true);
                self.dfs(i + 1);
                self.place(i, k, false);
            }
            if self.found || self.out_of_budget {
                return;
            }
        }
    }
}

/// Open targets grouped by shared candidates (connected components).
fn groups(open: &BTreeMap<u64, Vec<u64>>) -> Vec<Vec<u64>> {
    let mut by_conn: HashMap<u64, Vec<u64>> = HashMap::new();
    for (t, cands) in open {
        for c in cands {
            by_conn.entry(*c).or_default().push(*t);
        }
    }
    let mut done: BTreeSet<u64> = BTreeSet::new();
    let mut out = Vec::new();
    for &t in open.keys() {
        if done.contains(&t) {
            continue;
        }
        let mut group = Vec::new();
        let mut stack = vec![t];
        done.insert(t);
        while let Some(x) = stack.pop() {
            group.push(x);
            for c in &open[&x] {
                for y in &by_conn[c] {
                    if done.insert(*y) {
                        stack.push(*y);
                    }
                }
            }
        }
        group.sort_unstable();
        out.push(group);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::fit::Windows;
    use super::*;

    /// A small deterministic generator (xorshift), so a failure names its seed.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    const MS: u64 = 1_000_000;

    /// What a `Problem` borrows or takes: connections, targets, open targets, links.
    type Parts = (Map<u64, ConnSeries>, Map<u64, Target>, BTreeMap<u64, Vec<u64>>, Map<u64, BTreeSet<u64>>);

    /// A random server: connections whose bytes came in steps, targets that
    /// took theirs later, each open target with two to four candidates.
    fn problem_parts(rng: &mut Rng) -> Parts {
        let mut conns = Map::default();
        let n_conns = 2 + rng.below(4);
        for c in 0..n_conns {
            let mut s = ConnSeries::new();
            let mut total = 0;
            for step in 0..1 + rng.below(6) {
                total += rng.below(8) * MARK_BYTES_FOR_TEST;
                s.series.push(Mono((step * 100 + rng.below(90)) * MS), total);
            }
            s.known_from = (rng.below(4) > 0).then_some(Mono(0));
            s.datagrams = rng.below(2) * rng.below(4) * MARK_BYTES_FOR_TEST;
            conns.insert(c, s);
        }
        let mut targets = Map::default();
        let mut open = BTreeMap::new();
        let n_targets = 2 + rng.below(6);
        for t in 100..100 + n_targets {
            let mut target = Target::new(1, Mono(rng.below(300) * MS));
            target.start = target.born;
            let mut took = 0;
            for step in 0..rng.below(5) {
                took += rng.below(6) * MARK_BYTES_FOR_TEST;
                target.series.push(Mono(target.start.0 + (step + 1) * 50 * MS), took);
            }
            targets.insert(t, target);
            let mut cands: Vec<u64> = (0..n_conns).filter(|_| rng.below(2) == 0).collect();
            while cands.len() < 2 {
                cands.push(rng.below(n_conns));
                cands.dedup();
            }
            open.insert(t, cands);
        }
        // Now and then a target already linked, which loads its connection.
        let mut linked: Map<u64, BTreeSet<u64>> = Map::default();
        if rng.below(3) == 0 {
            let mut target = Target::new(1, Mono(10 * MS));
            target.series.push(Mono(400 * MS), rng.below(8) * MARK_BYTES_FOR_TEST);
            targets.insert(99, target);
            linked.entry(rng.below(n_conns)).or_default().insert(99);
        }
        (conns, targets, open, linked)
    }

    const MARK_BYTES_FOR_TEST: u64 = 4 * hystall_common::MARK_BYTES;

    /// What every assignment obeying both rules forces, found by trying
    /// them all: the carried rule as the search applies it (each target
    /// with those placed before it on its connection), the explained rule on
    /// each connection that all its possible targets explain.
    fn by_enumeration(p: &Problem, group: &[u64]) -> Vec<(u64, u64)> {
        let cands: Vec<&Vec<u64>> = group.iter().map(|t| &p.open[t]).collect();
        let explains = |c: u64, set: &[u64]| {
            let Some(series) = p.conns.get(&c) else { return true };
            let Some(from) = series.known_from else { return true };
            let all = p.set_of(c, set);
            let into = all.iter().map(|t| took_between(t, from, p.now)).sum();
            unexplained(series, all.len(), into, from, p.now, p.windows) == 0
        };
        let pruning: Vec<u64> = cands
            .iter()
            .flat_map(|v| v.iter().copied())
            .collect::<BTreeSet<u64>>()
            .into_iter()
            .filter(|&c| {
                let all: Vec<u64> = group.iter().zip(&cands).filter(|(_, v)| v.contains(&c)).map(|(t, _)| *t).collect();
                explains(c, &all)
            })
            .collect();
        let mut seen: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); group.len()];
        let total: usize = cands.iter().map(|v| v.len()).product();
        for mut code in 0..total {
            let pick: Vec<u64> = cands
                .iter()
                .map(|v| {
                    let c = v[code % v.len()];
                    code /= v.len();
                    c
                })
                .collect();
            let on =
                |c: u64, upto: usize| -> Vec<u64> { (0..upto).filter(|&j| pick[j] == c).map(|j| group[j]).collect() };
            let carried = (0..group.len()).all(|i| p.carries(pick[i], &on(pick[i], i + 1)));
            let explained = pruning.iter().all(|&c| explains(c, &on(c, group.len())));
            if carried && explained {
                for (s, c) in seen.iter_mut().zip(&pick) {
                    s.insert(*c);
                }
            }
        }
        group.iter().zip(&seen).filter(|(_, s)| s.len() == 1).map(|(t, s)| (*t, *s.first().expect("one"))).collect()
    }

    #[test]
    fn the_search_forces_what_trying_every_assignment_forces() {
        let skip = Map::default();
        let mut forced = 0;
        for seed in 1..=3000u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let (conns, targets, open, linked) = problem_parts(&mut rng);
            let group: Vec<u64> = open.keys().copied().collect();
            let p = Problem {
                conns: &conns,
                targets: &targets,
                linked,
                open,
                now: Mono(600 * MS),
                windows: Windows { stream: 3 * MARK_BYTES_FOR_TEST, conn: 5 * MARK_BYTES_FOR_TEST },
                skip: &skip,
                budget: usize::MAX,
            };
            let want = by_enumeration(&p, &group);
            forced += want.len();
            assert_eq!(p.search(&group), Some(want), "seed {seed}");
        }
        assert!(forced > 100, "the cases force something often enough to test ({forced})");
    }
}
