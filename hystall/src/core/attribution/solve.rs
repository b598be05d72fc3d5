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

use super::fit::{carried, moments, took_between, unexplained};
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
    /// Targets whose count per connection matters (stalled ones): for
    /// each, the least of them a connection holds in every assignment
    /// (`Floor`).
    pub counted: &'a std::collections::HashSet<u64>,
    /// Groups whose floors were found lately (the counted targets the
    /// same): not searched for them again yet (`floors.rs` keeps them).
    pub floored: &'a Map<Vec<u64>, Mono>,
    /// Connections that cannot hold more than so many counted targets:
    /// a request of theirs reached the server after their stream data
    /// stopped, so they were not starved (`caps` in `mod.rs`).
    pub caps: &'a Map<u64, usize>,
}

/// What every assignment obeying the rules gives one connection, when which
/// target is whose stays open: at least `at_least` of `targets` (counted
/// targets of a group, none tied), which it shares with `with`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Floor {
    pub conn: u64,
    pub at_least: usize,
    pub targets: Vec<u64>,
    pub with: Vec<u64>,
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
    /// Connections that hold counted targets whatever the split.
    pub floors: Vec<Floor>,
    /// Groups whose floors were looked for.
    pub floored: Vec<Vec<u64>>,
}

impl<'a> Problem<'a> {
    fn set_of(&self, conn: u64, extra: &[u64]) -> Vec<&Target> {
        self.linked.get(&conn).into_iter().flatten().chain(extra).filter_map(|c| self.targets.get(c)).collect()
    }

    /// Whether `conn` can carry its linked targets plus `extra`, and hold
    /// the counted ones among them (its cap).
    fn carries(&self, conn: u64, extra: &[u64]) -> bool {
        if let Some(&cap) = self.caps.get(&conn) {
            let held = self.linked.get(&conn).into_iter().flatten().chain(extra).filter(|t| self.counted.contains(t));
            if held.count() > cap {
                return false;
            }
        }
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
        let mut floors = Vec::new();
        let mut floored = Vec::new();
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
                        if tracing::enabled!(tracing::Level::DEBUG) {
                            for &d in self.open[&t].iter().filter(|d| **d != c) {
                                let set = self.set_of(d, &[t]);
                                let why = self.conns.get(&d).and_then(|cs| super::fit::carried_fails(cs, &set));
                                tracing::debug!(t, c, dropped = d, linked = ?self.linked.get(&d), ?why, "attribution: step 1 drops");
                            }
                        }
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
            if group.len() > MAX_GROUP && !self.floored.contains_key(&group) {
                // Too large to search: each connection against the rest taken
                // as one bin without rules of its own (a looser bound).
                let found = self.loose_floors(&group);
                floored.push(group.clone());
                tracing::debug!(len = group.len(), ?found, "attribution: group too large to search; loose floors");
                floors.extend(found);
            }
            if group.len() <= MAX_GROUP && !self.skip.contains_key(&group) {
                searched += 1;
                // No assignment obeys both rules: a connection carried more
                // than the explained rule allows (resent bytes beyond its
                // share), so that rule is wrong for this group; the carried
                // rule alone still holds.
                let mut explain = true;
                let mut found = self.search(&group, explain);
                if found.as_ref().is_some_and(|f| f.is_none()) {
                    explain = false;
                    tracing::debug!(?group, "attribution: searched again without the explained rule");
                    found = self.search(&group, explain);
                }
                match found.map(Option::unwrap_or_default) {
                    Some(ties) if !self.floored.contains_key(&group) => {
                        let found = self.floors(&group, &ties, explain);
                        tracing::debug!(?group, ?found, "attribution: floors");
                        floors.extend(found);
                        floored.push(group.clone());
                        out.extend(ties.into_iter().map(|(t, c)| (t, c, true)));
                    }
                    Some(ties) => {
                        out.extend(ties.into_iter().map(|(t, c)| (t, c, true)));
                    }
                    None => aborted.push(group),
                }
            }
        }
        Solved { deduced: out, aborted, searched, floors, floored }
    }

    /// Every assignment of `group` that obeys both rules (the carried rule
    /// alone unless `explain`); a target that takes the same connection in
    /// all of them (and there is one at least) is tied. None: the search ran
    /// out of its node budget; Some(None): no assignment obeys the rules.
    fn search(&self, group: &[u64], explain: bool) -> Option<Option<Vec<(u64, u64)>>> {
        let cands: Vec<&Vec<u64>> = group.iter().map(|t| &self.open[t]).collect();
        let mut s = self.searcher(group, &cands, explain, false);
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
                for slot in &s.slots {
                    let carried = slot.series.series.at(self.now).saturating_sub(slot.series.series.at(slot.from));
                    tracing::debug!(
                        carried,
                        into = slot.into,
                        n = slot.n,
                        unexplained = unexplained(slot.series, slot.n, slot.into, slot.from, self.now, self.windows),
                        datagrams = slot.series.datagrams,
                        "attribution: a slot of that group, all its possible targets given to it"
                    );
                }
                return Some(None);
            }
        }
        Some(Some(
            group
                .iter()
                .zip(&seen)
                .filter(|(_, v)| v.len() == 1)
                .map(|(t, v)| (*t, *v.first().expect("one")))
                .collect(),
        ))
    }

    /// For each connection of `group` that may hold counted targets not
    /// in `tied`: the least of them it holds over every assignment obeying
    /// the rules (a bounded branch and bound per connection; one that runs
    /// out of budget says nothing). Only floors of one or more are kept.
    fn floors(&self, group: &[u64], tied: &[(u64, u64)], explain: bool) -> Vec<Floor> {
        let counted: Vec<bool> =
            group.iter().map(|t| self.counted.contains(t) && !tied.iter().any(|(x, _)| x == t)).collect();
        if !counted.iter().any(|c| *c) {
            return Vec::new();
        }
        let cands: Vec<&Vec<u64>> = group.iter().map(|t| &self.open[t]).collect();
        let conns: BTreeSet<u64> =
            cands.iter().zip(&counted).filter(|(_, c)| **c).flat_map(|(v, _)| v.iter().copied()).collect();
        let mut out = Vec::new();
        for conn in conns {
            // Its own possible counted targets first, those that took the
            // most first: its explained rule then fails within the first
            // levels of a branch that gives it too few (searched in cookie
            // order, 14 targets of 5 connections ran out of budget).
            let order = self.floor_order(group, &counted, conn);
            let g: Vec<u64> = order.iter().map(|&i| group[i]).collect();
            let cs: Vec<&Vec<u64>> = order.iter().map(|&i| cands[i]).collect();
            let least = |explain: bool| {
                let mut s = self.searcher(&g, &cs, explain, true);
                s.counted = order.iter().map(|&i| counted[i]).collect();
                (s.least(conn), s.out_of_budget)
            };
            // No assignment obeys the explained rule from the first tick
            // (resent bytes past its share): the carried rule alone.
            let at_least = match least(explain) {
                (None, false) if explain => least(false).0,
                (found, _) => found,
            };
            let Some(at_least) = at_least else { continue };
            if at_least == 0 {
                continue;
            }
            let mine: Vec<usize> = (0..group.len()).filter(|&i| counted[i] && cands[i].contains(&conn)).collect();
            let with: BTreeSet<u64> =
                mine.iter().flat_map(|&i| cands[i].iter().copied()).filter(|c| *c != conn).collect();
            out.push(Floor {
                conn,
                at_least,
                targets: mine.iter().map(|&i| group[i]).collect(),
                with: with.into_iter().collect(),
            });
        }
        out
    }

    /// The order `floors` places `group`'s targets in for `conn`: its own
    /// possible counted targets first, those that took the most first.
    fn floor_order(&self, group: &[u64], counted: &[bool], conn: u64) -> Vec<usize> {
        let took = |t: u64| self.targets.get(&t).map_or(0, |t| super::fit::took(t, self.now));
        let mut order: Vec<usize> = (0..group.len()).collect();
        order.sort_by_key(|&i| {
            (!(counted[i] && self.open[&group[i]].contains(&conn)), std::cmp::Reverse(took(group[i])), group[i])
        });
        order
    }

    /// Floors for a group too large to search, from each connection's own
    /// explained rule alone: the other connections' rules are dropped (a
    /// relaxation: more assignments pass, so the least count it finds is a
    /// lower bound of the true one). The connection gets every target that
    /// may be its and does not count, then the counted ones that took the
    /// most, until its bytes are explained: fewer cannot explain them.
    fn loose_floors(&self, group: &[u64]) -> Vec<Floor> {
        let counted: Vec<u64> = group.iter().copied().filter(|t| self.counted.contains(t)).collect();
        if counted.is_empty() {
            return Vec::new();
        }
        let conns: BTreeSet<u64> = counted.iter().flat_map(|t| self.open[t].iter().copied()).collect();
        let mut out = Vec::new();
        for conn in conns {
            let Some(series) = self.conns.get(&conn) else { continue };
            let Some(from) = series.known_from else { continue };
            let may = |t: &&u64| self.open[*t].contains(&conn);
            let linked = self.set_of(conn, &[]);
            let free: Vec<u64> = group.iter().filter(may).filter(|t| !self.counted.contains(t)).copied().collect();
            let mut mine: Vec<u64> = counted.iter().filter(may).copied().collect();
            let n = linked.len() + free.len();
            // The rule holds at every moment, not only now (`fit::moments`):
            // at each, the counted targets that took the most by then go
            // first; the floor is the most any moment needs (each is a lower
            // bound alone).
            let moments = moments(series, from, self.now);
            let mut at_least = Some(0);
            for &m in &moments {
                let took = |t: &u64| self.targets.get(t).map_or(0, |t| took_between(t, from, m));
                mine.sort_by_key(|t| std::cmp::Reverse(took(t)));
                let base: u64 =
                    linked.iter().map(|t| took_between(t, from, m)).sum::<u64>() + free.iter().map(took).sum::<u64>();
                let explained = |k: usize| {
                    let into = base + mine[..k].iter().map(took).sum::<u64>();
                    unexplained(series, n + k, into, from, m, self.windows) == 0
                };
                tracing::debug!(
                    conn,
                    at = m.0,
                    carried = series.series.at(m).saturating_sub(series.series.at(from)),
                    free = ?free.iter().map(|t| (*t, took(t))).collect::<Vec<_>>(),
                    mine = ?mine.iter().map(|t| (*t, took(t))).collect::<Vec<_>>(),
                    base,
                    "attribution: loose floor of"
                );
                // No k explains it: its bytes went elsewhere; nothing is said.
                at_least = match (at_least, (0..=mine.len()).find(|&k| explained(k))) {
                    (Some(a), Some(k)) => Some(a.max(k)),
                    _ => None,
                };
            }
            let Some(at_least) = at_least else { continue };
            if at_least == 0 {
                continue;
            }
            let with: BTreeSet<u64> =
                mine.iter().flat_map(|t| self.open[t].iter().copied()).filter(|c| *c != conn).collect();
            out.push(Floor { conn, at_least, targets: mine, with: with.into_iter().collect() });
        }
        out
    }

    /// A search over `group` (its targets' candidates `cands`), ready to
    /// descend; the explained rule prunes only if `explain`.
    ///
    /// Ties (`floors` false) take a connection into the explained rule only
    /// once every target it ever fed is known (`whole_from`); floors also
    /// from hystall's first tick for one older than hystall (`known_from`).
    /// A connection whose resent bytes pass the rule's share can then be
    /// given another client's target by a wrong assignment that fits (a
    /// fast one, its bytes explaining the surplus): seen with Hysteria v1
    /// (`protocols_e2e`), where every connection predates the watch. A tie
    /// names a target as a connection's own; a floor only counts shared ones.
    fn searcher<'s>(
        &'s self,
        group: &'s [u64],
        cands: &'s [&'s Vec<u64>],
        explain: bool,
        floors: bool,
    ) -> Search<'s, 'a> {
        let members: Vec<Option<&Target>> = group.iter().map(|t| self.targets.get(t)).collect();
        // The connections the explained rule prunes by, with what their
        // linked targets and every group target that may be theirs took.
        // A connection that not even all of those explain (its bytes went
        // elsewhere: UDP relayed in full-size datagrams, streams to targets
        // we never saw) says nothing here; nor does one seen only in part.
        let mut slots = Vec::new();
        let mut slot_of = HashMap::new();
        let explained = if explain { cands.iter().flat_map(|v| v.iter().copied()).collect() } else { BTreeSet::new() };
        for c in explained {
            let Some(series) = self.conns.get(&c) else { continue };
            let Some(from) = (if floors { series.known_from } else { series.whole_from }) else { continue };
            let mine = members.iter().zip(cands.iter()).filter(|(_, v)| v.contains(&c)).filter_map(|(t, _)| *t);
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
            .zip(cands.iter())
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
        Search {
            p: self,
            group,
            cands,
            slots,
            shares,
            pick: vec![0; group.len()],
            fixed: None,
            found: false,
            extra: Vec::with_capacity(group.len()),
            nodes: 0,
            out_of_budget: false,
            least_for: None,
            counted: Vec::new(),
            count: 0,
            best: 0,
        }
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
    /// Minimising (`least`): the connection whose counted targets are
    /// counted, which of the group's targets count, how many the current
    /// branch gave it, and the least of any whole assignment so far.
    least_for: Option<u64>,
    counted: Vec<bool>,
    count: usize,
    best: usize,
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
        // Minimising: this branch already gave the connection as many as
        // the best whole assignment found.
        if self.least_for.is_some() && self.count >= self.best {
            return;
        }
        if i == self.group.len() {
            self.found = true;
            self.best = self.best.min(self.count);
            return;
        }
        // Minimising: the connection's own listing last, so that the
        // cheapest assignments come first and bound the rest.
        let last = self.least_for.filter(|_| self.counted[i]);
        let order = (0..self.cands[i].len())
            .filter(|&k| Some(self.cands[i][k]) != last)
            .chain((0..self.cands[i].len()).filter(|&k| Some(self.cands[i][k]) == last));
        for k in order.collect::<Vec<usize>>() {
            let c = self.cands[i][k];
            if self.fixed.is_some_and(|(fi, fc)| fi == i && fc != c) {
                continue;
            }
            self.pick[i] = k;
            self.extra.clear();
            self.extra.extend((0..i).filter(|&j| self.cands[j][self.pick[j]] == c).map(|j| self.group[j]));
            self.extra.push(self.group[i]);
            if self.p.carries(c, &self.extra) {
                let counts = Some(c) == last;
                self.count += usize::from(counts);
                self.place(i, k, true);
                self.dfs(i + 1);
                self.place(i, k, false);
                self.count -= usize::from(counts);
            }
            if (self.found && self.least_for.is_none()) || self.out_of_budget {
                return;
            }
        }
    }

    /// The least of the counted targets `conn` holds in any assignment
    /// obeying the rules; None when none does or the budget ran out.
    fn least(&mut self, conn: u64) -> Option<usize> {
        self.least_for = Some(conn);
        self.fixed = None;
        self.found = false;
        self.count = 0;
        self.best = self.group.len() + 1;
        self.dfs(0);
        if self.out_of_budget {
            tracing::debug!(group = ?self.group, conn, "attribution: floor search out of budget");
            return None;
        }
        self.found.then_some(self.best)
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
            s.whole_from = s.known_from;
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
        let valid = valid_assignments(p, group, false, true);
        let mut seen: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); group.len()];
        for pick in &valid {
            for (s, c) in seen.iter_mut().zip(pick) {
                s.insert(*c);
            }
        }
        group.iter().zip(&seen).filter(|(_, s)| s.len() == 1).map(|(t, s)| (*t, *s.first().expect("one"))).collect()
    }

    /// Each connection's least count of the counted targets not `tied`,
    /// over every assignment obeying the rules (those of one or more).
    fn floors_by_enumeration(p: &Problem, group: &[u64], tied: &[(u64, u64)]) -> Vec<(u64, usize)> {
        let counted: Vec<bool> =
            group.iter().map(|t| p.counted.contains(t) && !tied.iter().any(|(x, _)| x == t)).collect();
        let conns: BTreeSet<u64> =
            group.iter().zip(&counted).filter(|(_, c)| **c).flat_map(|(t, _)| p.open[t].iter().copied()).collect();
        conns
            .into_iter()
            .filter_map(|c| {
                let least = least_for(p, group, &counted, c, false)?;
                (least > 0).then_some((c, least))
            })
            .collect()
    }

    /// The least count of `counted` targets on `c` over every assignment
    /// obeying the rules, in the order the search places them for it (the
    /// carried rule is checked on each prefix of a connection's targets);
    /// None when no assignment does.
    fn least_for(p: &Problem, group: &[u64], counted: &[bool], c: u64, at_moments: bool) -> Option<usize> {
        let order = p.floor_order(group, counted, c);
        let g: Vec<u64> = order.iter().map(|&i| group[i]).collect();
        let k: Vec<bool> = order.iter().map(|&i| counted[i]).collect();
        let least = |valid: Vec<Vec<u64>>| {
            valid.iter().map(|pick| pick.iter().zip(&k).filter(|(x, k)| **x == c && **k).count()).min()
        };
        // As `floors` does: none obeys the explained rule, the carried rule
        // alone (not for the loose floors, checked `at_moments`: they have
        // no such fall-back, and are compared where an assignment obeys).
        let found = least(valid_assignments(p, &g, at_moments, true));
        if at_moments { found } else { found.or_else(|| least(valid_assignments(p, &g, false, false))) }
    }

    /// Every assignment (a connection per group target) obeying both rules
    /// (the explained rule now, as the search checks it, or `at_moments`
    /// also at the moments the loose floors check it at).
    fn valid_assignments(p: &Problem, group: &[u64], at_moments: bool, explain: bool) -> Vec<Vec<u64>> {
        let cands: Vec<&Vec<u64>> = group.iter().map(|t| &p.open[t]).collect();
        let explains = |c: u64, set: &[u64]| {
            if !explain {
                return true;
            }
            let Some(series) = p.conns.get(&c) else { return true };
            let Some(from) = series.known_from else { return true };
            let all = p.set_of(c, set);
            let at = if at_moments { moments(series, from, p.now) } else { vec![p.now] };
            at.iter().all(|&m| {
                let into = all.iter().map(|t| took_between(t, from, m)).sum();
                unexplained(series, all.len(), into, from, m, p.windows) == 0
            })
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
        let mut valid = Vec::new();
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
                valid.push(pick);
            }
        }
        valid
    }

    #[test]
    fn the_search_forces_what_trying_every_assignment_forces() {
        let skip = Map::default();
        let mut forced = 0;
        let mut floored = 0;
        let mut loose = 0;
        let mut earlier = 0;
        let mut capped = 0;
        for seed in 1..=3000u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let (conns, targets, open, linked) = problem_parts(&mut rng);
            let group: Vec<u64> = open.keys().copied().collect();
            // About two targets in three count (stalled).
            let counted: std::collections::HashSet<u64> = group.iter().copied().filter(|_| rng.below(3) > 0).collect();
            // One seed in three: a connection that cannot hold more than
            // 0 or 1 counted targets (a request of its after its stop).
            let mut caps = Map::default();
            if rng.below(3) == 0
                && let Some(&c) = conns.keys().nth(rng.below(conns.len().max(1) as u64) as usize)
            {
                caps.insert(c, rng.below(2) as usize);
                capped += 1;
            }
            let p = Problem {
                conns: &conns,
                targets: &targets,
                linked,
                open,
                now: Mono(600 * MS),
                windows: Windows { stream: 3 * MARK_BYTES_FOR_TEST, conn: 5 * MARK_BYTES_FOR_TEST },
                skip: &skip,
                budget: usize::MAX,
                counted: &counted,
                floored: &skip,
                caps: &caps,
            };
            let want = by_enumeration(&p, &group);
            forced += want.len();
            assert_eq!(p.search(&group, true).map(Option::unwrap_or_default), Some(want.clone()), "seed {seed}");
            // The floors: what every assignment gives each connection of
            // the counted targets none of the rules tied.
            let floors: Vec<(u64, usize)> =
                p.floors(&group, &want, true).iter().map(|f| (f.conn, f.at_least)).collect();
            let expect = floors_by_enumeration(&p, &group, &want);
            floored += expect.len();
            assert_eq!(floors, expect, "seed {seed}");
            // The loose floors (groups too large to search) never claim
            // more than every assignment gives that obeys the rules at the
            // moments they check.
            let all: Vec<bool> = group.iter().map(|t| counted.contains(t)).collect();
            for f in p.loose_floors(&group) {
                if let Some(e) = least_for(&p, &group, &all, f.conn, true) {
                    assert!(f.at_least <= e, "seed {seed}: loose {} > exact {e} for conn {}", f.at_least, f.conn);
                    loose += 1;
                    // An earlier moment needed more than now does.
                    if least_for(&p, &group, &all, f.conn, false).is_some_and(|now| f.at_least > now) {
                        earlier += 1;
                    }
                }
            }
        }
        assert!(forced > 100, "the cases force something often enough to test ({forced})");
        assert!(floored > 0, "the cases give floors ({floored})");
        assert!(loose > 0, "the cases give loose floors ({loose})");
        assert!(earlier > 0, "the cases have loose floors an earlier moment raised ({earlier})");
        assert!(capped > 500, "the cases cap connections ({capped})");
    }
}
