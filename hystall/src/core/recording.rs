//! The recording format (`hystall record`): compact, versioned, streamable.
//!
//! ```text
//! "HYSTREC\n"  u32 LE format version  frame*
//! frame = u32 LE length, then that many bytes of postcard:
//!         the first frame is a `Header`, every later one a `Step`
//! ```
//!
//! postcard (serde) keeps frames small (varints, no field names); the length
//! prefix lets a reader skip nothing and stop cleanly at a frame cut short by a
//! killed recorder. A new format version is a new number: old readers refuse it
//! with a clear message instead of misreading it.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use super::timeline::{ModelOptions, Step};

pub const MAGIC: &[u8; 8] = b"HYSTREC\n";
pub const FORMAT_VERSION: u32 = 5;
/// The oldest format this hystall still reads: 3 only added observations;
/// 4 added the client streams to decrypted frame figures, so a format 2–3
/// recording that holds frame figures (`record --decrypt`) stops with a
/// "corrupt recording" error at the first of them; 5 only added an
/// observation (which processes answer each request, from their configs).
pub const OLDEST_FORMAT: u32 = 2;
/// No frame is this big (a FlowCounts of 100k flows is ~6 MB): a larger length is corruption.
pub const MAX_FRAME: usize = 64 << 20;

/// What a recording says about itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub hystall_version: String,
    pub node: String,
    /// realtime − monotonic at the start, in ns: maps recorded times to wall-clock.
    pub wall_offset_ns: i128,
    pub options: ModelOptions,
    /// Processes watched (for the report).
    pub pids: Vec<u32>,
    pub comms: Vec<String>,
    pub cgroups: Vec<String>,
    /// 0 for the first file of a run, then 1, 2, ... after each rotation.
    pub part: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    #[error("not a hystall recording (the file starts with {0:02x?})")]
    Magic(Vec<u8>),
    #[error(
        "recording format {found} is not supported (this hystall reads formats {OLDEST_FORMAT} to {FORMAT_VERSION})"
    )]
    Version { found: u32 },
    #[error("corrupt recording at byte {offset}: {what}")]
    Corrupt { offset: u64, what: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Writes the preamble and the header; returns the bytes written.
pub fn write_header<W: Write>(w: &mut W, h: &Header) -> Result<u64, RecordingError> {
    w.write_all(MAGIC)?;
    w.write_all(&FORMAT_VERSION.to_le_bytes())?;
    Ok(12 + write_frame(w, h)?)
}

/// Writes one step; returns the bytes written.
pub fn write_step<W: Write>(w: &mut W, s: &Step) -> Result<u64, RecordingError> {
    write_frame(w, s)
}

fn write_frame<W: Write, T: Serialize>(w: &mut W, v: &T) -> Result<u64, RecordingError> {
    let bytes = postcard::to_stdvec(v).map_err(|e| RecordingError::Io(std::io::Error::other(e)))?;
    w.write_all(&(bytes.len() as u32).to_le_bytes())?;
    w.write_all(&bytes)?;
    Ok(4 + bytes.len() as u64)
}

/// Reads a recording frame by frame.
pub struct Reader<R: Read> {
    r: R,
    offset: u64,
    pub header: Header,
    /// Set when the file ended inside a frame (a recorder killed mid-write).
    pub truncated: bool,
    buf: Vec<u8>,
}

impl<R: Read> Reader<R> {
    pub fn new(mut r: R) -> Result<Self, RecordingError> {
        let mut pre = [0u8; 12];
        let n = read_full(&mut r, &mut pre)?;
        if n < 8 || &pre[..8] != MAGIC {
            return Err(RecordingError::Magic(pre[..n.min(8)].to_vec()));
        }
        if n < 12 {
            return Err(RecordingError::Corrupt { offset: n as u64, what: "the file ends inside its preamble".into() });
        }
        let found = u32::from_le_bytes([pre[8], pre[9], pre[10], pre[11]]);
        if !(OLDEST_FORMAT..=FORMAT_VERSION).contains(&found) {
            return Err(RecordingError::Version { found });
        }
        let mut me = Reader { r, offset: 12, header: placeholder(), truncated: false, buf: Vec::new() };
        match me.frame()? {
            Some(()) => {}
            None => return Err(me.corrupt("the file ends before its header")),
        }
        me.header = postcard::from_bytes(&me.buf).map_err(|e| me.corrupt(format!("header: {e}")))?;
        Ok(me)
    }

    /// The next step; `Ok(None)` at the end (or at a frame cut short: see `truncated`).
    pub fn next_step(&mut self) -> Result<Option<Step>, RecordingError> {
        if self.frame()?.is_none() {
            return Ok(None);
        }
        postcard::from_bytes(&self.buf).map(Some).map_err(|e| self.corrupt(format!("step: {e}")))
    }

    fn corrupt(&self, what: impl Into<String>) -> RecordingError {
        RecordingError::Corrupt { offset: self.offset, what: what.into() }
    }

    /// Reads one frame into `buf`; `None` at a clean end or a cut-short frame.
    fn frame(&mut self) -> Result<Option<()>, RecordingError> {
        let mut len = [0u8; 4];
        match read_full(&mut self.r, &mut len)? {
            0 => return Ok(None),
            4 => {}
            _ => {
                self.truncated = true;
                return Ok(None);
            }
        }
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_FRAME {
            return Err(self.corrupt(format!("a frame of {len} bytes (at most {MAX_FRAME})")));
        }
        self.buf.resize(len, 0);
        if read_full(&mut self.r, &mut self.buf)? < len {
            self.truncated = true;
            return Ok(None);
        }
        self.offset += 4 + len as u64;
        Ok(Some(()))
    }
}

impl<R: Read> Iterator for Reader<R> {
    type Item = Result<Step, RecordingError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_step().transpose()
    }
}

fn placeholder() -> Header {
    Header {
        hystall_version: String::new(),
        node: String::new(),
        wall_offset_ns: 0,
        options: ModelOptions { stall_timeout_ms: 0, quic_idle_ms: 0, stream_window: 0, conn_window: 0 },
        pids: Vec::new(),
        comms: Vec::new(),
        cgroups: Vec::new(),
        part: 0,
    }
}

/// Reads until `buf` is full or the input ends; the bytes read.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::observation::{Observation, SockChange, SockSample};
    use crate::core::time::Mono;

    fn header() -> Header {
        Header {
            hystall_version: "0.1.0".into(),
            node: "n1".into(),
            wall_offset_ns: 1_700_000_000_000_000_000,
            options: ModelOptions {
                stall_timeout_ms: 3000,
                quic_idle_ms: 30_000,
                stream_window: 8 << 20,
                conn_window: 20 << 20,
            },
            pids: vec![7],
            comms: vec!["sing-box".into()],
            cgroups: vec![],
            part: 0,
        }
    }

    fn steps() -> Vec<Step> {
        let sample = SockSample {
            cookie: 9,
            pid: 7,
            comm: "sing-box".into(),
            local: Some("127.0.0.1:5000".parse().unwrap()),
            remote: Some("127.0.0.1:80".parse().unwrap()),
            outbound: true,
            blocked_since: Some(Mono(5)),
            ..Default::default()
        };
        vec![
            Step::Obs(Observation::Sock { at: Mono(10), change: SockChange::Blocked, sample }),
            Step::Tick(Mono(200)),
            Step::Obs(Observation::Owners { at: Mono(300), ports: vec![(443, 7)] }),
        ]
    }

    fn encode() -> Vec<u8> {
        let mut out = Vec::new();
        write_header(&mut out, &header()).unwrap();
        for s in steps() {
            write_step(&mut out, &s).unwrap();
        }
        out
    }

    #[test]
    fn round_trip() {
        let bytes = encode();
        let mut r = Reader::new(&bytes[..]).unwrap();
        assert_eq!(r.header, header());
        let got: Vec<Step> = r.by_ref().collect::<Result<_, _>>().unwrap();
        assert_eq!(got, steps());
        assert!(!r.truncated);
    }

    #[test]
    fn a_frame_cut_short_ends_the_replay_and_says_so() {
        let bytes = encode();
        for cut in 1..bytes.len() {
            match Reader::new(&bytes[..cut]) {
                Err(e) => assert!(!e.to_string().is_empty()),
                Ok(mut r) => {
                    let n = r.by_ref().filter_map(Result::ok).count();
                    assert!(n < 3);
                    assert!(r.truncated || n == steps().len() || cut < bytes.len());
                }
            }
        }
    }

    #[test]
    fn wrong_magic_version_and_giant_frames_are_clear_errors() {
        let e = Reader::new(&b"\xd4\xc3\xb2\xa1 a pcap"[..]).err().unwrap();
        assert!(e.to_string().starts_with("not a hystall recording"), "{e}");
        let mut bytes = encode();
        bytes[8] = 9;
        let e = Reader::new(&bytes[..]).err().unwrap();
        assert!(e.to_string().contains("format 9 is not supported"), "{e}");
        let mut bytes = encode();
        bytes[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        let e = Reader::new(&bytes[..]).err().unwrap();
        assert!(e.to_string().contains("corrupt recording at byte 12"), "{e}");
    }

    #[test]
    fn garbage_frames_are_errors_not_panics() {
        let mut bytes = Vec::new();
        write_header(&mut bytes, &header()).unwrap();
        let mut seed = 0x9e3779b97f4a7c15u64;
        for _ in 0..2000 {
            let mut b = bytes.clone();
            let len = (seed % 64) as usize;
            b.extend_from_slice(&(len as u32).to_le_bytes());
            for _ in 0..len {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                b.push(seed as u8);
            }
            let mut r = Reader::new(&b[..]).unwrap();
            let _ = r.by_ref().take(3).count();
        }
    }
}
