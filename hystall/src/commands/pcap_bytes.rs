//! A capture held in memory, analysed as `hystall pcap` would: the entry point
//! for the fuzz target (`fuzz/`) and the malformed-input tests, which need the
//! whole offline path (reader, converter, decryption, model) without files.

use std::time::Duration;

use crate::core::quic::KeyLog;
use crate::core::timeline::ModelOptions;
use crate::sinks::report::Report;
use crate::sources::captures::capture::{CaptureError, CaptureReader};
use crate::sources::captures::offline::{self, Converter};

/// The `hystall pcap` defaults (cli.rs `PcapArgs`): 10 s stall timeout, 30 s QUIC
/// idle, 8 MiB stream and 20 MiB connection windows.
pub const DEFAULT_OPTIONS: ModelOptions =
    ModelOptions { stall_timeout_ms: 10_000, quic_idle_ms: 30_000, stream_window: 8 << 20, conn_window: 20 << 20 };

/// Analyses `capture` (pcap or pcapng bytes) with an optional key log text, with
/// the default options. `Err` only when the header cannot be read; damage later in
/// the file ends the analysis early and shows as [`Report::error`]. Never panics.
pub fn analyse_bytes(capture: &[u8], keylog: Option<&str>) -> Result<Report, CaptureError> {
    let reader = CaptureReader::from_bytes(capture)?;
    let opts = DEFAULT_OPTIONS;
    let conv = Converter::new(
        reader,
        offline::Options {
            ports: Vec::new(),
            keylog: keylog.map(KeyLog::parse),
            quic_idle: Duration::from_millis(opts.quic_idle_ms),
        },
    );
    let summary = conv.summary.clone();
    Ok(super::pcap::analyse("<memory>", conv, summary, &opts))
}
