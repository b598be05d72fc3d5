//! What the reader yields: packets (UDP datagrams, TCP segment summaries) and TLS key logs,
//! in file order.

use std::fmt;
use std::net::SocketAddr;

/// One item of a capture, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A UDP datagram or a TCP segment (after IP reassembly, at its last fragment).
    Packet(Packet),
    /// The text of a pcapng Decryption Secrets Block of type TLS key log
    /// (NSS key log lines), so QUIC payloads can be decrypted later.
    KeyLog(String),
}

/// A transport-layer packet with its capture time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// Capture time in nanoseconds since the Unix epoch (0 when the file has none, as in a
    /// pcapng Simple Packet Block before any timestamped packet).
    pub ts: u64,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub l4: L4,
}

/// The transport layer of a [`Packet`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum L4 {
    Udp {
        /// The captured payload: shorter than `orig_len` when the capture's snaplen cut it.
        payload: Vec<u8>,
        /// True when the capture holds less than the datagram carried.
        truncated: bool,
        /// The payload length the UDP header declares, so sizes are right in a
        /// snaplen-limited capture.
        orig_len: usize,
    },
    /// A TCP segment: what flow-control triage needs, not the bytes.
    Tcp {
        seq: u32,
        ack: u32,
        flags: TcpFlags,
        /// The raw 16-bit window field, before any window scaling.
        window: u16,
        /// The window-scale option, present in SYN and SYN-ACK segments.
        wscale: Option<u8>,
        /// The MSS option, present in SYN and SYN-ACK segments.
        mss: Option<u16>,
        /// Payload bytes the IP header declares (right even when the capture cut them).
        payload_len: usize,
    },
}

/// TCP header flags (the low 8 bits of the flags field).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TcpFlags(pub u8);

impl TcpFlags {
    pub const FIN: TcpFlags = TcpFlags(0x01);
    pub const SYN: TcpFlags = TcpFlags(0x02);
    pub const RST: TcpFlags = TcpFlags(0x04);
    pub const PSH: TcpFlags = TcpFlags(0x08);
    pub const ACK: TcpFlags = TcpFlags(0x10);
    pub const URG: TcpFlags = TcpFlags(0x20);
    pub const ECE: TcpFlags = TcpFlags(0x40);
    pub const CWR: TcpFlags = TcpFlags(0x80);

    /// True when every flag of `other` is set here.
    pub fn contains(self, other: TcpFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for TcpFlags {
    type Output = TcpFlags;
    fn bitor(self, rhs: TcpFlags) -> TcpFlags {
        TcpFlags(self.0 | rhs.0)
    }
}

impl fmt::Debug for TcpFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [(TcpFlags, &str); 8] = [
            (TcpFlags::FIN, "FIN"),
            (TcpFlags::SYN, "SYN"),
            (TcpFlags::RST, "RST"),
            (TcpFlags::PSH, "PSH"),
            (TcpFlags::ACK, "ACK"),
            (TcpFlags::URG, "URG"),
            (TcpFlags::ECE, "ECE"),
            (TcpFlags::CWR, "CWR"),
        ];
        let set: Vec<&str> = NAMES.iter().filter(|(fl, _)| self.contains(*fl)).map(|(_, n)| *n).collect();
        write!(f, "[{}]", set.join("|"))
    }
}
