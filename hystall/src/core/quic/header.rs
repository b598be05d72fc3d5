//! The decoder: UDP payload in, visible packet headers (`packet.rs`) out.
//!
//! Every read goes through a bounds-checked cursor that names the field it
//! reads, so a short or inconsistent input becomes a precise [`DecodeError`],
//! never a panic.

use super::error::{CidField, DecodeError};
use super::packet::{
    FIXED_BIT, FORM_BIT, Header, LongHeader, LongKind, LongType, MAX_CID_LEN, MIN_PROTECTED_LEN, Packet,
    RETRY_INTEGRITY_TAG_LEN, RetryHeader, SPIN_BIT, ShortHeader, Token, UnknownVersionHeader, VERSION_NEGOTIATION,
    Version, VersionNegotiation,
};

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
        Self { short_dcid_len: ShortDcidLen::Known(len), allow_clear_fixed_bit: false }
    }
}

/// Decodes the packet starting at `offset` of a whole UDP payload.
///
/// Offsets in the result are from the start of `datagram`. Never panics.
pub fn decode_packet<'a>(datagram: &'a [u8], offset: usize, opts: &DecodeOptions) -> Result<Packet<'a>, DecodeError> {
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
                return Err(DecodeError::BadVersionList { len: versions_raw.len() });
            }
            Header::VersionNegotiation(VersionNegotiation { first_byte: first, dcid, scid, versions_raw })
        } else {
            Header::UnknownVersion(UnknownVersionHeader { version, first_byte: first, dcid, scid })
        };
        return Ok(Packet { offset, len: rest_len, header });
    };
    let fixed_bit = first & FIXED_BIT != 0;
    let packet_type = match version.long_kind(first) {
        LongKind::Retry => {
            let retry = decode_retry_body(&mut r, version, first, dcid, scid)?;
            return Ok(Packet { offset, len: rest_len, header: Header::Retry(retry) });
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
            Some(Token { offset: token_at, bytes: r.take(token_len, "token")? })
        }
        LongType::ZeroRtt | LongType::Handshake => None,
    };
    let length = r.varint("Length")?;
    let pn_offset = r.pos;
    let available = r.left();
    if length < MIN_PROTECTED_LEN as u64 {
        return Err(DecodeError::TooSmallForHeaderProtection { at: offset, have: length });
    }
    let Some(body_len) = usize::try_from(length).ok().filter(|&l| l <= available) else {
        return Err(DecodeError::BadLength { at: pn_offset, declared: length, available });
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
    let Some((token, tag)) =
        body.len().checked_sub(RETRY_INTEGRITY_TAG_LEN).and_then(|split| body.split_at_checked(split))
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
        token: Token { offset: token_at, bytes: token },
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
                return Err(DecodeError::CidTooLong { which: CidField::ShortDcid, len });
            }
            let dcid = r.take(len, "short-header DCID")?;
            (Some(dcid), Some(r.pos))
        }
        // Without the length, assume the shortest (0) for the size check.
        ShortDcidLen::Unknown => (None, None),
    };
    if r.left() < MIN_PROTECTED_LEN {
        return Err(DecodeError::TooSmallForHeaderProtection { at: offset, have: r.left() as u64 });
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
    Packets { datagram, pos: 0, opts, done: false }
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
            return (!rest.is_empty()).then_some(Err(DecodeError::ZeroPadding { at: self.pos, len: rest.len() }));
        }
        let item = decode_packet(self.datagram, self.pos, &self.opts);
        match &item {
            Ok(packet @ Packet { header: Header::Long(_), .. }) => self.pos = packet.offset.saturating_add(packet.len),
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
        DecodeError::Truncated { what, at: self.pos, need, have: self.left() }
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
        Ok(rest.iter().fold(u64::from(first & 0x3f), |v, &b| (v << 8) | u64::from(b)))
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
