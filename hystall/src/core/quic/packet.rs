//! The visible parts of QUIC packets, as the decoder in `header.rs` reports them.
//!
//! Layouts: RFC 9000 §17 (v1, and draft-29, which shares its wire image),
//! RFC 9369 §3.2 (v2: same layout, long packet types renumbered), RFC 8999
//! (version-independent invariants: what we can still say about unknown
//! versions). Header protection (RFC 9001 §5.4) stays on: the low bits of the
//! first byte and the packet number are masked, so no field here claims them.

/// QUIC version 1 (RFC 9000).
pub const VERSION_1: u32 = 0x0000_0001;
/// QUIC version 2 (RFC 9369).
pub const VERSION_2: u32 = 0x6b33_43cf;
/// IETF draft-29, still spoken by old clients; same wire image as v1.
pub const VERSION_DRAFT_29: u32 = 0xff00_001d;
/// The version field of a Version Negotiation packet.
pub const VERSION_NEGOTIATION: u32 = 0;
/// Longest connection ID in v1/v2 (RFC 9000 §17.2). The invariants allow 255.
pub const MAX_CID_LEN: usize = 20;
/// Length of a Retry packet's integrity tag (RFC 9001 §5.8).
pub const RETRY_INTEGRITY_TAG_LEN: usize = 16;
/// Fewest bytes a header-protected packet has from its packet-number offset to
/// its end: the sample is 16 bytes taken 4 bytes in (RFC 9001 §5.4.2).
pub const MIN_PROTECTED_LEN: usize = 20;

pub(super) const FORM_BIT: u8 = 0x80;
pub(super) const FIXED_BIT: u8 = 0x40;
pub(super) const SPIN_BIT: u8 = 0x20;

/// A QUIC version whose long-header layout this decoder knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// 0x00000001.
    V1,
    /// 0x6b3343cf.
    V2,
    /// 0xff00001d.
    Draft29,
}

impl Version {
    /// The known version for a wire value, if any.
    pub const fn from_wire(version: u32) -> Option<Self> {
        match version {
            VERSION_1 => Some(Self::V1),
            VERSION_2 => Some(Self::V2),
            VERSION_DRAFT_29 => Some(Self::Draft29),
            _ => None,
        }
    }

    /// The wire value.
    pub const fn wire(self) -> u32 {
        match self {
            Self::V1 => VERSION_1,
            Self::V2 => VERSION_2,
            Self::Draft29 => VERSION_DRAFT_29,
        }
    }

    /// The long packet type for the two type bits (0x30) of a first byte.
    /// v2 renumbers them (RFC 9369 §3.2) so that v1-only middleboxes that
    /// peek into Initials do not ossify on v1's numbering.
    pub(super) const fn long_kind(self, first: u8) -> LongKind {
        let bits = (first >> 4) & 0b11;
        match (self, bits) {
            (Self::V2, 0b01) | (Self::V1 | Self::Draft29, 0b00) => LongKind::Initial,
            (Self::V2, 0b10) | (Self::V1 | Self::Draft29, 0b01) => LongKind::ZeroRtt,
            (Self::V2, 0b11) | (Self::V1 | Self::Draft29, 0b10) => LongKind::Handshake,
            _ => LongKind::Retry,
        }
    }
}

/// Long packet types including Retry, whose layout differs.
#[derive(Clone, Copy)]
pub(super) enum LongKind {
    Initial,
    ZeroRtt,
    Handshake,
    Retry,
}

/// Type of a header-protected long-header packet (Retry has its own header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LongType {
    /// Initial: carries a token; keys derive from the client's first DCID.
    Initial,
    /// 0-RTT: client early data.
    ZeroRtt,
    /// Handshake.
    Handshake,
}

/// Every kind of packet the decoder reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PacketType {
    /// Long header, Initial.
    Initial,
    /// Long header, 0-RTT.
    ZeroRtt,
    /// Long header, Handshake.
    Handshake,
    /// Long header, Retry.
    Retry,
    /// Short header (1-RTT).
    OneRtt,
    /// Version Negotiation (long header, version 0).
    VersionNegotiation,
    /// Long header of a version we do not know: invariants only.
    UnknownVersion,
}

/// An Initial or Retry token, borrowed from the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token<'a> {
    /// Offset of the token's first byte in the datagram.
    pub offset: usize,
    /// The token; its length is the token length.
    pub bytes: &'a [u8],
}

/// Header of an Initial, 0-RTT or Handshake packet, header protection on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LongHeader<'a> {
    /// Version.
    pub version: Version,
    /// Packet type (decoded with the version's numbering).
    pub packet_type: LongType,
    /// First byte as on the wire. Form, fixed and type bits (0xf0) are
    /// readable; the low four bits (reserved bits, packet-number length) are
    /// masked by header protection and mean nothing without keys.
    pub first_byte_protected: u8,
    /// The fixed bit (0x40).
    pub fixed_bit: bool,
    /// Destination Connection ID (0..=20 bytes).
    pub dcid: &'a [u8],
    /// Source Connection ID (0..=20 bytes).
    pub scid: &'a [u8],
    /// The token, for Initial packets only.
    pub token: Option<Token<'a>>,
    /// The Length field: bytes of packet number and payload, both protected.
    pub length: u64,
    /// Offset in the datagram of the (protected) packet number.
    pub pn_offset: usize,
}

/// Header of a Retry packet. Retry has no header protection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RetryHeader<'a> {
    /// Version.
    pub version: Version,
    /// First byte; its low four bits are unused and arbitrary.
    pub first_byte: u8,
    /// The fixed bit (0x40).
    pub fixed_bit: bool,
    /// Destination Connection ID: the client's SCID.
    pub dcid: &'a [u8],
    /// Source Connection ID: the CID the server wants next.
    pub scid: &'a [u8],
    /// Retry token: everything between the SCID and the tag.
    pub token: Token<'a>,
    /// Retry Integrity Tag (RFC 9001 §5.8). Not verified: that needs the
    /// client's original DCID, which the Retry does not carry.
    pub integrity_tag: [u8; RETRY_INTEGRITY_TAG_LEN],
}

/// Header of a short-header (1-RTT) packet, header protection on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShortHeader<'a> {
    /// First byte as on the wire. Form, fixed and spin bits (0xe0) are
    /// readable; the low five bits (reserved bits, key phase, packet-number
    /// length) are masked by header protection and mean nothing without keys.
    pub first_byte_protected: u8,
    /// The fixed bit (0x40).
    pub fixed_bit: bool,
    /// The latency spin bit (0x20), outside header protection (RFC 9000
    /// §17.4). Endpoints may leave it constant or random; it only spins if both
    /// ends implement it.
    pub spin_bit: bool,
    /// Destination Connection ID, if the caller gave its length.
    pub dcid: Option<&'a [u8]>,
    /// Offset of the (protected) packet number, if the DCID length is known.
    pub pn_offset: Option<usize>,
}

/// A Version Negotiation packet (server to client, no protection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VersionNegotiation<'a> {
    /// First byte; the low seven bits are unused and arbitrary.
    pub first_byte: u8,
    /// Destination Connection ID: the client's SCID echoed (0..=255 bytes).
    pub dcid: &'a [u8],
    /// Source Connection ID: the client's DCID echoed (0..=255 bytes).
    pub scid: &'a [u8],
    /// The supported-versions list, raw; see [`Self::versions`].
    pub versions_raw: &'a [u8],
}

impl<'a> VersionNegotiation<'a> {
    /// The versions the server lists as supported.
    pub fn versions(&self) -> impl Iterator<Item = u32> + 'a {
        self.versions_raw.chunks_exact(4).filter_map(|word| word.try_into().ok().map(u32::from_be_bytes))
    }
}

/// A long header of a version we do not know: only the invariants (RFC 8999)
/// hold, and the rest of the datagram is opaque. On a client-to-server flow,
/// almost always Salamander or foreign traffic rather than a new QUIC version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UnknownVersionHeader<'a> {
    /// The version.
    pub version: u32,
    /// First byte; only the form bit has a version-independent meaning.
    pub first_byte: u8,
    /// Destination Connection ID (0..=255 bytes).
    pub dcid: &'a [u8],
    /// Source Connection ID (0..=255 bytes).
    pub scid: &'a [u8],
}

/// The visible header of one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Header<'a> {
    /// Initial, 0-RTT or Handshake.
    Long(LongHeader<'a>),
    /// Retry.
    Retry(RetryHeader<'a>),
    /// Short header (1-RTT).
    Short(ShortHeader<'a>),
    /// Version Negotiation.
    VersionNegotiation(VersionNegotiation<'a>),
    /// Unknown version.
    UnknownVersion(UnknownVersionHeader<'a>),
}

/// One QUIC packet within a UDP payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Packet<'a> {
    /// Offset of the packet's first byte in the datagram.
    pub offset: usize,
    /// Bytes this packet occupies in the datagram. For long headers with a
    /// Length field: header plus Length. Otherwise: the rest of the datagram.
    pub len: usize,
    /// The visible header.
    pub header: Header<'a>,
}

impl<'a> Packet<'a> {
    /// The packet type.
    pub fn packet_type(&self) -> PacketType {
        match &self.header {
            Header::Long(h) => match h.packet_type {
                LongType::Initial => PacketType::Initial,
                LongType::ZeroRtt => PacketType::ZeroRtt,
                LongType::Handshake => PacketType::Handshake,
            },
            Header::Retry(_) => PacketType::Retry,
            Header::Short(_) => PacketType::OneRtt,
            Header::VersionNegotiation(_) => PacketType::VersionNegotiation,
            Header::UnknownVersion(_) => PacketType::UnknownVersion,
        }
    }

    /// The version field; `None` for short headers, which carry none.
    pub fn version(&self) -> Option<u32> {
        match &self.header {
            Header::Long(h) => Some(h.version.wire()),
            Header::Retry(h) => Some(h.version.wire()),
            Header::Short(_) => None,
            Header::VersionNegotiation(_) => Some(VERSION_NEGOTIATION),
            Header::UnknownVersion(h) => Some(h.version),
        }
    }

    /// The Destination Connection ID; `None` for a short header whose DCID
    /// length was not given.
    pub fn dcid(&self) -> Option<&'a [u8]> {
        match &self.header {
            Header::Long(h) => Some(h.dcid),
            Header::Retry(h) => Some(h.dcid),
            Header::Short(h) => h.dcid,
            Header::VersionNegotiation(h) => Some(h.dcid),
            Header::UnknownVersion(h) => Some(h.dcid),
        }
    }

    /// The Source Connection ID; `None` for short headers, which carry none.
    pub fn scid(&self) -> Option<&'a [u8]> {
        match &self.header {
            Header::Long(h) => Some(h.scid),
            Header::Retry(h) => Some(h.scid),
            Header::Short(_) => None,
            Header::VersionNegotiation(h) => Some(h.scid),
            Header::UnknownVersion(h) => Some(h.scid),
        }
    }
}
