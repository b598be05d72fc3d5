//! The enforcement rule (pure; time is an input): the upstream fix applied
//! from outside. A target socket of a watched process whose sends made no
//! progress for the stall timeout (STALLED) is to be destroyed, so that the
//! server's copy ends, its stream closes, and the connection window is freed.
//! Progress resets the clock (the verdict's rule), so a slow target that keeps
//! reading is never cut.
//!
//! Only what can be justified is touched: sockets the process connected
//! itself (outbound targets), not accepted ones; never an excluded address;
//! at most `max_per_minute` destroys a minute (a refusal is reported, not
//! hidden); each socket once.

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use super::sockets::{Socket, SocketTable};
use super::time::Mono;
use super::verdict::Verdict;

/// `--exclude`: an address, a port, or both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exclude {
    pub ip: Option<std::net::IpAddr>,
    pub port: Option<u16>,
}

impl Exclude {
    /// `IP`, `IP:PORT`, `[IPv6]:PORT` or `:PORT`.
    pub fn parse(s: &str) -> Result<Exclude, String> {
        if let Some(p) = s.strip_prefix(':') {
            return p
                .parse()
                .map(|port| Exclude { ip: None, port: Some(port) })
                .map_err(|_| format!("bad port in {s:?}"));
        }
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Ok(Exclude { ip: Some(a.ip()), port: Some(a.port()) });
        }
        s.parse()
            .map(|ip| Exclude { ip: Some(ip), port: None })
            .map_err(|_| format!("{s:?} is not IP, IP:PORT or :PORT"))
    }

    pub fn matches(&self, a: SocketAddr) -> bool {
        self.ip.is_none_or(|ip| ip == a.ip()) && self.port.is_none_or(|p| p == a.port())
    }
}

#[derive(Clone, Debug)]
pub struct EnforceConfig {
    pub dry_run: bool,
    pub max_per_minute: usize,
    pub excludes: Vec<Exclude>,
}

/// What to do with one socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Destroy it (or, dry-run, say so).
    Destroy { cookie: u64, pid: u32, local: SocketAddr, remote: SocketAddr },
    /// It qualifies, but the rate limit is reached.
    Refuse { cookie: u64, reason: &'static str },
}

pub struct Enforcer {
    pub cfg: EnforceConfig,
    recent: VecDeque<Mono>,
    done: HashSet<u64>,
}

impl Enforcer {
    pub fn new(cfg: EnforceConfig) -> Self {
        Enforcer { cfg, recent: VecDeque::new(), done: HashSet::new() }
    }

    fn eligible(&self, s: &Socket) -> Option<(SocketAddr, SocketAddr)> {
        if s.closed.is_some() || s.verdict != Verdict::Stalled || !s.k.outbound || self.done.contains(&s.k.cookie) {
            return None;
        }
        let (local, remote) = (s.local()?, s.remote()?);
        if self.cfg.excludes.iter().any(|e| e.matches(remote) || e.matches(local)) {
            return None;
        }
        Some((local, remote))
    }

    /// The decisions for `now`; each socket is decided once.
    pub fn decide(&mut self, now: Mono, socks: &SocketTable) -> Vec<Decision> {
        while self.recent.front().is_some_and(|t| now.since(*t) >= Duration::from_secs(60)) {
            self.recent.pop_front();
        }
        let mut candidates: Vec<(&Socket, SocketAddr, SocketAddr)> =
            socks.iter().filter_map(|s| self.eligible(s).map(|(l, r)| (s, l, r))).collect();
        // The longest-stuck first.
        candidates.sort_by_key(|(s, _, _)| s.progress().no_progress_since());
        let mut out = Vec::new();
        for (s, local, remote) in candidates {
            self.done.insert(s.k.cookie);
            if self.recent.len() >= self.cfg.max_per_minute {
                out.push(Decision::Refuse { cookie: s.k.cookie, reason: "rate limit: too many destroys this minute" });
                continue;
            }
            self.recent.push_back(now);
            out.push(Decision::Destroy { cookie: s.k.cookie, pid: s.k.pid, local, remote });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::observation::{Observation, SockChange, SockSample};
    use crate::core::verdict::Thresholds;

    fn s(secs: f64) -> Mono {
        Mono::from_secs_f64(secs)
    }

    fn table() -> SocketTable {
        SocketTable::new(Thresholds { stall_timeout: Duration::from_secs(3), slow_after: Duration::from_secs(1) })
    }

    fn sock(t: &mut SocketTable, cookie: u64, outbound: bool, remote: &str, acking: bool, now: f64) {
        let k = SockSample {
            cookie,
            pid: 9,
            outbound,
            state: 1,
            local: Some(format!("10.0.0.1:{}", 40000 + cookie).parse().unwrap()),
            remote: Some(remote.parse().unwrap()),
            blocked_since: Some(s(0.0)),
            last_ack: acking.then_some(s(now)),
            ..Default::default()
        };
        t.apply(Observation::Sock { at: s(now), change: SockChange::Poll, sample: k });
    }

    #[test]
    fn only_stalled_outbound_unexcluded_sockets_once_and_within_the_rate() {
        let mut t = table();
        sock(&mut t, 1, true, "93.184.216.34:443", false, 0.0); // stalled target
        sock(&mut t, 2, false, "198.51.100.7:50000", false, 0.0); // accepted (client side)
        sock(&mut t, 3, true, "10.9.9.9:53", false, 0.0); // excluded
        sock(&mut t, 4, true, "93.184.216.35:443", false, 0.0); // stalled target
        sock(&mut t, 5, true, "93.184.216.36:443", false, 0.0); // over the rate
        t.tick(s(4.0));
        let mut e = Enforcer::new(EnforceConfig {
            dry_run: false,
            max_per_minute: 2,
            excludes: vec![Exclude::parse("10.9.9.9").unwrap()],
        });
        let d = e.decide(s(4.0), &t);
        let destroyed: Vec<u64> = d
            .iter()
            .filter_map(|x| if let Decision::Destroy { cookie, .. } = x { Some(*cookie) } else { None })
            .collect();
        assert_eq!(destroyed.len(), 2);
        assert!(destroyed.iter().all(|c| [1, 4, 5].contains(c)));
        assert_eq!(d.iter().filter(|x| matches!(x, Decision::Refuse { .. })).count(), 1);
        assert!(e.decide(s(5.0), &t).is_empty(), "each socket once");
    }

    #[test]
    fn a_slow_target_that_keeps_reading_is_never_cut() {
        let mut t = table();
        let mut e = Enforcer::new(EnforceConfig { dry_run: false, max_per_minute: 60, excludes: vec![] });
        for i in 0..100 {
            let now = i as f64 * 0.5;
            sock(&mut t, 1, true, "93.184.216.34:443", true, now);
            t.tick(s(now));
            assert!(e.decide(s(now), &t).is_empty(), "t={now}");
        }
    }

    #[test]
    fn excludes_parse_addresses_ports_and_both() {
        let a: SocketAddr = "1.2.3.4:443".parse().unwrap();
        assert!(Exclude::parse(":443").unwrap().matches(a));
        assert!(Exclude::parse("1.2.3.4").unwrap().matches(a));
        assert!(Exclude::parse("1.2.3.4:443").unwrap().matches(a));
        assert!(!Exclude::parse("1.2.3.4:80").unwrap().matches(a));
        assert!(Exclude::parse("[::1]:53").unwrap().matches("[::1]:53".parse().unwrap()));
        assert!(Exclude::parse("nope").is_err());
    }
}
