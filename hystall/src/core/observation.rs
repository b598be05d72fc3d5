//! What the sources tell the core. Every observation carries its own time.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::time::Mono;

/// One socket's kernel aggregate (a copy of `hystall_common::SockStats` in
/// user-space terms: times as `Option<Mono>`, addresses parsed).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SockSample {
    pub cookie: u64,
    pub pid: u32,
    pub comm: String,
    pub local: Option<SocketAddr>,
    pub remote: Option<SocketAddr>,
    /// Connected by the process (not accepted by one of its listeners).
    pub outbound: bool,
    /// Kernel TCP state number, 0 when unknown.
    pub state: u8,
    pub send_calls: u64,
    pub send_bytes: u64,
    pub send_eagain: u64,
    pub send_errors: u64,
    pub short_sends: u64,
    pub last_send: Option<Mono>,
    pub blocked_since: Option<Mono>,
    pub last_ack: Option<Mono>,
    pub acked_bytes: u64,
    pub acks: u64,
    pub peer_window: u32,
    pub first_seen: Option<Mono>,
}

/// What changed, when a kernel event (not a poll) produced the sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SockChange {
    Blocked,
    Unblocked,
    State {
        old: u8,
        new: u8,
    },
    Window,
    /// The socket is gone (`tcp_destroy_sock`).
    Destroyed,
    /// A periodic read of the kernel map.
    Poll,
}

/// Socket figures from sock_diag (`ss -tni`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiagSample {
    pub cookie: u64,
    pub local: Option<SocketAddr>,
    pub remote: Option<SocketAddr>,
    pub state: u8,
    pub inode: u32,
    /// Send-Q: bytes in the send queue (sent and not acked, plus not sent).
    pub send_q: u32,
    /// Bytes queued and not yet sent (`tcpi_notsent_bytes`).
    pub notsent: u32,
    pub bytes_acked: u64,
    pub backoff: u8,
    pub probes: u8,
    pub snd_wnd: u32,
    /// Microseconds limited by the receiver's window (`tcpi_rwnd_limited`).
    pub rwnd_limited_us: u64,
    pub busy_us: u64,
}

/// A send syscall that has been in flight for a while on a thread of a
/// monitored process (blocking writers).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InflightSample {
    pub pid: u32,
    pub tid: u32,
    pub fd: u64,
    pub since: Mono,
    /// The socket the fd refers to, when it could be resolved.
    pub cookie: Option<u64>,
}

/// A target socket's cumulative send figures at one read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendCount {
    pub cookie: u64,
    /// Bytes its sends moved into it since it was first tracked.
    pub bytes: u64,
    pub last_send: Option<Mono>,
}

/// One byte mark, at the kernel's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ByteMark {
    /// A client's bytes on `flow` counted by `cpu` reached `bytes`.
    Flow { flow: super::flows::FlowId, cpu: u32, at: Mono, bytes: u64 },
    /// Bytes sent into target `cookie` reached `bytes`.
    Send { cookie: u64, at: Mono, bytes: u64 },
}

impl ByteMark {
    pub fn at(&self) -> Mono {
        match self {
            ByteMark::Flow { at, .. } | ByteMark::Send { at, .. } => *at,
        }
    }
}

/// One QUIC stream as the server itself reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStream {
    /// The server's id of the QUIC connection the stream belongs to.
    pub connection: u32,
    pub stream: u64,
    /// `initial`, `hooking`, `connecting`, `estab`, `closed`.
    pub state: String,
    pub req_addr: String,
    pub hooked_req_addr: String,
    pub tx: u64,
    pub rx: u64,
    pub last_active: Mono,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Observation {
    Sock {
        at: Mono,
        change: SockChange,
        sample: SockSample,
    },
    Diag {
        at: Mono,
        sample: DiagSample,
    },
    /// All send syscalls in flight at `at` (replaces the previous set).
    Inflight {
        at: Mono,
        sends: Vec<InflightSample>,
    },
    /// The start of one UDP payload on a server port.
    Header {
        at: Mono,
        sample: super::flows::HeaderSample,
    },
    /// Cumulative counters of every UDP flow on the server's ports.
    FlowCounts {
        at: Mono,
        flows: Vec<(super::flows::FlowId, super::flows::FlowCounters)>,
    },
    /// Cumulative counters of the UDP flows on the server's ports that moved
    /// since the last read (live: the others are unchanged; flows that went
    /// come as `FlowsForgotten`).
    FlowMoves {
        at: Mono,
        flows: Vec<(super::flows::FlowId, super::flows::FlowCounters)>,
    },
    /// The server's own stream table (Hysteria's Traffic Stats API), replacing
    /// the previous one.
    Streams {
        at: Mono,
        streams: Vec<ServerStream>,
    },
    /// Which process serves on which UDP port (replaces the previous map).
    Owners {
        at: Mono,
        ports: Vec<(u16, u32)>,
    },
    /// Sockets the kernel no longer tracks (their close event was lost): closed.
    SocketsGone {
        at: Mono,
        cookies: Vec<u64>,
    },
    /// Flows of closed connections deleted from the kernel's flow map: their
    /// last figures need not be remembered any more.
    FlowsForgotten {
        at: Mono,
        flows: Vec<super::flows::FlowId>,
    },
    /// What decrypted frames show of the connection a flow belongs to
    /// (captures with a key log), replacing the previous figures.
    Frames {
        at: Mono,
        sample: Box<super::frames::FrameSample>,
    },
    // Format 3 (new variants go last: recordings encode the variant's index).
    /// Bytes moved so far into target sockets whose count changed since the
    /// last such read (read with the flow counters, so that the attribution
    /// compares both series at the same instants).
    Sends {
        at: Mono,
        sends: Vec<SendCount>,
    },
    /// Byte marks (`hystall_common::mark`): the moments client bytes of a flow,
    /// or bytes sent into a target, crossed a multiple of `MARK_BYTES`.
    Marks {
        at: Mono,
        marks: Vec<ByteMark>,
    },
    /// The server's table of relayed connections (the Clash API of sing-box
    /// and mihomo), replacing the previous one.
    Relays {
        at: Mono,
        records: Vec<super::attribution::api::RelayRecord>,
    },
    // Format 5.
    /// The watched processes whose configs say they answer each TCP request
    /// once its target is dialled (Hysteria 2), replacing the
    /// previous set (`attribution::reply`).
    Answering {
        at: Mono,
        pids: Vec<u32>,
    },
}

impl Observation {
    pub fn at(&self) -> Mono {
        match self {
            Observation::Sock { at, .. }
            | Observation::Diag { at, .. }
            | Observation::Inflight { at, .. }
            | Observation::Header { at, .. }
            | Observation::FlowCounts { at, .. }
            | Observation::FlowMoves { at, .. }
            | Observation::Owners { at, .. }
            | Observation::Frames { at, .. }
            | Observation::SocketsGone { at, .. }
            | Observation::FlowsForgotten { at, .. }
            | Observation::Sends { at, .. }
            | Observation::Marks { at, .. }
            | Observation::Relays { at, .. }
            | Observation::Answering { at, .. }
            | Observation::Streams { at, .. } => *at,
        }
    }
}
