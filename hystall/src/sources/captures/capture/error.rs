//! Fatal errors: the ones after which the rest of the file cannot be read.
//! Damage confined to one packet is a counted skip instead (see [`super::SkipReason`]).

use std::io;
use std::path::PathBuf;

/// Why a capture file cannot be read (further). Each message is one line.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("cannot open {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("read error at byte {offset}: {source}")]
    Io { offset: u64, source: io::Error },
    #[error("empty file: not a pcap or pcapng capture")]
    Empty,
    #[error("not a pcap or pcapng capture: the first bytes are {hex} ({looks_like})")]
    NotACapture { hex: String, looks_like: &'static str },
    #[error("truncated {what}: {got} of {need} bytes")]
    TruncatedHeader { what: &'static str, got: usize, need: usize },
    #[error("truncated pcapng section header: the file ends before its {need} bytes")]
    TruncatedSectionHeader { need: usize },
    #[error("pcapng section header at byte {offset} has a bad byte-order magic {bom:#010x}")]
    BadByteOrder { offset: u64, bom: u32 },
    #[error("malformed pcapng section header at byte {offset}")]
    BadSectionHeader { offset: u64 },
    #[error("{what} at byte {offset} declares {len} bytes, more than the {limit}-byte limit: corrupt file")]
    GiantBlock { what: &'static str, offset: u64, len: u64, limit: usize },
    #[error("{what} at byte {offset} declares an impossible length {len}: corrupt file")]
    BadBlockLength { what: &'static str, offset: u64, len: u64 },
}
