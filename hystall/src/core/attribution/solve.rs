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

use super::fit::{carried, unexplained};
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

    /// Whether `conn`'s bytes can be explained by its linked targets plus
    /// `extra` (always, for a connection whose targets are not all known).
    fn explained(&self, conn: u64, extra: &[u64]) -> bool {
        self.conns.get(&conn).is_none_or(|c| {
            c.known_from.is_none_or(|from| unexplained(c, &self.set_of(conn, extra), from, self.now, self.windows) == 0)
        })
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
                    _ => {
                        self.open.insert(t, cands);
                    }
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
        // A connection that not even every target it may have explains
        // (its bytes went elsewhere: UDP relayed in full-size datagrams,
        // streams to targets we never saw) says nothing here.
        let conns: BTreeSet<u64> = cands
            .iter()
            .flat_map(|c| c.iter().copied())
            .filter(|&c| {
                let all: Vec<u64> = group.iter().zip(&cands).filter(|(_, v)| v.contains(&c)).map(|(t, _)| *t).collect();
                self.explained(c, &all)
            })
            .collect();
        let mut s = Search {
            p: self,
            group,
            cands: &cands,
            pick: vec![0; group.len()],
            seen: vec![BTreeSet::new(); group.len()],
            nodes: 0,
            aborted: false,
            out_of_budget: false,
            solutions: 0,
            conns: conns.into_iter().collect(),
        };
        s.dfs(0);
        if s.aborted || s.solutions == 0 {
            tracing::debug!(?group, aborted = s.aborted, solutions = s.solutions, "attribution: nothing forced");
            return (!s.out_of_budget).then(Vec::new);
        }
        Some(
            group
                .iter()
                .zip(&s.seen)
                .filter(|(_, v)| v.len() == 1)
                .map(|(t, v)| (*t, *v.iter().next().expect("one")))
                .collect(),
        )
    }
}

struct Search<'a, 'p> {
    p: &'a Problem<'p>,
    group: &'a [u64],
    cands: &'a [&'a Vec<u64>],
    /// The candidate index chosen for each target so far.
    pick: Vec<usize>,
    /// Connections each target takes in the assignments found.
    seen: Vec<BTreeSet<u64>>,
    nodes: usize,
    aborted: bool,
    /// Aborted for the node budget (not because nothing more was to learn).
    out_of_budget: bool,
    solutions: usize,
    conns: Vec<u64>,
}

impl Search<'_, '_> {
    fn chosen(&self, upto: usize, conn: u64) -> Vec<u64> {
        (0..upto).filter(|&j| self.cands[j][self.pick[j]] == conn).map(|j| self.group[j]).collect()
    }

    fn dfs(&mut self, i: usize) {
        if self.aborted {
            return;
        }
        self.nodes += 1;
        if self.nodes > self.p.budget {
            self.aborted = true;
            self.out_of_budget = true;
            return;
        }
        // Prune: a connection whose bytes stay unexplained even if every
        // target still open that may be its were given to it.
        for &c in &self.conns {
            let mut extra = self.chosen(i, c);
            extra.extend((i..self.group.len()).filter(|&j| self.cands[j].contains(&c)).map(|j| self.group[j]));
            if !self.p.explained(c, &extra) {
                return;
            }
        }
        if i == self.group.len() {
            self.solutions += 1;
            for j in 0..self.group.len() {
                self.seen[j].insert(self.cands[j][self.pick[j]]);
            }
            // Every target seen with two connections: nothing more to learn.
            if self.seen.iter().all(|s| s.len() > 1) {
                self.aborted = true;
                self.solutions = 0;
            }
            return;
        }
        for k in 0..self.cands[i].len() {
            self.pick[i] = k;
            let c = self.cands[i][k];
            let mut extra = self.chosen(i, c);
            extra.push(self.group[i]);
            if self.p.carries(c, &extra) {
                self.dfs(i + 1);
            }
            if self.aborted {
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
