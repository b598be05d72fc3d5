//! Reply evidence: a Hysteria2 server answers each TCP request as soon as its
//! target is dialled (a status and 128–1023 bytes of padding, on the stream
//! that asked), so the connection that opened a target gets a server packet
//! larger than an ACK within milliseconds of the target's connect
//! completing. A client that only uploads gets ACKs: when its requests were
//! sent in the same instant as another's, the connect timing cannot tell them
//! apart, but the server's answers can (`hystall_common::REPLY_MIN`).
//!
//! Not every QUIC proxy protocol answers (TUIC does not), so the rule is
//! learned per process: it strikes candidates only once targets tied without
//! it (the connect left one connection, or the server's API named it) showed
//! their connection answered, and it is switched off when answers go missing.
//! A process whose own config says it serves only protocols that answer
//! (Hysteria 2: `proxy_config::Served::answers`) starts with the
//! rule on, as if it had shown that much: a server (re)started under load,
//! or clients whose first requests come in the same instant, leave nothing
//! to learn from before the requests that matter. Answers that go missing
//! switch it off the same way.

use std::time::Duration;

use crate::core::conns::ConnTable;
use crate::core::flows::Reply;
use crate::core::time::Mono;

/// How long after a target's connect completed its connection's answer may
/// come. Measured with six sing-box clients starting together on two cores:
/// 0.4–4 ms; far longer leaves fewer uploaders to strike.
pub const WINDOW: Duration = Duration::from_millis(50);
/// Exactly tied targets whose connection answered before the rule is used.
pub const LEARN: u32 = 3;
/// Answers missing at most once per this many seen, or the rule is off.
pub const MISS_PER: u32 = 100;

/// What one process's targets showed of its answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gate {
    /// Exactly tied targets whose connection was answered in the window.
    pub answered: u32,
    /// Targets whose connection (or, when every candidate was silent, any
    /// candidate) was not.
    pub missed: u32,
    /// Its config says its protocol answers: counted as `LEARN` answers.
    pub known: bool,
}

impl Gate {
    /// Whether the process answers its requests (so silence rules out).
    pub fn open(&self) -> bool {
        let answered = self.answered + if self.known { LEARN } else { 0 };
        answered >= LEARN && self.missed.saturating_mul(MISS_PER) <= answered
    }

    /// What an exactly tied target's connection showed.
    pub fn learn(&mut self, r: Reply) {
        match r {
            Reply::Sent => self.answered += 1,
            Reply::None => self.missed += 1,
            Reply::Unknown => {}
        }
    }
}

/// For each candidate, whether the server answered it in the window after the
/// target's connect completed at `established`.
pub fn check(established: Mono, cands: &[u64], conns: &ConnTable) -> Vec<(u64, Reply)> {
    let to = Mono(established.0 + WINDOW.as_nanos() as u64);
    cands.iter().map(|&c| (c, conns.reply(c, established, to))).collect()
}

/// Whether every candidate is known to have had no answer: then the one that
/// asked did not get one (or was not among them), and the rule failed.
pub fn all_silent(answers: &[(u64, Reply)]) -> bool {
    !answers.is_empty() && answers.iter().all(|(_, r)| *r == Reply::None)
}

/// The candidates left once those known not to have been answered are
/// struck; None when that would strike none or all of them.
pub fn strike(cands: &[u64], answers: &[(u64, Reply)]) -> Option<Vec<u64>> {
    let silent = |c: &u64| answers.iter().any(|(a, r)| a == c && *r == Reply::None);
    let left: Vec<u64> = cands.iter().copied().filter(|c| !silent(c)).collect();
    (!left.is_empty() && left.len() < cands.len()).then_some(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_opens_after_answered_exact_ties_and_closes_when_answers_go_missing() {
        let mut g = Gate::default();
        g.learn(Reply::Sent);
        g.learn(Reply::Sent);
        g.learn(Reply::Unknown);
        assert!(!g.open(), "two answers are not enough to learn from");
        g.learn(Reply::Sent);
        assert!(g.open());
        g.learn(Reply::None);
        assert!(!g.open(), "a protocol that does not answer (or a late answer) switches it off");
    }

    #[test]
    fn a_protocol_known_to_answer_opens_the_rule_at_once_and_misses_still_close_it() {
        let mut g = Gate { known: true, ..Gate::default() };
        assert!(g.open(), "its config says it answers");
        g.learn(Reply::Sent);
        g.learn(Reply::None);
        assert!(!g.open(), "an answer that went missing switches it off all the same");
        for _ in 0..96 {
            g.learn(Reply::Sent);
        }
        assert!(g.open(), "one miss in a hundred");
    }

    #[test]
    fn silent_candidates_are_struck_but_never_all_of_them() {
        let a = [(1, Reply::None), (2, Reply::Sent), (3, Reply::Unknown)];
        assert_eq!(strike(&[1, 2, 3], &a), Some(vec![2, 3]));
        assert_eq!(strike(&[2, 3], &a), None, "nothing to strike");
        assert_eq!(strike(&[1], &a), None, "never all of them");
        assert!(all_silent(&[(1, Reply::None), (4, Reply::None)]));
        assert!(!all_silent(&a));
    }
}
