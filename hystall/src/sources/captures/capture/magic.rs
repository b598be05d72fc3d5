//! Recognising the container from the first bytes, and saying what a file that is not a
//! capture looks like (a gzip'd capture or a text log is a common mix-up).

use super::error::CaptureError;

/// The container format of a capture file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureFormat {
    /// Classic libpcap: one link type, microsecond or nanosecond timestamps.
    Pcap { big_endian: bool, nanos: bool },
    /// pcapng: sections, several interfaces, per-interface time resolution.
    PcapNg,
}

/// Bytes to read before handing the input to pcap-parser: the pcap global header, or the
/// smallest pcapng Section Header Block.
pub(super) const PCAP_HEADER_LEN: usize = 24;
pub(super) const SHB_MIN_LEN: usize = 28;

const PCAPNG_SHB: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];
const BYTE_ORDER_MAGIC: u32 = 0x1a2b_3c4d;

/// Tells the format from the first bytes (`prefix`, as many as the file has up to
/// [`SHB_MIN_LEN`]), or says why it is not a capture.
pub(super) fn detect(prefix: &[u8]) -> Result<CaptureFormat, CaptureError> {
    let Some(magic) = prefix.first_chunk::<4>() else {
        return Err(not_a_capture(prefix));
    };
    let format = match u32::from_le_bytes(*magic) {
        0xa1b2_c3d4 | 0xa1b2_cd34 => CaptureFormat::Pcap { big_endian: false, nanos: false },
        0xa1b2_3c4d => CaptureFormat::Pcap { big_endian: false, nanos: true },
        0xd4c3_b2a1 => CaptureFormat::Pcap { big_endian: true, nanos: false },
        0x4d3c_b2a1 => CaptureFormat::Pcap { big_endian: true, nanos: true },
        _ if *magic == PCAPNG_SHB => CaptureFormat::PcapNg,
        _ => return Err(not_a_capture(prefix)),
    };
    match format {
        CaptureFormat::Pcap { .. } if prefix.len() < PCAP_HEADER_LEN => {
            Err(CaptureError::TruncatedHeader { what: "pcap global header", got: prefix.len(), need: PCAP_HEADER_LEN })
        }
        CaptureFormat::PcapNg => {
            let bom = prefix.get(8..12).and_then(|b| b.first_chunk::<4>()).map(|b| u32::from_le_bytes(*b));
            match bom {
                Some(b) if b != BYTE_ORDER_MAGIC && b.swap_bytes() != BYTE_ORDER_MAGIC => {
                    Err(CaptureError::BadByteOrder { offset: 0, bom: b })
                }
                _ if prefix.len() < SHB_MIN_LEN => Err(CaptureError::TruncatedHeader {
                    what: "pcapng section header",
                    got: prefix.len(),
                    need: SHB_MIN_LEN,
                }),
                _ => Ok(format),
            }
        }
        _ => Ok(format),
    }
}

fn not_a_capture(prefix: &[u8]) -> CaptureError {
    if prefix.is_empty() {
        return CaptureError::Empty;
    }
    let shown = prefix.get(..8).unwrap_or(prefix);
    let hex = shown.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ");
    CaptureError::NotACapture { hex, looks_like: looks_like(prefix) }
}

/// A guess at what the file is, from its first bytes.
fn looks_like(prefix: &[u8]) -> &'static str {
    const KNOWN: [(&[u8], &str); 8] = [
        (&[0x1f, 0x8b], "gzip data: decompress it first"),
        (&[0x28, 0xb5, 0x2f, 0xfd], "zstd data: decompress it first"),
        (b"BZh", "bzip2 data: decompress it first"),
        (&[0xfd, b'7', b'z', b'X', b'Z'], "xz data: decompress it first"),
        (b"PK\x03\x04", "a zip archive"),
        (b"snoop\0", "a Solaris snoop capture, not supported"),
        (&[0x7f, b'E', b'L', b'F'], "an ELF executable"),
        (b"\xef\xbb\xbf", "UTF-8 text"),
    ];
    if let Some((_, what)) = KNOWN.iter().find(|(m, _)| prefix.starts_with(m)) {
        return what;
    }
    if prefix.len() < 4 {
        return "too short for any capture magic";
    }
    if prefix.iter().all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace()) {
        return "text";
    }
    "no known capture magic"
}
