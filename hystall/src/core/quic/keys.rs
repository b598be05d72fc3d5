//! Connection IDs as grouping keys.
//!
//! The 5-tuple does not identify a QUIC connection: with Hysteria's port
//! hopping the client moves to a new UDP socket every ~30 s, and NAT rebinding
//! does the same. The server-chosen DCID that clients put in every packet
//! survives both, so it is the join key; these helpers say which CIDs of a
//! packet can serve as one.

use std::fmt;

use super::packet::{Header, MAX_CID_LEN, Packet};

/// An owned connection ID of at most 20 bytes, usable as a map key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ConnectionId {
    len: u8,
    /// Bytes past `len` are always zero, so derived `Eq`/`Hash` are right.
    bytes: [u8; MAX_CID_LEN],
}

impl ConnectionId {
    /// Copies `bytes`; `None` if longer than 20 bytes.
    pub fn new(bytes: &[u8]) -> Option<Self> {
        let mut out = [0; MAX_CID_LEN];
        out.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(Self { len: u8::try_from(bytes.len()).ok()?, bytes: out })
    }

    /// The ID's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..usize::from(self.len)).unwrap_or_default()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether the ID is zero-length.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl fmt::Display for ConnectionId {
    /// Lower-case hex, as Wireshark and qlog show CIDs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_bytes().iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for ConnectionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConnectionId({self})")
    }
}

/// The non-empty connection IDs of one packet that can key its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KeyCandidates {
    /// The DCID, if present, non-empty and at most 20 bytes.
    pub dcid: Option<ConnectionId>,
    /// The SCID, under the same conditions.
    pub scid: Option<ConnectionId>,
}

impl KeyCandidates {
    /// The candidates that are present, DCID first.
    pub fn iter(&self) -> impl Iterator<Item = &ConnectionId> {
        self.dcid.iter().chain(self.scid.iter())
    }
}

fn key(cid: Option<&[u8]>) -> Option<ConnectionId> {
    cid.filter(|c| !c.is_empty()).and_then(ConnectionId::new)
}

impl Packet<'_> {
    /// Grouping keys of a packet seen client→server.
    ///
    /// - Long headers: the DCID is the client's random original DCID (first
    ///   Initials, 0-RTT) or the server-chosen CID (Handshake, Initials after
    ///   the server answered); the SCID is the client's own CID, which
    ///   server→client packets carry as their DCID (empty if the client uses
    ///   zero-length CIDs: then match those by the client's address and port).
    /// - Short headers: the DCID, a server-issued CID, if its length was given.
    /// - Version Negotiation (servers only send it): none.
    /// - Unknown versions: the invariant CIDs, when at most 20 bytes.
    pub fn client_to_server_keys(&self) -> KeyCandidates {
        match &self.header {
            Header::VersionNegotiation(_) => KeyCandidates::default(),
            _ => KeyCandidates { dcid: key(self.dcid()), scid: key(self.scid()) },
        }
    }

    /// For a packet seen server→client: the length of the CIDs this server
    /// chooses, i.e. the DCID length clients use in short headers. It is the
    /// SCID length of the server's Initial, Handshake and Retry packets
    /// (quic-go servers: 4). `None` for other packets: a Version Negotiation
    /// SCID only echoes the client's DCID.
    pub fn server_cid_len_hint(&self) -> Option<u8> {
        let scid = match &self.header {
            Header::Long(h) => h.scid,
            Header::Retry(h) => h.scid,
            Header::Short(_) | Header::VersionNegotiation(_) | Header::UnknownVersion(_) => {
                return None;
            }
        };
        u8::try_from(scid.len()).ok().filter(|&len| usize::from(len) <= MAX_CID_LEN)
    }
}
