//! Frames of a decrypted QUIC payload (RFC 9000 §19, RFC 9221 DATAGRAM, and
//! the ACK_FREQUENCY/IMMEDIATE_ACK extension tolerated).
//!
//! This is where offline diagnosis gets its facts: STREAM offsets and
//! lengths, ACKs, DATAGRAMs, and the flow-control frames (MAX_DATA,
//! MAX_STREAM_DATA, DATA_BLOCKED, STREAM_DATA_BLOCKED) that say which side
//! starved which. Frames borrow from the payload. Parsing stops at the first
//! malformed or unknown frame (frame lengths are implicit, so nothing after it
//! can be found) and says where and why.

use thiserror::Error;

use super::varint::{Cursor, Short};

/// Who opened a stream kind, for MAX_STREAMS and STREAMS_BLOCKED.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamDir {
    /// Bidirectional streams.
    Bidi,
    /// Unidirectional streams.
    Uni,
}

/// Which layer closed the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseKind {
    /// 0x1c: a QUIC transport error; carries the offending frame type.
    Transport,
    /// 0x1d: the application (for HTTP/3 and Hysteria: an H3 error code).
    Application,
}

/// ECN counts of an ACK_ECN frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EcnCounts {
    /// ECT(0) packets received.
    pub ect0: u64,
    /// ECT(1) packets received.
    pub ect1: u64,
    /// ECN-CE packets received.
    pub ce: u64,
}

/// An ACK or ACK_ECN frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ack<'a> {
    /// Largest Acknowledged.
    pub largest: u64,
    /// ACK Delay, in units of 2^ack_delay_exponent microseconds (the exponent
    /// is a transport parameter: 3 unless the peer said otherwise).
    pub delay: u64,
    /// ACK Range Count: ranges after the first.
    pub range_count: u64,
    /// First ACK Range: packets below `largest` also acknowledged.
    pub first_range: u64,
    /// The (gap, length) varint pairs after the first range, raw; see [`Self::ranges`].
    pub ranges_raw: &'a [u8],
    /// ECN counts, for ACK_ECN (0x03).
    pub ecn: Option<EcnCounts>,
}

impl Ack<'_> {
    /// Every acknowledged range, highest first, as inclusive (smallest,
    /// largest) packet numbers. Stops early on ranges that would go below 0,
    /// which the parser has not checked.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut cursor = Cursor::new(self.ranges_raw);
        let mut next = self.largest.checked_sub(self.first_range).map(|low| (low, self.largest));
        let mut left = self.range_count;
        std::iter::from_fn(move || {
            let current = next.take()?;
            if left > 0 {
                left -= 1;
                let gap = cursor.varint("gap").ok();
                let len = cursor.varint("range").ok();
                next = gap.zip(len).and_then(|(gap, len)| {
                    let high = current.0.checked_sub(gap)?.checked_sub(2)?;
                    Some((high.checked_sub(len)?, high))
                });
            }
            Some(current)
        })
    }
}

/// One frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Frame<'a> {
    /// A run of PADDING (0x00) bytes, collapsed.
    Padding {
        /// Bytes in the run.
        len: usize,
    },
    /// PING (0x01).
    Ping,
    /// ACK (0x02) or ACK_ECN (0x03).
    Ack(Ack<'a>),
    /// RESET_STREAM (0x04): the sender abandons a stream.
    ResetStream {
        /// Stream ID.
        stream_id: u64,
        /// Application error code.
        error_code: u64,
        /// Final size of the stream.
        final_size: u64,
    },
    /// STOP_SENDING (0x05): the receiver wants no more data on a stream.
    StopSending {
        /// Stream ID.
        stream_id: u64,
        /// Application error code.
        error_code: u64,
    },
    /// CRYPTO (0x06): TLS handshake bytes.
    Crypto {
        /// Offset in the space's crypto stream.
        offset: u64,
        /// The bytes.
        data: &'a [u8],
    },
    /// NEW_TOKEN (0x07).
    NewToken {
        /// The token.
        token: &'a [u8],
    },
    /// STREAM (0x08 to 0x0f).
    Stream {
        /// Stream ID.
        stream_id: u64,
        /// Offset of `data` in the stream (0 when the OFF bit is clear).
        offset: u64,
        /// The FIN bit: `data` ends the stream.
        fin: bool,
        /// Whether the frame had a Length field (else it ran to the packet's end).
        has_len: bool,
        /// The stream bytes.
        data: &'a [u8],
    },
    /// MAX_DATA (0x10): connection-level flow-control limit.
    MaxData {
        /// Maximum bytes the peer may send on all streams.
        max: u64,
    },
    /// MAX_STREAM_DATA (0x11): stream-level flow-control limit.
    MaxStreamData {
        /// Stream ID.
        stream_id: u64,
        /// Maximum offset the peer may send to.
        max: u64,
    },
    /// MAX_STREAMS (0x12 bidi, 0x13 uni).
    MaxStreams {
        /// Which streams.
        dir: StreamDir,
        /// Cumulative count the peer may open.
        max: u64,
    },
    /// DATA_BLOCKED (0x14): the sender is stuck at the connection limit.
    DataBlocked {
        /// The limit it is blocked at.
        limit: u64,
    },
    /// STREAM_DATA_BLOCKED (0x15): the sender is stuck at a stream's limit.
    StreamDataBlocked {
        /// Stream ID.
        stream_id: u64,
        /// The limit it is blocked at.
        limit: u64,
    },
    /// STREAMS_BLOCKED (0x16 bidi, 0x17 uni).
    StreamsBlocked {
        /// Which streams.
        dir: StreamDir,
        /// The stream limit it is blocked at.
        limit: u64,
    },
    /// NEW_CONNECTION_ID (0x18).
    NewConnectionId {
        /// Sequence number.
        seq: u64,
        /// Retire Prior To.
        retire_prior_to: u64,
        /// The connection ID (1 to 20 bytes).
        cid: &'a [u8],
        /// Stateless Reset Token.
        reset_token: [u8; 16],
    },
    /// RETIRE_CONNECTION_ID (0x19).
    RetireConnectionId {
        /// Sequence number retired.
        seq: u64,
    },
    /// PATH_CHALLENGE (0x1a).
    PathChallenge([u8; 8]),
    /// PATH_RESPONSE (0x1b).
    PathResponse([u8; 8]),
    /// CONNECTION_CLOSE (0x1c transport, 0x1d application).
    ConnectionClose {
        /// Which layer.
        kind: CloseKind,
        /// Error code.
        code: u64,
        /// Transport closes: the frame type that caused it (0 if none).
        frame_type: Option<u64>,
        /// Reason phrase (UTF-8 by convention, not checked).
        reason: &'a [u8],
    },
    /// HANDSHAKE_DONE (0x1e).
    HandshakeDone,
    /// DATAGRAM (0x30 without length, 0x31 with).
    Datagram {
        /// Whether the frame had a Length field.
        has_len: bool,
        /// The datagram.
        data: &'a [u8],
    },
    /// ACK_FREQUENCY (0xaf, draft-ietf-quic-ack-frequency).
    AckFrequency {
        /// Sequence number.
        seq: u64,
        /// Ack-Eliciting Threshold.
        ack_eliciting_threshold: u64,
        /// Request Max Ack Delay, microseconds.
        request_max_ack_delay: u64,
        /// Reordering Threshold.
        reordering_threshold: u64,
    },
    /// IMMEDIATE_ACK (0x1f, draft-ietf-quic-ack-frequency).
    ImmediateAck,
}

/// Why frame parsing stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
pub enum FrameErrorKind {
    /// A field runs past the end of the payload.
    #[error("truncated {what}")]
    Truncated {
        /// The field.
        what: &'static str,
    },
    /// A frame type this parser does not know (extensions it does not speak).
    #[error("unknown frame type {0:#x}")]
    UnknownType(u64),
    /// A field with a value the RFC forbids.
    #[error("invalid {0}")]
    Invalid(&'static str),
}

/// A frame that could not be parsed, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
#[error("frame at payload offset {offset} (type {frame_type:?}): {kind}")]
pub struct FrameError {
    /// Offset of the frame's first byte in the payload.
    pub offset: usize,
    /// The frame type, if it could be read.
    pub frame_type: Option<u64>,
    /// Why.
    pub kind: FrameErrorKind,
}

/// Parses a whole decrypted payload: the frames before the first error, and
/// the error if there was one.
pub fn parse_frames(payload: &[u8]) -> (Vec<Frame<'_>>, Option<FrameError>) {
    let mut frames = Vec::new();
    for frame in Frames::new(payload) {
        match frame {
            Ok(f) => frames.push(f),
            Err(e) => return (frames, Some(e)),
        }
    }
    (frames, None)
}

/// Iterator over the frames of a payload; ends after the first error.
#[derive(Debug, Clone)]
pub struct Frames<'a> {
    cursor: Cursor<'a>,
    failed: bool,
}

impl<'a> Frames<'a> {
    /// Frames of `payload`.
    pub fn new(payload: &'a [u8]) -> Self {
        Self { cursor: Cursor::new(payload), failed: false }
    }
}

impl<'a> Iterator for Frames<'a> {
    type Item = Result<Frame<'a>, FrameError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.cursor.is_empty() {
            return None;
        }
        let offset = self.cursor.pos;
        let result = next_frame(&mut self.cursor).map_err(|(frame_type, kind)| FrameError { offset, frame_type, kind });
        self.failed = result.is_err();
        Some(result)
    }
}

type Failure = (Option<u64>, FrameErrorKind);

fn next_frame<'a>(c: &mut Cursor<'a>) -> Result<Frame<'a>, Failure> {
    if c.peek_u8() == Some(0) {
        let len = c.remaining().iter().take_while(|&&b| b == 0).count();
        c.pos += len;
        return Ok(Frame::Padding { len });
    }
    let ty = c.varint("frame type").map_err(|s| (None, truncated(s)))?;
    frame_body(c, ty).map_err(|kind| (Some(ty), kind))
}

fn truncated(s: Short) -> FrameErrorKind {
    FrameErrorKind::Truncated { what: s.what }
}

impl From<Short> for FrameErrorKind {
    fn from(s: Short) -> Self {
        truncated(s)
    }
}

fn frame_body<'a>(c: &mut Cursor<'a>, ty: u64) -> Result<Frame<'a>, FrameErrorKind> {
    Ok(match ty {
        0x00 => Frame::Padding { len: 1 },
        0x01 => Frame::Ping,
        0x02 | 0x03 => Frame::Ack(ack(c, ty == 0x03)?),
        0x04 => Frame::ResetStream {
            stream_id: c.varint("stream id")?,
            error_code: c.varint("error code")?,
            final_size: c.varint("final size")?,
        },
        0x05 => Frame::StopSending { stream_id: c.varint("stream id")?, error_code: c.varint("error code")? },
        0x06 => {
            let offset = c.varint("crypto offset")?;
            let len = c.varint("crypto length")?;
            Frame::Crypto { offset, data: c.take_var(len, "crypto data")? }
        }
        0x07 => {
            let len = c.varint("token length")?;
            if len == 0 {
                return Err(FrameErrorKind::Invalid("empty NEW_TOKEN"));
            }
            Frame::NewToken { token: c.take_var(len, "token")? }
        }
        0x08..=0x0f => {
            let stream_id = c.varint("stream id")?;
            let offset = if ty & 0x04 != 0 { c.varint("stream offset")? } else { 0 };
            let has_len = ty & 0x02 != 0;
            let data = if has_len {
                let len = c.varint("stream length")?;
                c.take_var(len, "stream data")?
            } else {
                c.take(c.remaining().len(), "stream data")?
            };
            if offset.checked_add(data.len() as u64).is_none_or(|end| end > (1 << 62) - 1) {
                return Err(FrameErrorKind::Invalid("stream offset + length over 2^62-1"));
            }
            Frame::Stream { stream_id, offset, fin: ty & 0x01 != 0, has_len, data }
        }
        0x10 => Frame::MaxData { max: c.varint("maximum data")? },
        0x11 => Frame::MaxStreamData { stream_id: c.varint("stream id")?, max: c.varint("maximum stream data")? },
        0x12 | 0x13 => Frame::MaxStreams { dir: dir(ty), max: streams_limit(c, "maximum streams")? },
        0x14 => Frame::DataBlocked { limit: c.varint("maximum data")? },
        0x15 => Frame::StreamDataBlocked { stream_id: c.varint("stream id")?, limit: c.varint("maximum stream data")? },
        0x16 | 0x17 => Frame::StreamsBlocked { dir: dir(ty), limit: streams_limit(c, "maximum streams")? },
        0x18 => {
            let seq = c.varint("sequence number")?;
            let retire_prior_to = c.varint("retire prior to")?;
            let len = c.u8("connection id length")?;
            if !(1..=20).contains(&len) {
                return Err(FrameErrorKind::Invalid("NEW_CONNECTION_ID length"));
            }
            if retire_prior_to > seq {
                return Err(FrameErrorKind::Invalid("retire prior to above sequence number"));
            }
            let cid = c.take(usize::from(len), "connection id")?;
            Frame::NewConnectionId { seq, retire_prior_to, cid, reset_token: c.array("stateless reset token")? }
        }
        0x19 => Frame::RetireConnectionId { seq: c.varint("sequence number")? },
        0x1a => Frame::PathChallenge(c.array("path challenge data")?),
        0x1b => Frame::PathResponse(c.array("path response data")?),
        0x1c | 0x1d => {
            let code = c.varint("error code")?;
            let frame_type = if ty == 0x1c { Some(c.varint("frame type")?) } else { None };
            let len = c.varint("reason phrase length")?;
            let kind = if ty == 0x1c { CloseKind::Transport } else { CloseKind::Application };
            Frame::ConnectionClose { kind, code, frame_type, reason: c.take_var(len, "reason phrase")? }
        }
        0x1e => Frame::HandshakeDone,
        0x1f => Frame::ImmediateAck,
        0x30 => Frame::Datagram { has_len: false, data: c.take(c.remaining().len(), "datagram data")? },
        0x31 => {
            let len = c.varint("datagram length")?;
            Frame::Datagram { has_len: true, data: c.take_var(len, "datagram data")? }
        }
        0xaf => Frame::AckFrequency {
            seq: c.varint("sequence number")?,
            ack_eliciting_threshold: c.varint("ack-eliciting threshold")?,
            request_max_ack_delay: c.varint("request max ack delay")?,
            reordering_threshold: c.varint("reordering threshold")?,
        },
        other => return Err(FrameErrorKind::UnknownType(other)),
    })
}

fn dir(ty: u64) -> StreamDir {
    if ty & 0x01 == 0 { StreamDir::Bidi } else { StreamDir::Uni }
}

fn streams_limit(c: &mut Cursor<'_>, what: &'static str) -> Result<u64, FrameErrorKind> {
    let v = c.varint(what)?;
    if v > 1 << 60 {
        return Err(FrameErrorKind::Invalid("stream count over 2^60"));
    }
    Ok(v)
}

fn ack<'a>(c: &mut Cursor<'a>, ecn: bool) -> Result<Ack<'a>, FrameErrorKind> {
    let largest = c.varint("largest acknowledged")?;
    let delay = c.varint("ack delay")?;
    let range_count = c.varint("ack range count")?;
    let first_range = c.varint("first ack range")?;
    if first_range > largest {
        return Err(FrameErrorKind::Invalid("first ACK range below packet number 0"));
    }
    let start = c.pos;
    for _ in 0..range_count {
        c.varint("ack gap")?;
        c.varint("ack range length")?;
    }
    let ranges_raw = c.since(start);
    let ecn = if ecn {
        Some(EcnCounts { ect0: c.varint("ECT0 count")?, ect1: c.varint("ECT1 count")?, ce: c.varint("ECN-CE count")? })
    } else {
        None
    };
    Ok(Ack { largest, delay, range_count, first_range, ranges_raw, ecn })
}
