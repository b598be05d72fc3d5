//! Events: what `watch` prints and every other sink consumes. JSON field names
//! are a stable interface (docs/EVENTS.md): add fields, rename nothing.

use serde::Serialize;

use super::time::Mono;

/// Version of the JSON lines (`"v"`). Bumped only on incompatible changes.
pub const SCHEMA_VERSION: u32 = 1;

/// An event and the time it happened.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Stamped {
    #[serde(skip)]
    pub at: Mono,
    #[serde(flatten)]
    pub event: Event,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// First line of a run: what is watched and which probes are attached.
    WatchStarted(StartInfo),
    /// A target socket's sends made no progress for the stall timeout.
    SocketStalled(SocketInfo),
    /// A stalled socket moved again.
    SocketRecovered(SocketInfo),
    /// A socket that had stalled is gone.
    SocketClosed(SocketInfo),
    /// A QUIC connection was seen for the first time.
    QuicConnOpened(ConnInfo),
    /// A QUIC connection went idle (no packet either way for the idle timeout).
    QuicConnClosed(ConnInfo),
    /// A QUIC connection is alive but starved of client stream data, held by
    /// stalled targets (emitted again when the confidence rises).
    QuicStarved(StarvedInfo),
    /// A starved connection is not any more (`reason` says why).
    QuicRecovered(StarvedInfo),
    /// `--enforce`: what was done (or, with --dry-run, would have been done) to
    /// a stalled target socket, and the evidence.
    Enforced(EnforcedInfo),
    /// The QUIC server ports watched changed (a server found, started, moved
    /// or gone): the ports, the candidates, and why.
    QuicPortsChanged(QuicPortsInfo),
    /// `--decrypt`: the processes whose TLS secrets are read changed.
    DecryptChanged(DecryptInfo),
}

impl Event {
    /// Every event name `name()` returns (metrics list each one, even at zero).
    pub const NAMES: &'static [&'static str] = &[
        "watch_started",
        "socket_stalled",
        "socket_recovered",
        "socket_closed",
        "quic_conn_opened",
        "quic_conn_closed",
        "quic_starved",
        "quic_recovered",
        "enforced",
        "quic_ports_changed",
        "decrypt_changed",
    ];

    pub fn name(&self) -> &'static str {
        match self {
            Event::WatchStarted(_) => "watch_started",
            Event::SocketStalled(_) => "socket_stalled",
            Event::SocketRecovered(_) => "socket_recovered",
            Event::SocketClosed(_) => "socket_closed",
            Event::QuicConnOpened(_) => "quic_conn_opened",
            Event::QuicConnClosed(_) => "quic_conn_closed",
            Event::QuicStarved(_) => "quic_starved",
            Event::QuicRecovered(_) => "quic_recovered",
            Event::Enforced(_) => "enforced",
            Event::QuicPortsChanged(_) => "quic_ports_changed",
            Event::DecryptChanged(_) => "decrypt_changed",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StartInfo {
    /// Processes watched; empty with `all_processes`.
    pub pids: Vec<u32>,
    pub comms: Vec<String>,
    /// `--cgroup`/`--unit`, as cgroup v2 paths.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cgroups: Vec<String>,
    /// No selection was given and no known proxy was found: every process.
    pub all_processes: bool,
    pub stall_timeout_ms: u64,
    pub probes: Vec<ProbeStatus>,
    /// How writers parked inside a send syscall are found (live runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked_writers: Option<String>,
    /// How blocked writers of non-blocking sockets are seen on this kernel
    /// (live runs): `tracepoint`, `fexit` or `zero_window`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub send_path: Option<SendPathInfo>,
    /// The QUIC server ports watched at the start (live runs; absent offline).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quic: Option<QuicPortsInfo>,
    /// What the user should know about this run (no process selected yet,
    /// another hystall attached, ...), one line each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// `--decrypt`: whose secrets are read (absent without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decrypt: Option<DecryptInfo>,
}

/// The probe path that sees blocked writers (`watch_started.send_path`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SendPathInfo {
    /// `tracepoint`, `fexit`, `zero_window`, or `none`.
    pub path: String,
    /// What it is, in one line.
    pub note: String,
}

/// What `--decrypt` reads: in `watch_started`, `decrypt_changed` and `top`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DecryptInfo {
    /// The watched processes and the key-log functions probed in each.
    pub processes: Vec<DecryptProc>,
    /// Where secrets are written (only with `--keylog-out`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keylog_out: Option<String>,
    /// Handshakes whose secrets were read so far.
    pub handshakes: u64,
    /// Connections whose handshake is known from their Initial (their
    /// secrets are looked up, not tried, and dropped when they close).
    pub tied: usize,
    /// Connections whose packets are read now.
    pub selected: usize,
    /// Set when nothing can be decrypted: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl DecryptInfo {
    /// One line: the processes probed, or the note.
    pub fn summary(&self) -> String {
        let probed: Vec<String> = self
            .processes
            .iter()
            .filter(|p| !p.functions.is_empty())
            .map(|p| format!("pid {} ({})", p.pid, p.binary))
            .collect();
        match (&self.note, probed.is_empty()) {
            (Some(n), true) => n.clone(),
            _ => format!("reading TLS secrets of {}", probed.join(", ")),
        }
    }
}

/// One watched process under `--decrypt`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DecryptProc {
    pub pid: u32,
    pub binary: String,
    /// Functions the uprobe is attached to (empty: not probed, see `note`).
    pub functions: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub go_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The QUIC server ports watched now, and, when there is none, why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QuicPortsInfo {
    pub ports: Vec<QuicPortInfo>,
    /// Unconnected UDP ports of the watched processes not yet shown to serve
    /// QUIC (promoted when one receives a client's Initial).
    pub candidates: Vec<u16>,
    /// Set when no QUIC server port is watched: why, and what to do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// What changed ("start" in `watch_started`).
    pub reason: String,
}

impl QuicPortsInfo {
    /// One line: the ports and why, or the note.
    pub fn summary(&self) -> String {
        if let Some(n) = &self.note {
            return n.clone();
        }
        let ports: Vec<String> = self
            .ports
            .iter()
            .map(|p| match p.pid {
                Some(pid) => format!("{} (pid {pid}: {})", p.port, p.why),
                None => format!("{} ({})", p.port, p.why),
            })
            .collect();
        let mut s = format!("QUIC server ports: {}", ports.join(", "));
        if !self.candidates.is_empty() {
            s.push_str(&format!("; {} other UDP port(s) not shown to serve QUIC", self.candidates.len()));
        }
        s
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QuicPortInfo {
    /// A port, or a `LO-HI` range of `--port`.
    pub port: String,
    /// The process serving on it, when known.
    pub pid: Option<u32>,
    /// Why it is taken for a QUIC server port.
    pub why: String,
}

impl StartInfo {
    /// A run played from a file (a capture, or a recording of these selections):
    /// no probes; every process unless the recording says which.
    pub fn offline(stall_timeout_ms: u64, pids: Vec<u32>, comms: Vec<String>, cgroups: Vec<String>) -> StartInfo {
        let all_processes = pids.is_empty() && comms.is_empty() && cgroups.is_empty();
        StartInfo {
            pids,
            comms,
            cgroups,
            all_processes,
            stall_timeout_ms,
            probes: Vec::new(),
            blocked_writers: None,
            send_path: None,
            quic: None,
            warnings: Vec::new(),
            decrypt: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProbeStatus {
    pub name: String,
    pub attached: bool,
    /// Why not, or what it degrades to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A socket as events describe it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SocketInfo {
    pub pid: u32,
    pub comm: String,
    pub cookie: u64,
    /// `ip:port`, null when unknown.
    pub local: Option<String>,
    pub remote: Option<String>,
    pub state: &'static str,
    pub verdict: &'static str,
    /// Connected by the process (a target), not accepted by its listener.
    pub outbound: bool,
    /// How long the writer has been (or was) blocked on this socket.
    pub blocked_ms: u64,
    /// How long nothing has moved while blocked.
    pub no_progress_ms: u64,
    /// Bytes queued in the socket and not yet sent (sock_diag), null if unknown.
    pub unsent_bytes: Option<u32>,
    /// Send-Q (unacked + unsent), null if unknown.
    pub send_q: Option<u32>,
    /// The peer's advertised receive window at its last ACK.
    pub peer_window: u32,
    /// Sends that would have blocked (EAGAIN) plus other failed sends.
    pub failed_sends: u64,
    pub send_bytes: u64,
    pub acked_bytes: u64,
    /// The writer is parked inside a send syscall (blocking socket).
    pub in_syscall: bool,
}

/// A QUIC connection as events describe it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ConnInfo {
    /// hystall's id for the connection (stable for its lifetime).
    pub conn: u64,
    /// The client's current address (`ip:port`).
    pub client: Option<String>,
    /// The server endpoint the client currently talks to.
    pub server: Option<String>,
    /// Server-chosen connection ID (hex) the client puts in short headers.
    pub dcid: Option<String>,
    /// How packets were tied together: `dcid`, `obfuscated` (5-tuple), `five_tuple`.
    pub grouping: &'static str,
    /// The header is unreadable (e.g. Salamander): grouped by 5-tuple.
    pub obfuscated: bool,
    /// Client 5-tuples after the first (port hops, NAT rebinds).
    pub hops: usize,
    pub server_ports: Vec<u16>,
    pub c2s_packets: u64,
    pub c2s_bytes: u64,
    pub s2c_packets: u64,
    pub s2c_bytes: u64,
    /// Why it closed (`idle`), for `quic_conn_closed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
}

/// An enforcement action on one socket.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EnforcedInfo {
    /// `destroy` or `refuse`.
    pub action: &'static str,
    pub dry_run: bool,
    /// `destroyed`, `shut down (pidfd)`, `dry-run`, `gone already`, or why not.
    pub result: String,
    /// The socket and the evidence (blocked_ms, unsent_bytes, peer_window, ...).
    #[serde(flatten)]
    pub socket: SocketInfo,
}

/// A starved connection as `quic_starved` / `quic_recovered` describe it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StarvedInfo {
    pub conn: u64,
    pub client: Option<String>,
    pub server: Option<String>,
    pub dcid: Option<String>,
    pub obfuscated: bool,
    /// The server process (owner of the server port), when known.
    pub pid: Option<u32>,
    pub comm: String,
    /// How long client stream data has been stopped (since its last bulk).
    pub since_ms: u64,
    /// `suspected`, `likely` or `confirmed` (see docs/DETECTOR.md).
    pub confidence: &'static str,
    /// Cookies of the stalled target sockets attributed to this connection.
    pub stalled: Vec<u64>,
    pub evidence: StarvedEvidence,
    /// `quic_recovered` only: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
}

/// The figures a starvation verdict rests on.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StarvedEvidence {
    /// No full-size client packets (bulk stream data) for this long.
    pub client_bulk_quiet_ms: u64,
    /// Client packets per second that are not full-size (ACKs, datagrams, pings).
    pub client_small_pps: f64,
    /// Server packets per second.
    pub server_pps: f64,
    pub stalled_targets: usize,
    /// Stalled streams it takes to exhaust the connection window.
    pub streams_to_exhaust: usize,
    pub stream_window: u64,
    pub conn_window: u64,
    /// Bytes queued unsent in the attributed targets.
    pub unsent_bytes: u64,
    /// Stalled targets of the server that may be this connection's but that
    /// no evidence ties to it (counted for no connection).
    pub unattributed_targets: usize,
    /// Stalled targets it holds at least `at_least` of whatever the split,
    /// when no evidence says which are its (clients that started together):
    /// shared with `with_conns`, never listed as its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_targets: Option<SharedTargets>,
    /// The server's own stream table (`--hysteria-api`), when available.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_streams: Option<super::detector::ApiEvidence>,
    /// What the decrypted QUIC frames show (captures with a key log).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frames: Option<super::frames::FrameEvidence>,
    pub targets: Vec<StarvedTarget>,
}

/// Stalled targets a connection shares with others (`shared_targets`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SharedTargets {
    /// It holds at least this many of them.
    pub at_least: usize,
    /// Cookies of the stalled targets it may hold.
    pub targets: Vec<u64>,
    /// The other connections they may be.
    pub with_conns: Vec<u64>,
}

/// One stalled target and how strongly it is tied to the connection.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StarvedTarget {
    pub cookie: u64,
    pub local: Option<String>,
    pub remote: Option<String>,
    /// How well the target's bytes follow this connection's (correlation;
    /// 1.0 for exact links).
    pub strength: f64,
    /// What ties it to the connection: `api`, `connect`, `reply`, `bytes`, `only`.
    pub evidence: Vec<&'static str>,
    pub no_progress_ms: u64,
    pub unsent_bytes: Option<u32>,
}

/// Kernel TCP state names, as `ss` prints them.
pub fn tcp_state_name(state: u8) -> &'static str {
    match state {
        1 => "ESTABLISHED",
        2 => "SYN_SENT",
        3 => "SYN_RECV",
        4 => "FIN_WAIT1",
        5 => "FIN_WAIT2",
        6 => "TIME_WAIT",
        7 => "CLOSE",
        8 => "CLOSE_WAIT",
        9 => "LAST_ACK",
        10 => "LISTEN",
        11 => "CLOSING",
        12 => "NEW_SYN_RECV",
        _ => "UNKNOWN",
    }
}
