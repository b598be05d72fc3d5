//! Decoder for the visible (unprotected) part of QUIC packet headers.
//!
//! Layouts: RFC 9000 §17 (v1, and draft-29 which shares its wire image),
//! RFC 9369 §3.2 (v2: same layout, long packet types renumbered), RFC 8999
//! (version-independent invariants: what we can still say about unknown
//! versions). Header protection (RFC 9001 §5.4) stays on: the low bits of the
//! first byte and the packet number are masked, so no field here claims them.

use super::error::{CidField, DecodeError};

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

const FORM_BIT: u8 = 0x80;
const FIXED_BIT: u8 = 0x40;
const SPIN_BIT: u8 = 0x20;

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
    const fn long_kind(self, first: u8) -> LongKind {
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
enum LongKind {
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

/// How long the DCID of short-header packets is. It is not on the wire: the
/// server chose it, and the caller learns it from the SCIDs of the server's
/// long-header packets (quic-go servers use 4 bytes), as Wireshark does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ShortDcidLen {
    /// The DCID is this many bytes (at most 20).
    Known(u8),
    /// Not known: short headers are reported without DCID.
    #[default]
    Unknown,
}

/// Caller knowledge the wire does not carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DecodeOptions {
    /// DCID length of short-header packets.
    pub short_dcid_len: ShortDcidLen,
    /// Accept a clear fixed bit on v1/v2/draft-29 and short headers. Only
    /// right when the peers negotiated greasing it (RFC 9287, transport
    /// parameter `grease_quic_bit`); off, a clear bit is
    /// [`DecodeError::FixedBitClear`], the cheapest "not QUIC / obfuscated" signal.
    pub allow_clear_fixed_bit: bool,
}

impl DecodeOptions {
    /// Options for a short-header DCID of `len` bytes.
    pub const fn with_short_dcid_len(len: u8) -> Self {
        Self {
            short_dcid_len: ShortDcidLen::Known(len),
            allow_clear_fixed_bit: false,
        }
    }
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
        self.versions_raw
            .chunks_exact(4)
            .filter_map(|word| word.try_into().ok().map(u32::from_be_bytes))
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

/// Decodes the packet starting at `offset` of a whole UDP payload.
///
/// Offsets in the result are from the start of `datagram`. Never panics.
pub fn decode_packet<'a>(
    datagram: &'a [u8],
    offset: usize,
    opts: &DecodeOptions,
) -> Result<Packet<'a>, DecodeError> {
    let mut r = Reader::at(datagram, offset);
    if datagram.is_empty() {
        return Err(DecodeError::Empty);
    }
    let [first] = r.array("first byte")?;
    if first & FORM_BIT == 0 {
        return decode_short(r, offset, first, opts);
    }
    let version = u32::from_be_bytes(r.array("version")?);
    let known = Version::from_wire(version);
    if known.is_some() && first & FIXED_BIT == 0 && !opts.allow_clear_fixed_bit {
        return Err(DecodeError::FixedBitClear { at: offset });
    }
    let dcid = r.cid(CidField::Dcid, known.is_some())?;
    let scid = r.cid(CidField::Scid, known.is_some())?;
    let rest_len = datagram.len().saturating_sub(offset);
    let Some(version) = known else {
        let header = if version == VERSION_NEGOTIATION {
            let versions_raw = r.rest();
            if !versions_raw.len().is_multiple_of(4) {
                return Err(DecodeError::BadVersionList {
                    len: versions_raw.len(),
                });
            }
            Header::VersionNegotiation(VersionNegotiation {
                first_byte: first,
                dcid,
                scid,
                versions_raw,
            })
        } else {
            Header::UnknownVersion(UnknownVersionHeader {
                version,
                first_byte: first,
                dcid,
                scid,
            })
        };
        return Ok(Packet {
            offset,
            len: rest_len,
            header,
        });
    };
    let fixed_bit = first & FIXED_BIT != 0;
    let packet_type = match version.long_kind(first) {
        LongKind::Retry => {
            let retry = decode_retry_body(&mut r, version, first, dcid, scid)?;
            return Ok(Packet {
                offset,
                len: rest_len,
                header: Header::Retry(retry),
            });
        }
        LongKind::Initial => LongType::Initial,
        LongKind::ZeroRtt => LongType::ZeroRtt,
        LongKind::Handshake => LongType::Handshake,
    };
    let token = match packet_type {
        LongType::Initial => {
            let token_len = r.varint("token length")?;
            let token_at = r.pos;
            // A length past usize::MAX cannot fit either: report it as truncated.
            let token_len = usize::try_from(token_len).unwrap_or(usize::MAX);
            Some(Token {
                offset: token_at,
                bytes: r.take(token_len, "token")?,
            })
        }
        LongType::ZeroRtt | LongType::Handshake => None,
    };
    let length = r.varint("Length")?;
    let pn_offset = r.pos;
    let available = r.left();
    if length < MIN_PROTECTED_LEN as u64 {
        return Err(DecodeError::TooSmallForHeaderProtection {
            at: offset,
            have: length,
        });
    }
    let Some(body_len) = usize::try_from(length).ok().filter(|&l| l <= available) else {
        return Err(DecodeError::BadLength {
            at: pn_offset,
            declared: length,
            available,
        });
    };
    Ok(Packet {
        offset,
        len: pn_offset.saturating_sub(offset).saturating_add(body_len),
        header: Header::Long(LongHeader {
            version,
            packet_type,
            first_byte_protected: first,
            fixed_bit,
            dcid,
            scid,
            token,
            length,
            pn_offset,
        }),
    })
}

/// Everything after a Retry's SCID: token, then the 16-byte tag at the end.
fn decode_retry_body<'a>(
    r: &mut Reader<'a>,
    version: Version,
    first: u8,
    dcid: &'a [u8],
    scid: &'a [u8],
) -> Result<RetryHeader<'a>, DecodeError> {
    let token_at = r.pos;
    let body = r.rest();
    let truncated = DecodeError::Truncated {
        what: "Retry integrity tag",
        at: token_at,
        need: RETRY_INTEGRITY_TAG_LEN,
        have: body.len(),
    };
    let Some((token, tag)) = body
        .len()
        .checked_sub(RETRY_INTEGRITY_TAG_LEN)
        .and_then(|split| body.split_at_checked(split))
    else {
        return Err(truncated);
    };
    let Ok(integrity_tag) = <[u8; RETRY_INTEGRITY_TAG_LEN]>::try_from(tag) else {
        return Err(truncated);
    };
    Ok(RetryHeader {
        version,
        first_byte: first,
        fixed_bit: first & FIXED_BIT != 0,
        dcid,
        scid,
        token: Token {
            offset: token_at,
            bytes: token,
        },
        integrity_tag,
    })
}

/// A short header: everything after the DCID is protected.
fn decode_short<'a>(
    mut r: Reader<'a>,
    offset: usize,
    first: u8,
    opts: &DecodeOptions,
) -> Result<Packet<'a>, DecodeError> {
    if first & FIXED_BIT == 0 && !opts.allow_clear_fixed_bit {
        return Err(DecodeError::FixedBitClear { at: offset });
    }
    let (dcid, pn_offset) = match opts.short_dcid_len {
        ShortDcidLen::Known(len) => {
            let len = usize::from(len);
            if len > MAX_CID_LEN {
                return Err(DecodeError::CidTooLong {
                    which: CidField::ShortDcid,
                    len,
                });
            }
            let dcid = r.take(len, "short-header DCID")?;
            (Some(dcid), Some(r.pos))
        }
        // Without the length, assume the shortest (0) for the size check.
        ShortDcidLen::Unknown => (None, None),
    };
    if r.left() < MIN_PROTECTED_LEN {
        return Err(DecodeError::TooSmallForHeaderProtection {
            at: offset,
            have: r.left() as u64,
        });
    }
    Ok(Packet {
        offset,
        len: r.buf.len().saturating_sub(offset),
        header: Header::Short(ShortHeader {
            first_byte_protected: first,
            fixed_bit: first & FIXED_BIT != 0,
            spin_bit: first & SPIN_BIT != 0,
            dcid,
            pn_offset,
        }),
    })
}

/// The QUIC packets of a UDP payload, in order; see [`packets`].
#[derive(Debug, Clone)]
pub struct Packets<'a> {
    datagram: &'a [u8],
    pos: usize,
    opts: DecodeOptions,
    done: bool,
}

/// Iterates over the coalesced packets of a whole UDP payload (RFC 9000
/// §12.2): long headers with a Length field are followed by the next packet;
/// a short header, Retry, Version Negotiation or unknown version takes the
/// rest. The first error ends the iteration (it is yielded, then `None`).
pub fn packets<'a>(datagram: &'a [u8], opts: DecodeOptions) -> Packets<'a> {
    Packets {
        datagram,
        pos: 0,
        opts,
        done: false,
    }
}

impl<'a> Iterator for Packets<'a> {
    type Item = Result<Packet<'a>, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let rest = self.datagram.get(self.pos..).unwrap_or_default();
        if self.pos > 0 && rest.iter().all(|&b| b == 0) {
            self.done = true;
            return (!rest.is_empty()).then_some(Err(DecodeError::ZeroPadding {
                at: self.pos,
                len: rest.len(),
            }));
        }
        let item = decode_packet(self.datagram, self.pos, &self.opts);
        match &item {
            Ok(
                packet @ Packet {
                    header: Header::Long(_),
                    ..
                },
            ) => self.pos = packet.offset.saturating_add(packet.len),
            _ => self.done = true,
        }
        Some(item)
    }
}

impl std::iter::FusedIterator for Packets<'_> {}

/// A bounds-checked cursor; every read reports what it was reading.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn at(buf: &'a [u8], pos: usize) -> Self {
        Self { buf, pos }
    }

    fn left(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn truncated(&self, what: &'static str, need: usize) -> DecodeError {
        DecodeError::Truncated {
            what,
            at: self.pos,
            need,
            have: self.left(),
        }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let bytes = self
            .pos
            .checked_add(n)
            .and_then(|end| self.buf.get(self.pos..end))
            .ok_or_else(|| self.truncated(what, n))?;
        self.pos += n;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let at = self.pos;
        let bytes = self.take(N, what)?;
        bytes.try_into().map_err(|_| {
            self.pos = at;
            self.truncated(what, N)
        })
    }

    /// The rest of the buffer.
    fn rest(&mut self) -> &'a [u8] {
        let rest = self.buf.get(self.pos..).unwrap_or_default();
        self.pos = self.buf.len();
        rest
    }

    /// A variable-length integer (RFC 9000 §16): the two top bits of the
    /// first byte give its length, 1, 2, 4 or 8 bytes.
    fn varint(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let at = self.pos;
        let [first] = self.array(what)?;
        let len = 1usize << (first >> 6);
        let rest = self.take(len - 1, what).map_err(|_| {
            self.pos = at;
            self.truncated(what, len)
        })?;
        Ok(rest
            .iter()
            .fold(u64::from(first & 0x3f), |v, &b| (v << 8) | u64::from(b)))
    }

    /// A long-header connection ID: a length byte, then that many bytes.
    /// `v1_limit` enforces v1/v2's 20 bytes; the invariants allow 255.
    fn cid(&mut self, which: CidField, v1_limit: bool) -> Result<&'a [u8], DecodeError> {
        let (len_what, what) = match which {
            CidField::Dcid => ("DCID length", "DCID"),
            CidField::Scid | CidField::ShortDcid => ("SCID length", "SCID"),
        };
        let [len] = self.array(len_what)?;
        let len = usize::from(len);
        if v1_limit && len > MAX_CID_LEN {
            return Err(DecodeError::CidTooLong { which, len });
        }
        self.take(len, what)
    }
}
