//! Tests of the capture reader: synthetic files built byte by byte, malformed input, and
//! (as root) real tcpdump captures on loopback.

mod build;
mod live;
mod malformed;
mod synthetic;

use super::{CaptureError, CaptureReader, Packet, Record, Stats};

/// Reads a whole in-memory capture: its records (or the fatal error) and its stats.
fn read_all(bytes: &[u8]) -> (Vec<Record>, Result<(), CaptureError>, Stats) {
    let mut reader = match CaptureReader::from_bytes(bytes) {
        Ok(r) => r,
        Err(e) => return (Vec::new(), Err(e), Stats::default()),
    };
    let mut records = Vec::new();
    let mut result = Ok(());
    for item in reader.by_ref() {
        match item {
            Ok(r) => records.push(r),
            Err(e) => result = Err(e),
        }
    }
    (records, result, reader.stats().clone())
}

/// The packets of a capture that must read without a fatal error.
fn packets(bytes: &[u8]) -> (Vec<Packet>, Stats) {
    let (records, result, stats) = read_all(bytes);
    if let Err(e) = result {
        panic!("unexpected error: {e}");
    }
    let packets = records
        .into_iter()
        .filter_map(|r| match r {
            Record::Packet(p) => Some(p),
            Record::KeyLog(_) => None,
        })
        .collect();
    (packets, stats)
}
