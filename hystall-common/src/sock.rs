//! Per-socket aggregates and the events emitted when a socket changes state.

/// Length of a task's `comm`.
pub const COMM_LEN: usize = 16;

/// `SockStats::flags`: the socket was connected by a monitored process
/// (CLOSE → SYN_SENT in its context), so it is one of its outbound targets.
pub const SOCK_OUTBOUND: u32 = 1 << 0;
/// `SockStats::flags`: the 4-tuple in the entry is known.
pub const SOCK_HAS_TUPLE: u32 = 1 << 1;
/// `SockStats::flags`: the peer's receive window was zero at the last ACK.
pub const SOCK_ZERO_WINDOW: u32 = 1 << 2;
/// `SockStats::flags`: the socket's fd was in blocking mode (no
/// `O_NONBLOCK`) when it was first tracked: its writer can park inside a
/// send, where no send probe sees it (user space reads those threads).
pub const SOCK_BLOCKING: u32 = 1 << 3;
/// `O_NONBLOCK` in `file->f_flags` (the same value on x86_64 and arm64).
pub const O_NONBLOCK: u32 = 0o4000;

/// What the kernel keeps per TCP socket of a monitored process, keyed by cookie.
///
/// The kernel only aggregates; verdicts are made in user space.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockStats {
    pub tgid: u32,
    pub flags: u32,
    pub comm: [u8; COMM_LEN],
    pub tuple: Tuple,
    /// Last TCP state seen (`TCP_ESTABLISHED` = 1, ...), 0 when unknown.
    pub state: u32,
    /// errno of the last failed send (positive), 0 when none.
    pub last_errno: i32,
    pub first_seen_ns: u64,
    /// Send calls that reached the socket (`sock_send_length`).
    pub send_calls: u64,
    /// Bytes the sends moved into the socket.
    pub send_bytes: u64,
    /// Sends that failed with EAGAIN/EWOULDBLOCK.
    pub send_eagain: u64,
    /// Sends that failed with another error.
    pub send_errors: u64,
    /// Sends that filled the buffer or moved fewer bytes than asked.
    pub short_sends: u64,
    /// Last send that moved bytes.
    pub last_send_ns: u64,
    /// First failed or short send after the last full send; 0 = not blocked.
    pub blocked_since_ns: u64,
    /// Last time the peer acknowledged new data (snd_una advanced).
    pub last_ack_ns: u64,
    /// Bytes acknowledged by the peer while we watched.
    pub acked_bytes: u64,
    /// ACKs (incoming segments) seen.
    pub acks: u64,
    pub snd_una: u32,
    pub snd_nxt: u32,
    /// Peer's advertised window (bytes, unscaled by the tracepoint already).
    pub snd_wnd: u32,
    pub _pad: u32,
}

/// A TCP 4-tuple as the kernel stores it. Addresses are in network order; IPv4
/// uses the first 4 bytes. Ports are in host order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tuple {
    pub family: u16,
    pub sport: u16,
    pub dport: u16,
    pub _pad: u16,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
}

/// A send syscall in flight on a thread of a monitored process (for blocking
/// writers, which sit inside the syscall while the socket is full).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InflightSend {
    pub tgid: u32,
    pub nr: u32,
    pub fd: u64,
    pub count: u64,
    pub start_ns: u64,
}

/// Kind of [`SockEvent`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SockEventKind {
    /// First failed or short send after progress.
    Blocked = 1,
    /// A full send after being blocked.
    Unblocked = 2,
    /// TCP state change (connect, established, closing...).
    State = 3,
    /// `tcp_destroy_sock`: the socket is gone; `stats` are its final figures.
    Destroyed = 4,
    /// The peer's window closed (0) or opened again.
    Window = 5,
    /// A socket whose fd is in blocking mode was tracked (`SOCK_BLOCKING`):
    /// once per socket, so user space knows which processes can park a
    /// writer inside a send without dumping every TCP socket to find out.
    Blocking = 6,
    /// A process exec'd (`sched_process_exec`, attached only when processes
    /// are selected): `stats.tgid` and `stats.comm` say which, nothing else
    /// is filled in. User space checks it against the selection at once, so
    /// a proxy that starts (or restarts) is watched before it serves.
    Exec = 7,
}

/// Emitted to the ring buffer on state changes only. `stats` is a copy of the
/// socket's aggregate after the change.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SockEvent {
    pub kind: u32,
    /// For `State`: old state << 8 | new state. For `Blocked`: errno or 0 (short).
    pub arg: u32,
    pub ts_ns: u64,
    pub cookie: u64,
    pub stats: SockStats,
}

impl SockEvent {
    pub fn kind(&self) -> Option<SockEventKind> {
        Some(match self.kind {
            1 => SockEventKind::Blocked,
            2 => SockEventKind::Unblocked,
            3 => SockEventKind::State,
            4 => SockEventKind::Destroyed,
            5 => SockEventKind::Window,
            6 => SockEventKind::Blocking,
            7 => SockEventKind::Exec,
            _ => return None,
        })
    }
}

/// Indexes of the per-CPU `COUNTERS` array.
pub mod counter {
    /// Ring buffer full: an event was lost (user space reports it, never hides it).
    pub const EVENTS_LOST: u32 = 0;
    /// Events written to the ring buffer.
    pub const EVENTS_SENT: u32 = 1;
    /// `SOCKS` insert failures.
    pub const MAP_FULL: u32 = 2;
    /// QUIC header samples lost (ring buffer full).
    pub const SAMPLES_LOST: u32 = 3;
    /// UDP packets on the server's ports counted by the TC classifier.
    pub const UDP_PACKETS: u32 = 4;
    /// Packets on watched interfaces that could not be parsed (truncated,
    /// IPv6 extension headers, non-first fragments): counted, not guessed.
    pub const UNPARSED: u32 = 5;
    /// `FLOWS` insert failures.
    pub const FLOWS_FULL: u32 = 6;
    /// Byte marks lost (ring buffer full).
    pub const MARKS_LOST: u32 = 7;
    /// TLS secrets lost (`--decrypt`: ring buffer full).
    pub const SECRETS_LOST: u32 = 8;
    /// Packets of selected connections not passed for decryption (ring full
    /// or the connection's byte budget spent).
    pub const PACKETS_LOST: u32 = 9;
    /// Moved-flow names lost (`MOVED` ring full): user space reads the whole
    /// flow map next instead of only what moved.
    pub const MOVED_LOST: u32 = 10;
    /// Process starts the exec tracepoint did not hand to user space: not of
    /// the selection (`switch::EXEC_FILTER`).
    pub const EXECS_SKIPPED: u32 = 11;
    /// Number of counters.
    pub const LEN: u32 = 12;
}

/// Sizes of the kernel maps (documented in docs/ARCHITECTURE.md).
pub const MAX_SOCKS: u32 = 131_072;
pub const MAX_PIDS: u32 = 1024;
pub const MAX_INFLIGHT: u32 = 16_384;
/// Names and pids the exec filter holds (`EXEC_COMMS`, `EXEC_PIDS`); a
/// selection of more is not filtered in the kernel.
pub const MAX_EXEC_SELECT: u32 = 64;

/// Slots of the `SWITCHES` array, flipped by user space at run time.
pub mod switch {
    /// 1 while the syscall probes are attached (`INFLIGHT` is filled).
    pub const SYSCALLS: u32 = 0;
    /// 1 when no program sees the results of sends (no `sock_send_length`, no
    /// fexit on `tcp_sendmsg`): `tcp_probe` then marks a socket blocked when
    /// its peer's window is zero and its send buffer is full, the state in
    /// which any write of its writer blocks (or fails with EAGAIN).
    pub const ZERO_WINDOW: u32 = 1;
    /// 1 once `EXEC_COMMS` and `EXEC_PIDS` hold the whole selection: only
    /// the execs of those names and pids reach user space (0: every exec,
    /// for a selection the kernel cannot decide, such as a cgroup's).
    pub const EXEC_FILTER: u32 = 2;
    pub const LEN: u32 = 3;
}
pub const EVENTS_RING_BYTES: u32 = 1 << 20;

/// TCP states used by the programs.
pub const TCP_ESTABLISHED: u32 = 1;
pub const TCP_SYN_SENT: u32 = 2;
pub const TCP_CLOSE: u32 = 7;
pub const IPPROTO_TCP: u16 = 6;
pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::SockStats {}
    unsafe impl aya::Pod for super::Tuple {}
    unsafe impl aya::Pod for super::InflightSend {}
    unsafe impl aya::Pod for super::SockEvent {}
}
