//! The socket table: every TCP socket of the watched processes that the kernel
//! told us about, its progress, and its verdict. Verdict changes become events.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::event::{Event, SocketInfo, Stamped, tcp_state_name};
use super::observation::{DiagSample, InflightSample, Observation, SockChange, SockSample};
use super::time::Mono;
use super::verdict::{SendProgress, Thresholds, Verdict};

/// Blocked this long → the sources re-read the socket's kernel entry and
/// sock_diag figures every tick (cheap for the few sockets it concerns).
const WATCH_AFTER: Duration = Duration::from_millis(300);

#[derive(Clone, Debug, Default)]
pub struct Socket {
    pub k: SockSample,
    pub diag: Option<DiagSample>,
    /// When sock_diag last saw bytes_acked grow (progress the tracepoint may
    /// have missed, e.g. before we attached).
    pub diag_progress: Option<Mono>,
    /// Start of a send syscall in flight on this socket (blocking writers).
    pub inflight_since: Option<Mono>,
    pub verdict: Verdict,
    pub verdict_since: Mono,
    /// A `socket_stalled` was emitted and not yet followed by a recovery.
    pub stalled_reported: bool,
    /// Ever reported as stalled: its close is worth an event.
    pub ever_stalled: bool,
    pub closed: Option<Mono>,
    pub last_update: Mono,
}

impl Socket {
    pub fn progress(&self) -> SendProgress {
        let blocked_since = match (self.k.blocked_since, self.inflight_since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let last_progress = [self.k.last_send, self.k.last_ack, self.diag_progress].into_iter().flatten().max();
        SendProgress { blocked_since, last_progress }
    }

    pub fn local(&self) -> Option<SocketAddr> {
        self.k.local.or(self.diag.as_ref().and_then(|d| d.local))
    }

    pub fn remote(&self) -> Option<SocketAddr> {
        self.k.remote.or(self.diag.as_ref().and_then(|d| d.remote))
    }

    pub fn info(&self, now: Mono) -> SocketInfo {
        let p = self.progress();
        let end = self.closed.unwrap_or(now);
        SocketInfo {
            pid: self.k.pid,
            comm: self.k.comm.clone(),
            cookie: self.k.cookie,
            local: self.local().map(|a| a.to_string()),
            remote: self.remote().map(|a| a.to_string()),
            state: tcp_state_name(if self.k.state != 0 {
                self.k.state
            } else {
                self.diag.as_ref().map_or(0, |d| d.state)
            }),
            verdict: self.verdict.as_str(),
            outbound: self.k.outbound,
            blocked_ms: p.blocked_since.map_or(0, |b| end.since(b).as_millis() as u64),
            no_progress_ms: p.no_progress_since().map_or(0, |q| end.since(q).as_millis() as u64),
            unsent_bytes: self.diag.as_ref().map(|d| d.notsent),
            send_q: self.diag.as_ref().map(|d| d.send_q),
            peer_window: self.k.peer_window,
            failed_sends: self.k.send_eagain + self.k.send_errors,
            send_bytes: self.k.send_bytes,
            acked_bytes: self.k.acked_bytes,
            in_syscall: self.inflight_since.is_some(),
        }
    }
}

/// All sockets, keyed by cookie.
#[derive(Debug, Default)]
pub struct SocketTable {
    pub th: Thresholds,
    socks: HashMap<u64, Socket>,
}

impl SocketTable {
    pub fn new(th: Thresholds) -> Self {
        SocketTable { th, socks: HashMap::new() }
    }

    pub fn get(&self, cookie: u64) -> Option<&Socket> {
        self.socks.get(&cookie)
    }

    pub fn len(&self) -> usize {
        self.socks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.socks.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Socket> {
        self.socks.values()
    }

    pub fn apply(&mut self, obs: Observation) {
        match obs {
            Observation::Sock { at, change, sample } => self.apply_sock(at, change, sample),
            Observation::Diag { at, sample } => self.apply_diag(at, sample),
            Observation::Inflight { at, sends } => self.apply_inflight(at, sends),
        }
    }

    fn apply_sock(&mut self, at: Mono, change: SockChange, sample: SockSample) {
        let s = self.socks.entry(sample.cookie).or_insert_with(|| Socket { verdict_since: at, ..Default::default() });
        // Keep what the kernel entry lacks (e.g. a 4-tuple learned from diag).
        let keep_local = s.k.local;
        let keep_remote = s.k.remote;
        s.k = sample;
        s.k.local = s.k.local.or(keep_local);
        s.k.remote = s.k.remote.or(keep_remote);
        s.last_update = at;
        if change == SockChange::Destroyed {
            s.closed = Some(at);
        }
    }

    fn apply_diag(&mut self, at: Mono, d: DiagSample) {
        let Some(s) = self.socks.get_mut(&d.cookie) else { return };
        if let Some(prev) = &s.diag
            && d.bytes_acked > prev.bytes_acked
        {
            s.diag_progress = Some(at);
        }
        if s.k.local.is_none() {
            s.k.local = d.local;
            s.k.remote = d.remote;
        }
        s.diag = Some(d);
        s.last_update = at;
    }

    fn apply_inflight(&mut self, at: Mono, sends: Vec<InflightSample>) {
        let mut seen: HashMap<u64, Mono> = HashMap::new();
        for f in &sends {
            if let Some(c) = f.cookie {
                let e = seen.entry(c).or_insert(f.since);
                *e = (*e).min(f.since);
            }
        }
        for (cookie, s) in self.socks.iter_mut().filter(|(_, s)| s.closed.is_none()) {
            s.inflight_since = seen.remove(cookie);
        }
        // A blocking writer whose very first send blocks has no kernel entry yet.
        for f in sends {
            if let Some(c) = f.cookie
                && let Some(since) = seen.remove(&c)
            {
                let mut k = SockSample { cookie: c, pid: f.pid, first_seen: Some(at), ..Default::default() };
                k.comm = String::new();
                self.socks.insert(
                    c,
                    Socket { k, inflight_since: Some(since), verdict_since: at, last_update: at, ..Default::default() },
                );
            }
        }
    }

    /// Sockets the sources should re-read now: blocked for a while and not closed.
    pub fn wanted(&self, now: Mono) -> Vec<(u64, Option<SocketAddr>, Option<SocketAddr>)> {
        self.socks
            .values()
            .filter(|s| s.closed.is_none())
            .filter(|s| s.progress().blocked_since.is_some_and(|b| now.since(b) >= WATCH_AFTER))
            .map(|s| (s.k.cookie, s.local(), s.remote()))
            .collect()
    }

    /// Re-judges every socket at `now`; returns the events of verdict changes,
    /// and forgets closed sockets.
    pub fn tick(&mut self, now: Mono) -> Vec<Stamped> {
        let mut out = Vec::new();
        let th = self.th;
        for s in self.socks.values_mut() {
            let v = if s.closed.is_some() { Verdict::Ok } else { s.progress().judge(now, &th) };
            if v != s.verdict {
                s.verdict = v;
                s.verdict_since = now;
            }
            if s.closed.is_none() && v == Verdict::Stalled && !s.stalled_reported {
                // Stamp the event when the timeout expired, not when we looked.
                s.stalled_reported = true;
                s.ever_stalled = true;
                out.push(Stamped { at: now, event: Event::SocketStalled(s.info(now)) });
            } else if s.stalled_reported && v != Verdict::Stalled && s.closed.is_none() {
                s.stalled_reported = false;
                out.push(Stamped { at: now, event: Event::SocketRecovered(s.info(now)) });
            }
            if let Some(at) = s.closed
                && s.ever_stalled
            {
                out.push(Stamped { at, event: Event::SocketClosed(s.info(at)) });
            }
        }
        self.socks.retain(|_, s| s.closed.is_none());
        out.sort_by_key(|e| e.at);
        out
    }

    /// Counts by verdict (OK, SLOW, STALLED).
    pub fn counts(&self) -> [usize; 3] {
        let mut c = [0; 3];
        for s in self.socks.values() {
            c[s.verdict as usize] += 1;
        }
        c
    }
}
