//! The public entry point: a capture file as an iterator of [`Record`]s.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use super::container::{Container, Event};
use super::decode::Decoder;
use super::error::CaptureError;
use super::magic::CaptureFormat;
use super::record::Record;
use super::stats::Stats;

/// Reads a pcap or pcapng capture as a stream of [`Record`]s, in file order, with memory
/// bounded by the largest block (16 MiB at most) plus pending IP fragments.
///
/// Iterating yields `Err` at most once, for damage that makes the rest unreadable, and
/// then ends. [`CaptureReader::stats`] is final once iteration has ended.
pub struct CaptureReader<R: Read> {
    container: Container<R>,
    decoder: Decoder,
    stats: Stats,
    done: bool,
}

impl CaptureReader<File> {
    /// Opens a capture file and reads its header.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, CaptureError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| CaptureError::Open { path: path.to_path_buf(), source })?;
        Self::new(file)
    }
}

impl<'a> CaptureReader<&'a [u8]> {
    /// Reads a capture held in memory (tests, fuzzing).
    pub fn from_bytes(bytes: &'a [u8]) -> Result<Self, CaptureError> {
        Self::new(bytes)
    }
}

impl<R: Read> CaptureReader<R> {
    /// Reads the capture header from `input`; records are read as they are iterated.
    pub fn new(input: R) -> Result<Self, CaptureError> {
        Ok(CaptureReader {
            container: Container::open(input)?,
            decoder: Decoder::default(),
            stats: Stats::default(),
            done: false,
        })
    }

    pub fn format(&self) -> CaptureFormat {
        self.container.format()
    }

    /// Counters so far; final once the iteration has ended.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The next record, `Ok(None)` at the end of the file.
    pub fn next_record(&mut self) -> Result<Option<Record>, CaptureError> {
        while !self.done {
            let event = match self.container.next_event() {
                Ok(event) => event,
                Err(e) => {
                    self.finish();
                    return Err(e);
                }
            };
            match event {
                Event::Frame(frame) => {
                    if let Some(packet) = self.decoder.frame(&frame, &mut self.stats) {
                        return Ok(Some(Record::Packet(packet)));
                    }
                }
                Event::KeyLog(text) => {
                    self.stats.key_logs += 1;
                    return Ok(Some(Record::KeyLog(text)));
                }
                Event::Skip(reason) => self.stats.skip(reason),
                Event::Other => {}
                Event::Eof => self.finish(),
            }
        }
        Ok(None)
    }

    fn finish(&mut self) {
        if !self.done {
            self.done = true;
            self.decoder.finish(&mut self.stats);
        }
    }
}

impl<R: Read> Iterator for CaptureReader<R> {
    type Item = Result<Record, CaptureError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}
