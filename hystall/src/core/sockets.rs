//! The socket table: every TCP socket of the watched processes that the kernel
//! told us about, its progress, and its verdict. Verdict changes become events.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::event::{Event, SocketInfo, Stamped, tcp_state_name};
use super::observation::{DiagSample, InflightSample, Observation, SendCount, SockChange, SockSample};
use super::time::Mono;
use super::verdict::{SendProgress, Thresholds, Verdict};

/// Blocked this long → the sources re-read the socket's kernel entry and
/// sock_diag figures every tick (cheap for the few sockets it concerns).
const WATCH_AFTER: Duration = Duration::from_millis(300);
/// A socket missing from the kernel's map is forgotten once it has been quiet
/// this long (see [`SocketTable::untracked`]).
pub const FORGET_AFTER: Duration = Duration::from_secs(30);

#[derive(Clone, Debug, Default)]
pub struct Socket {
    pub k: SockSample,
    pub diag: Option<DiagSample>,
    pub diag_at: Option<Mono>,
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
        let mut blocked_since = match (self.k.blocked_since, self.inflight_since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // A writer cannot be blocked on an empty send queue: the data it was
        // waiting to queue has all been sent and acknowledged since.
        if let (Some(b), Some(d), Some(at)) = (blocked_since, &self.diag, self.diag_at)
            && at > b
            && d.send_q == 0
            && self.inflight_since.is_none()
        {
            blocked_since = None;
        }
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
            Observation::Header { .. }
            | Observation::FlowCounts { .. }
            | Observation::FlowMoves { .. }
            | Observation::Owners { .. }
            | Observation::Streams { .. }
            | Observation::Frames { .. }
            | Observation::Marks { .. }
            | Observation::Relays { .. }
            | Observation::Answering { .. }
            | Observation::FlowsForgotten { .. } => {}
            Observation::SocketsGone { at, cookies } => self.apply_gone(at, cookies),
            Observation::Sends { at, sends } => self.apply_sends(at, &sends),
        }
    }

    fn apply_sends(&mut self, at: Mono, sends: &[SendCount]) {
        for c in sends {
            if let Some(s) = self.socks.get_mut(&c.cookie)
                && s.closed.is_none()
                && c.bytes >= s.k.send_bytes
            {
                s.k.send_bytes = c.bytes;
                s.k.last_send = s.k.last_send.max(c.last_send);
                s.last_update = at;
            }
        }
    }

    /// Target sockets whose send figures are read with every flow poll: the
    /// outbound ones still open (the attribution follows their bytes).
    pub fn targets(&self) -> impl Iterator<Item = u64> + '_ {
        self.socks.values().filter(|s| s.closed.is_none() && s.k.outbound).map(|s| s.k.cookie)
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
        s.diag_at = Some(at);
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
            // A closed socket keeps its last verdict for its closing event.
            let v = if s.closed.is_some() { s.verdict } else { s.progress().judge(now, &th) };
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

    /// The sockets the kernel no longer tracks (`kernel`: the cookies its
    /// socket map holds), to be closed (`Observation::SocketsGone`) so the next
    /// tick reports and forgets them. Their destroy event was lost (a full ring buffer) or the LRU map
    /// evicted them; without this they would stay in the table for good. Only
    /// sockets quiet for [`FORGET_AFTER`] and with no send in flight: a socket
    /// seen a moment ago may not be in a key walk that started before it.
    pub fn untracked(&self, now: Mono, kernel: &std::collections::HashSet<u64>) -> Vec<u64> {
        self.socks
            .iter()
            .filter(|(cookie, s)| {
                s.closed.is_none()
                    && s.inflight_since.is_none()
                    && now.since(s.last_update) >= FORGET_AFTER
                    && !kernel.contains(cookie)
            })
            .map(|(cookie, _)| *cookie)
            .collect()
    }

    fn apply_gone(&mut self, at: Mono, cookies: Vec<u64>) {
        for c in cookies {
            if let Some(s) = self.socks.get_mut(&c)
                && s.closed.is_none()
            {
                s.closed = Some(at);
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: f64) -> Mono {
        Mono::from_secs_f64(secs)
    }

    fn table(timeout: f64) -> SocketTable {
        SocketTable::new(Thresholds {
            stall_timeout: Duration::from_secs_f64(timeout),
            slow_after: Duration::from_secs(1),
        })
    }

    fn sample(cookie: u64) -> SockSample {
        SockSample {
            cookie,
            pid: 7,
            comm: "sing-box".into(),
            local: Some("127.0.0.1:40000".parse().unwrap()),
            remote: Some("127.0.0.1:9000".parse().unwrap()),
            outbound: true,
            state: 1,
            ..Default::default()
        }
    }

    fn blocked(cookie: u64, at: f64) -> Observation {
        let mut k = sample(cookie);
        k.last_send = Some(s(at));
        k.blocked_since = Some(s(at));
        k.send_eagain = 1;
        Observation::Sock { at: s(at), change: SockChange::Blocked, sample: k }
    }

    fn names(events: &[Stamped]) -> Vec<&'static str> {
        events.iter().map(|e| e.event.name()).collect()
    }

    /// Runs ticks every 200 ms from `from` to `to` and returns the events.
    fn run(t: &mut SocketTable, from: f64, to: f64) -> Vec<Stamped> {
        let steps = ((to - from) / 0.2).round() as u32;
        (0..=steps).flat_map(|i| t.tick(s(from + i as f64 * 0.2))).collect()
    }

    #[test]
    fn a_stuck_socket_is_reported_once_at_the_timeout() {
        let mut t = table(10.0);
        t.apply(blocked(1, 100.0));
        assert!(run(&mut t, 100.0, 109.8).is_empty());
        let ev = run(&mut t, 110.0, 130.0);
        assert_eq!(names(&ev), ["socket_stalled"]);
        let Event::SocketStalled(info) = &ev[0].event else { unreachable!() };
        assert_eq!(info.blocked_ms, 10_000);
        assert_eq!(info.local.as_deref(), Some("127.0.0.1:40000"));
        assert_eq!(t.counts(), [0, 0, 1]);
    }

    #[test]
    fn ack_progress_recovers_a_stalled_socket_and_a_new_stall_is_reported_again() {
        let mut t = table(3.0);
        t.apply(blocked(1, 0.0));
        assert_eq!(names(&run(&mut t, 0.0, 4.0)), ["socket_stalled"]);
        // The peer starts reading again: snd_una moves.
        let mut k = sample(1);
        k.blocked_since = Some(s(0.0));
        k.last_ack = Some(s(4.1));
        t.apply(Observation::Sock { at: s(4.1), change: SockChange::Poll, sample: k.clone() });
        assert_eq!(names(&run(&mut t, 4.2, 4.2)), ["socket_recovered"]);
        // ...and stops again: a second stall, 3 s after the last ACK.
        assert!(run(&mut t, 4.4, 7.0).is_empty());
        assert_eq!(names(&run(&mut t, 7.2, 8.0)), ["socket_stalled"]);
    }

    #[test]
    fn a_slow_reader_is_slow_for_minutes_but_never_stalled() {
        let mut t = table(10.0);
        t.apply(blocked(1, 0.0));
        let mut events = Vec::new();
        // The writer waits for buffer space the whole time (like a Go writer
        // woken only when a third of the buffer drained), ACKs every 100 ms.
        for i in 1..1800 {
            let now = i as f64 * 0.1;
            let mut k = sample(1);
            k.blocked_since = Some(s(0.0));
            k.last_ack = Some(s(now));
            t.apply(Observation::Sock { at: s(now), change: SockChange::Poll, sample: k });
            events.extend(t.tick(s(now)));
        }
        assert!(events.is_empty(), "{:?}", names(&events));
        assert_eq!(t.get(1).unwrap().verdict, Verdict::Slow);
    }

    /// The zero-window path (no send-result probe): `tcp_probe` reports the
    /// block when the peer's window is zero and the writer cannot be woken,
    /// with no send seen at all (a writer parked since before), and each
    /// zero-window probe reply after it brings nothing new.
    fn zero_window(cookie: u64, at: f64, change: SockChange, blocked_since: Option<f64>, last_ack: f64) -> Observation {
        let mut k = sample(cookie);
        k.peer_window = 0;
        k.blocked_since = blocked_since.map(s);
        k.last_ack = Some(s(last_ack));
        k.acks = 3;
        Observation::Sock { at: s(at), change, sample: k }
    }

    #[test]
    fn a_zero_window_block_with_no_send_seen_stalls_at_the_timeout_and_recovers_when_the_peer_reads() {
        let mut t = table(3.0);
        // The window closed at 0.9 (the last ACK); the block is seen at the
        // next probe reply, 1.0; replies at the sender's backoff bring nothing.
        t.apply(zero_window(1, 1.0, SockChange::Blocked, Some(1.0), 0.9));
        for at in [1.4, 2.2, 3.8] {
            t.apply(zero_window(1, at, SockChange::Poll, Some(1.0), 0.9));
        }
        assert!(run(&mut t, 1.0, 3.8).is_empty());
        let ev = run(&mut t, 4.0, 6.0);
        assert_eq!(names(&ev), ["socket_stalled"]);
        let Event::SocketStalled(info) = &ev[0].event else { unreachable!() };
        assert_eq!((info.blocked_ms, info.peer_window), (3000, 0));
        // The peer reads: the window opens, snd_una moves, the buffer drains
        // below what wakes the writer (Unblocked).
        let mut k = sample(1);
        k.peer_window = 65_536;
        k.last_ack = Some(s(6.1));
        t.apply(Observation::Sock { at: s(6.1), change: SockChange::Unblocked, sample: k });
        assert_eq!(names(&run(&mut t, 6.2, 12.0)), ["socket_recovered"]);
    }

    #[test]
    fn a_slow_reader_seen_through_zero_windows_is_never_stalled() {
        let mut t = table(3.0);
        let mut events = Vec::new();
        // Every 2 s the reader takes a little: the window opens (progress,
        // unblocked), the writer fills it, it closes again (blocked).
        for round in 0..30 {
            let t0 = round as f64 * 2.0;
            t.apply(zero_window(1, t0, SockChange::Blocked, Some(t0), t0));
            events.extend(run(&mut t, t0, t0 + 1.8));
            let mut k = sample(1);
            k.peer_window = 4096;
            k.last_ack = Some(s(t0 + 1.9));
            t.apply(Observation::Sock { at: s(t0 + 1.9), change: SockChange::Unblocked, sample: k });
        }
        assert!(events.is_empty(), "{:?}", names(&events));
    }

    #[test]
    fn closing_a_stalled_socket_is_reported_and_forgotten_but_a_healthy_close_is_silent() {
        let mut t = table(2.0);
        t.apply(blocked(1, 0.0));
        t.apply(Observation::Sock { at: s(0.0), change: SockChange::Poll, sample: sample(2) });
        assert_eq!(names(&run(&mut t, 0.0, 2.0)), ["socket_stalled"]);
        for c in [1, 2] {
            let mut k = sample(c);
            k.state = 7;
            t.apply(Observation::Sock { at: s(5.0), change: SockChange::Destroyed, sample: k });
        }
        let ev = t.tick(s(5.2));
        assert_eq!(names(&ev), ["socket_closed"]);
        assert_eq!(ev[0].at, s(5.0));
        assert!(t.is_empty());
    }

    #[test]
    fn a_blocking_writer_parked_in_send_stalls_without_any_failed_send() {
        let mut t = table(3.0);
        let mut k = sample(9);
        k.last_send = Some(s(1.0));
        t.apply(Observation::Sock { at: s(1.0), change: SockChange::Poll, sample: k });
        let parked = InflightSample { pid: 7, tid: 8, fd: 5, since: s(2.0), cookie: Some(9) };
        t.apply(Observation::Inflight { at: s(2.5), sends: vec![parked] });
        assert!(run(&mut t, 2.5, 4.8).is_empty());
        let ev = run(&mut t, 5.0, 5.0);
        assert_eq!(names(&ev), ["socket_stalled"]);
        let Event::SocketStalled(info) = &ev[0].event else { unreachable!() };
        assert!(info.in_syscall);
        assert_eq!(info.failed_sends, 0);
        // The syscall returns (the peer read at last): recovered.
        t.apply(Observation::Inflight { at: s(6.0), sends: vec![] });
        assert_eq!(names(&t.tick(s(6.0))), ["socket_recovered"]);
    }

    #[test]
    fn an_empty_send_queue_means_not_blocked() {
        // A socket taken as blocked (queued bytes when we attached) whose queue
        // then drained: its writer is idle, not stuck.
        let mut t = table(2.0);
        t.apply(blocked(1, 0.0));
        t.apply(Observation::Diag {
            at: s(0.5),
            sample: DiagSample { cookie: 1, send_q: 0, notsent: 0, ..Default::default() },
        });
        assert!(run(&mut t, 0.6, 10.0).is_empty());
        assert_eq!(t.get(1).unwrap().verdict, Verdict::Ok);
    }

    #[test]
    fn diag_bytes_acked_growth_counts_as_progress() {
        let mut t = table(3.0);
        t.apply(blocked(1, 0.0));
        let d = |at: f64, acked: u64| Observation::Diag {
            at: s(at),
            sample: DiagSample { cookie: 1, bytes_acked: acked, notsent: 1000, send_q: 1000, ..Default::default() },
        };
        t.apply(d(1.0, 100));
        t.apply(d(2.5, 200));
        assert!(run(&mut t, 0.0, 5.4).is_empty());
        assert_eq!(names(&run(&mut t, 5.6, 5.6)), ["socket_stalled"]);
    }

    #[test]
    fn a_socket_whose_destroy_was_lost_is_forgotten_once_the_kernel_has_no_entry() {
        let mut t = table(2.0);
        fn forget(t: &mut SocketTable, at: Mono, kernel: &std::collections::HashSet<u64>) {
            let cookies = t.untracked(at, kernel);
            t.apply(Observation::SocketsGone { at, cookies });
        }
        t.apply(blocked(1, 0.0));
        t.apply(Observation::Sock { at: s(0.0), change: SockChange::Poll, sample: sample(2) });
        assert_eq!(names(&run(&mut t, 0.0, 2.0)), ["socket_stalled"]);
        let kernel: std::collections::HashSet<u64> = [2].into();
        // Too recent: a key walk may have started before the socket was seen.
        forget(&mut t, s(10.0), &kernel);
        assert!(t.tick(s(10.0)).is_empty());
        // Socket 2 is gone from the kernel: forgotten silently (never stalled).
        forget(&mut t, s(31.0), &[1].into());
        assert!(t.tick(s(31.0)).is_empty());
        assert_eq!(t.len(), 1);
        // Socket 1 goes too: a stalled socket's close is reported.
        forget(&mut t, s(40.0), &kernel);
        assert_eq!(names(&t.tick(s(40.0))), ["socket_closed"]);
        assert!(t.is_empty());
    }
}
