//! Counters over a whole capture, so a triage report can say what it did not look at.

use std::collections::BTreeMap;
use std::fmt;

/// Why a frame (or, for the `Fragment*` reasons, a fragmented datagram) yielded nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SkipReason {
    /// The file ends inside a record: a capture cut by a full disk or a killed tcpdump.
    TruncatedAtEof,
    /// A pcapng block whose framing was sound but whose body did not parse.
    MalformedBlock,
    /// A pcapng packet naming an interface no Interface Description Block declared.
    UnknownInterface,
    /// A pcapng interface with an `if_tsresol` that cannot be represented.
    BadTimeResolution,
    /// A Decryption Secrets Block that is not a TLS key log (WireGuard, ...).
    OtherSecrets,
    /// A link type this reader does not decode (the pcap LINKTYPE_ number).
    LinkType(u32),
    /// The link layer carries something other than IPv4/IPv6 (ARP, LLDP, ...).
    NotIp,
    TruncatedLinkHeader,
    TruncatedIpHeader,
    MalformedIpHeader,
    /// IPv6 jumbograms, ESP, "no next header": nothing this reader can look into.
    UnsupportedIpv6,
    Icmp,
    /// Any other transport protocol (the IP protocol number).
    Protocol(u8),
    TruncatedUdpHeader,
    MalformedUdpHeader,
    TruncatedTcpHeader,
    MalformedTcpHeader,
    /// A fragment the capture's snaplen cut, so its datagram cannot be rebuilt.
    FragmentTruncated,
    /// A fragment that is empty or reaches past 64 KiB.
    FragmentMalformed,
    /// Fragments overlapping with different bytes: the datagram is dropped.
    FragmentOverlap,
    /// Fragments disagreeing on the datagram's end: the datagram is dropped.
    FragmentInconsistent,
    /// A datagram still incomplete after the timeout (in capture time).
    FragmentTimeout,
    /// A datagram dropped to make room when too many were pending.
    FragmentEvicted,
    /// A datagram still incomplete at the end of the file.
    FragmentIncompleteAtEof,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            SkipReason::TruncatedAtEof => "truncated at end of file",
            SkipReason::MalformedBlock => "malformed pcapng block",
            SkipReason::UnknownInterface => "packet on an undeclared pcapng interface",
            SkipReason::BadTimeResolution => "interface with an invalid if_tsresol",
            SkipReason::OtherSecrets => "decryption secrets other than a TLS key log",
            SkipReason::LinkType(t) => return write!(f, "unsupported link type {t}"),
            SkipReason::NotIp => "not IPv4/IPv6",
            SkipReason::TruncatedLinkHeader => "truncated link-layer header",
            SkipReason::TruncatedIpHeader => "truncated IP header",
            SkipReason::MalformedIpHeader => "malformed IP header",
            SkipReason::UnsupportedIpv6 => "IPv6 jumbogram, ESP or no next header",
            SkipReason::Icmp => "ICMP",
            SkipReason::Protocol(p) => return write!(f, "IP protocol {p}"),
            SkipReason::TruncatedUdpHeader => "truncated UDP header",
            SkipReason::MalformedUdpHeader => "malformed UDP header",
            SkipReason::TruncatedTcpHeader => "truncated TCP header",
            SkipReason::MalformedTcpHeader => "malformed TCP header",
            SkipReason::FragmentTruncated => "IP fragment cut by the snaplen",
            SkipReason::FragmentMalformed => "malformed IP fragment",
            SkipReason::FragmentOverlap => "IP datagram dropped: overlapping fragments",
            SkipReason::FragmentInconsistent => "IP datagram dropped: inconsistent fragments",
            SkipReason::FragmentTimeout => "IP datagram dropped: fragments timed out",
            SkipReason::FragmentEvicted => "IP datagram dropped: too many pending",
            SkipReason::FragmentIncompleteAtEof => "IP datagram incomplete at end of file",
        };
        f.write_str(s)
    }
}

/// Counters for one capture file, final once the reader has returned `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Packet records (frames) read from the file.
    pub packets: u64,
    /// UDP datagrams yielded.
    pub udp: u64,
    /// Of those, datagrams whose payload the snaplen cut.
    pub udp_truncated: u64,
    /// TCP segments yielded.
    pub tcp: u64,
    /// TLS key logs yielded.
    pub key_logs: u64,
    /// IP fragments seen (each one a frame).
    pub fragments: u64,
    /// Datagrams rebuilt from fragments.
    pub fragments_reassembled: u64,
    /// What yielded nothing, and why: frames, or datagrams for the `Fragment*` reasons.
    pub skipped: BTreeMap<SkipReason, u64>,
}

impl Stats {
    pub(super) fn skip(&mut self, reason: SkipReason) {
        *self.skipped.entry(reason).or_default() += 1;
    }

    /// All skips, whatever the reason.
    pub fn skipped_total(&self) -> u64 {
        self.skipped.values().sum()
    }
}
