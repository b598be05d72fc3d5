//! The container layer: pcap-parser's streaming readers turned into frames, key logs and
//! skips, in file order, with bounded memory.
//!
//! pcap-parser answers "incomplete" both for a block that is still being read and for a
//! block whose body contradicts its own length, and "buffer too small" for any block that
//! does not fit. So before asking it to parse, we frame each block ourselves from its
//! header: a length past [`MAX_BLOCK`] is a fatal error with its byte offset (real
//! packets stay under 256 KiB), a block that runs past the end of the file is the common
//! "capture cut off" case and a counted skip, and a complete block that pcap-parser still
//! rejects is a counted malformed block that we step over by its length.

use std::io::{Chain, Cursor, Read};

use pcap_parser::traits::PcapReaderIterator;
use pcap_parser::{Block, LegacyPcapReader, PcapBlockOwned, PcapError, PcapNGReader, SecretsType};

use super::error::CaptureError;
use super::fill_read::{self, FillRead, IoErrorSlot};
use super::magic::{self, CaptureFormat};
use super::stats::SkipReason;

/// The read buffer we start with: a few typical packets' worth.
const INITIAL_BUFFER: usize = 256 * 1024;
/// The largest block or record we accept. Anything longer is corruption, and refusing
/// it bounds the buffer.
pub(super) const MAX_BLOCK: usize = 16 * 1024 * 1024;
/// Interface Description Blocks kept per section; packets on later ones are skipped.
const MAX_INTERFACES: usize = 4096;
const SHB_TYPE: u32 = 0x0a0d_0d0a;
const BYTE_ORDER_MAGIC: u32 = 0x1a2b_3c4d;
/// The obsolete pcapng Packet Block, which pcap-parser hands over as an unknown block.
const OBSOLETE_PACKET_TYPE: u32 = 0x0000_0002;

/// One captured frame, borrowed from the read buffer.
pub(super) struct Frame<'a> {
    /// Unix nanoseconds.
    pub ts: u64,
    /// The pcap LINKTYPE_ of its interface.
    pub linktype: u32,
    /// The captured bytes (possibly cut by the snaplen).
    pub data: &'a [u8],
}

pub(super) enum Event<'a> {
    Frame(Frame<'a>),
    KeyLog(String),
    Skip(SkipReason),
    /// A block that carries no packet (section and interface headers, statistics, ...).
    Other,
    Eof,
}

type Input<R> = FillRead<Chain<Cursor<Vec<u8>>, R>>;

enum Inner<R: Read> {
    Legacy(LegacyPcapReader<Input<R>>),
    Ng(PcapNGReader<Input<R>>),
}

fn iter<R: Read>(inner: &mut Inner<R>) -> &mut dyn PcapReaderIterator {
    match inner {
        Inner::Legacy(r) => r,
        Inner::Ng(r) => r,
    }
}

struct Iface {
    linktype: u32,
    /// Timestamp units per second, `None` for an unrepresentable `if_tsresol`.
    units: Option<u64>,
    offset_s: i64,
    snaplen: u32,
}

/// What a block's header says about it, before parsing.
enum Peek {
    /// This many bytes are needed to read the header.
    NeedHeader(usize),
    Block {
        len: usize,
        section_header: bool,
    },
}

enum Fill {
    Ready { len: usize, section_header: bool },
    Eof,
    Truncated,
}

/// Everything needed to frame and convert blocks, apart from the reader itself.
struct State {
    format: CaptureFormat,
    /// Legacy pcap: the record header length (16, or 24 in the "modified" format).
    record_header: usize,
    legacy_linktype: u32,
    /// The byte order of the legacy file, or of the current pcapng section.
    big_endian: bool,
    ifaces: Vec<Iface>,
    /// The last timestamp seen, for Simple Packet Blocks, which carry none.
    last_ts: u64,
}

pub(super) struct Container<R: Read> {
    inner: Inner<R>,
    state: State,
    io_error: IoErrorSlot,
    /// Bytes of the block handed out last, consumed at the next call (the frame borrows them).
    pending: usize,
    finished: bool,
}

impl<R: Read> Container<R> {
    /// Reads the file header and sets up the streaming reader.
    pub(super) fn open(mut input: R) -> Result<Self, CaptureError> {
        let mut prefix = vec![0u8; magic::SHB_MIN_LEN];
        let got = read_up_to(&mut input, &mut prefix).map_err(|source| CaptureError::Io { offset: 0, source })?;
        prefix.truncate(got);
        let format = magic::detect(&prefix)?;
        let mut state =
            State { format, record_header: 16, legacy_linktype: 0, big_endian: false, ifaces: Vec::new(), last_ts: 0 };
        // Frame the first section header like any block, so a giant one is an error and a
        // long one gets a buffer that fits it.
        let shb_len = match format {
            CaptureFormat::PcapNg => match peek(&state, &prefix, 0)? {
                Peek::Block { len, .. } => len,
                Peek::NeedHeader(_) => 0,
            },
            CaptureFormat::Pcap { .. } => 0,
        };
        let (fill, io_error) = FillRead::new(Cursor::new(prefix).chain(input));
        let inner = match format {
            CaptureFormat::Pcap { big_endian, .. } => {
                let mut r = LegacyPcapReader::new(INITIAL_BUFFER, fill).map_err(|e| header_error(&e, &io_error))?;
                let (len, header) = match r.next() {
                    Ok((len, PcapBlockOwned::LegacyHeader(h))) => (len, h),
                    Ok(_) => return Err(CaptureError::BadSectionHeader { offset: 0 }),
                    Err(e) => return Err(header_error(&e, &io_error)),
                };
                // The low 16 bits are the link type; the high bits may carry an FCS length.
                state.legacy_linktype = (header.network.0 as u32) & 0xffff;
                state.record_header = if header.is_modified_format() { 24 } else { 16 };
                state.big_endian = big_endian;
                r.consume(len);
                Inner::Legacy(r)
            }
            CaptureFormat::PcapNg => {
                let capacity = INITIAL_BUFFER.max(shb_len.next_power_of_two());
                Inner::Ng(PcapNGReader::new(capacity, fill).map_err(|e| match e {
                    PcapError::Incomplete(_) => CaptureError::TruncatedSectionHeader { need: shb_len },
                    e => header_error(&e, &io_error),
                })?)
            }
        };
        Ok(Container { inner, state, io_error, pending: 0, finished: false })
    }

    pub(super) fn format(&self) -> CaptureFormat {
        self.state.format
    }

    /// The next block's meaning. After `Eof` (or a fatal error) it keeps returning `Eof`.
    pub(super) fn next_event(&mut self) -> Result<Event<'_>, CaptureError> {
        if self.finished {
            return Ok(Event::Eof);
        }
        if self.pending > 0 {
            iter(&mut self.inner).consume(self.pending);
            self.pending = 0;
        }
        let offset = iter(&mut self.inner).consumed() as u64;
        let (len, section_header) = match self.fill_block() {
            Ok(Fill::Ready { len, section_header }) => (len, section_header),
            Ok(Fill::Eof) => {
                self.finished = true;
                return Ok(Event::Eof);
            }
            Ok(Fill::Truncated) => {
                self.finished = true;
                return Ok(Event::Skip(SkipReason::TruncatedAtEof));
            }
            Err(e) => {
                self.finished = true;
                return Err(e);
            }
        };
        self.pending = len;
        match iter(&mut self.inner).next() {
            Ok((_, block)) => Ok(convert(block, &mut self.state)),
            Err(_) if section_header => {
                self.finished = true;
                Err(CaptureError::BadSectionHeader { offset })
            }
            Err(_) => Ok(Event::Skip(SkipReason::MalformedBlock)),
        }
    }

    /// Reads until the next block is whole in the buffer, growing it as needed up to
    /// [`MAX_BLOCK`].
    fn fill_block(&mut self) -> Result<Fill, CaptureError> {
        loop {
            let it = iter(&mut self.inner);
            let avail = it.data().len();
            let offset = it.consumed() as u64;
            let need = match peek(&self.state, it.data(), offset)? {
                Peek::Block { len, section_header } if avail >= len => {
                    return Ok(Fill::Ready { len, section_header });
                }
                Peek::Block { len, .. } => len,
                Peek::NeedHeader(n) => n,
            };
            if it.reader_exhausted() {
                return Ok(if avail == 0 { Fill::Eof } else { Fill::Truncated });
            }
            // `grow` is a no-op when the buffer is already big enough.
            it.grow(need.next_power_of_two().max(need));
            if it.refill().is_err() {
                let source = fill_read::take_error(&self.io_error);
                return Err(CaptureError::Io { offset: offset + avail as u64, source });
            }
        }
    }
}

/// Frames the block at the start of `data` from its header alone.
fn peek(st: &State, data: &[u8], offset: u64) -> Result<Peek, CaptureError> {
    let (len, section_header, what) = match st.format {
        CaptureFormat::Pcap { .. } => {
            let Some(caplen) = data.get(8..12).filter(|_| data.len() >= st.record_header) else {
                return Ok(Peek::NeedHeader(st.record_header));
            };
            let caplen = read_u32(caplen, st.big_endian) as u64;
            (st.record_header as u64 + caplen, false, "pcap record")
        }
        CaptureFormat::PcapNg => {
            let Some(head) = data.get(..8) else {
                return Ok(Peek::NeedHeader(8));
            };
            let is_shb = read_u32(head, false) == SHB_TYPE;
            let big_endian = if is_shb {
                let Some(bom) = data.get(8..12) else {
                    return Ok(Peek::NeedHeader(12));
                };
                match read_u32(bom, false) {
                    BYTE_ORDER_MAGIC => false,
                    b if b.swap_bytes() == BYTE_ORDER_MAGIC => true,
                    bom => return Err(CaptureError::BadByteOrder { offset, bom }),
                }
            } else {
                st.big_endian
            };
            let len = read_u32(head.get(4..).unwrap_or_default(), big_endian) as u64;
            if (len < 12 || !len.is_multiple_of(4)) && len <= MAX_BLOCK as u64 {
                return Err(CaptureError::BadBlockLength { what: "pcapng block", offset, len });
            }
            (len, is_shb, "pcapng block")
        }
    };
    if len > MAX_BLOCK as u64 {
        return Err(CaptureError::GiantBlock { what, offset, len, limit: MAX_BLOCK });
    }
    Ok(Peek::Block { len: len as usize, section_header })
}

fn convert<'a>(block: PcapBlockOwned<'a>, st: &mut State) -> Event<'a> {
    match block {
        PcapBlockOwned::Legacy(b) => {
            let nanos = matches!(st.format, CaptureFormat::Pcap { nanos: true, .. });
            let frac_ns = if nanos { b.ts_usec as u64 } else { b.ts_usec as u64 * 1_000 };
            let ts = b.ts_sec as u64 * 1_000_000_000 + frac_ns;
            st.last_ts = ts;
            Event::Frame(Frame { ts, linktype: st.legacy_linktype, data: b.data })
        }
        PcapBlockOwned::LegacyHeader(_) => Event::Other,
        PcapBlockOwned::NG(b) => convert_ng(b, st),
    }
}

fn convert_ng<'a>(block: Block<'a>, st: &mut State) -> Event<'a> {
    match block {
        Block::SectionHeader(shb) => {
            st.big_endian = shb.big_endian();
            st.ifaces.clear();
            Event::Other
        }
        Block::InterfaceDescription(idb) => {
            if st.ifaces.len() < MAX_INTERFACES {
                st.ifaces.push(Iface {
                    linktype: (idb.linktype.0 as u32) & 0xffff,
                    units: ts_units(idb.if_tsresol),
                    offset_s: idb.if_tsoffset,
                    snaplen: idb.snaplen,
                });
            }
            Event::Other
        }
        Block::EnhancedPacket(epb) => {
            let data = epb.data.get(..epb.caplen as usize).unwrap_or(epb.data);
            packet(st, epb.if_id as usize, Some(((epb.ts_high as u64) << 32) | epb.ts_low as u64), data)
        }
        Block::SimplePacket(spb) => {
            let mut len = (spb.origlen as usize).min(spb.data.len());
            if let Some(iface) = st.ifaces.first().filter(|i| i.snaplen > 0) {
                len = len.min(iface.snaplen as usize);
            }
            packet(st, 0, None, spb.data.get(..len).unwrap_or(spb.data))
        }
        Block::DecryptionSecrets(dsb) if dsb.secrets_type == SecretsType::TlsKeyLog => {
            let text = dsb.data.get(..dsb.secrets_len as usize).unwrap_or(dsb.data);
            Event::KeyLog(String::from_utf8_lossy(text).into_owned())
        }
        Block::DecryptionSecrets(_) => Event::Skip(SkipReason::OtherSecrets),
        Block::Unknown(ub) if native_type(ub.block_type, st.big_endian) == OBSOLETE_PACKET_TYPE => {
            obsolete_packet(st, ub.data)
        }
        _ => Event::Other,
    }
}

/// The obsolete Packet Block: interface id (16 bits), drops count (16 bits), timestamp
/// high and low, captured length, original length, data.
fn obsolete_packet<'a>(st: &mut State, body: &'a [u8]) -> Event<'a> {
    let be = st.big_endian;
    let (Some(if_id), Some(hi), Some(lo), Some(caplen)) =
        (body.get(0..2), body.get(4..8), body.get(8..12), body.get(12..16))
    else {
        return Event::Skip(SkipReason::MalformedBlock);
    };
    let if_id = if be { u16::from_be_bytes([if_id[0], if_id[1]]) } else { u16::from_le_bytes([if_id[0], if_id[1]]) };
    let ts = ((read_u32(hi, be) as u64) << 32) | read_u32(lo, be) as u64;
    let Some(data) = body.get(20..).and_then(|d| d.get(..read_u32(caplen, be) as usize)) else {
        return Event::Skip(SkipReason::MalformedBlock);
    };
    packet(st, if_id as usize, Some(ts), data)
}

/// A pcapng packet on interface `if_id` with raw timestamp `raw_ts` (None: reuse the last).
fn packet<'a>(st: &mut State, if_id: usize, raw_ts: Option<u64>, data: &'a [u8]) -> Event<'a> {
    let Some(iface) = st.ifaces.get(if_id) else {
        return Event::Skip(SkipReason::UnknownInterface);
    };
    let ts = match (raw_ts, iface.units) {
        (None, _) => st.last_ts,
        (Some(raw), Some(units)) => ng_ts(raw, units, iface.offset_s),
        (Some(_), None) => return Event::Skip(SkipReason::BadTimeResolution),
    };
    st.last_ts = ts;
    Event::Frame(Frame { ts, linktype: iface.linktype, data })
}

/// Units per second for an `if_tsresol` value: 10^n, or 2^n when the top bit is set.
fn ts_units(tsresol: u8) -> Option<u64> {
    if tsresol & 0x80 != 0 {
        let exp = u32::from(tsresol & 0x7f);
        (exp <= 63).then(|| 1u64 << exp)
    } else {
        10u64.checked_pow(u32::from(tsresol))
    }
}

/// A pcapng timestamp in `units` per second plus `offset_s` seconds, as Unix nanoseconds
/// (clamped to the u64 range).
fn ng_ts(raw: u64, units: u64, offset_s: i64) -> u64 {
    let units = u128::from(units.max(1));
    let raw = u128::from(raw);
    let secs = (raw / units) as i128 + i128::from(offset_s);
    let frac_ns = ((raw % units) * 1_000_000_000 / units) as i128;
    (secs * 1_000_000_000 + frac_ns).clamp(0, i128::from(u64::MAX)) as u64
}

/// pcap-parser reads unknown block types as little-endian; this gives the section's view.
fn native_type(raw_le: u32, big_endian: bool) -> u32 {
    if big_endian { raw_le.swap_bytes() } else { raw_le }
}

fn read_u32(b: &[u8], big_endian: bool) -> u32 {
    let b: [u8; 4] = b.first_chunk::<4>().copied().unwrap_or_default();
    if big_endian { u32::from_be_bytes(b) } else { u32::from_le_bytes(b) }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_up_to<R: Read>(input: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while let Some(rest) = buf.get_mut(got..).filter(|r| !r.is_empty()) {
        match input.read(rest) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Maps a failure to read the file header (which `magic::detect` already vetted).
fn header_error(e: &PcapError<&[u8]>, io_error: &IoErrorSlot) -> CaptureError {
    match e {
        PcapError::ReadError => CaptureError::Io { offset: 0, source: fill_read::take_error(io_error) },
        PcapError::Incomplete(_) | PcapError::UnexpectedEof | PcapError::Eof => {
            CaptureError::TruncatedHeader { what: "capture file header", got: 0, need: magic::SHB_MIN_LEN }
        }
        _ => CaptureError::BadSectionHeader { offset: 0 },
    }
}
