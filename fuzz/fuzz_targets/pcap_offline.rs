//! Arbitrary bytes through the whole offline path (`hystall pcap`): capture
//! reader, converter, QUIC decryption, model, report, text and SVG. The first
//! byte chooses whether a small fixed key log is given (odd: yes), so decryption
//! routing is exercised on the seed captures (fuzz/corpus, from
//! hystall/tests/data); the rest is the capture.
#![no_main]

use hystall::commands::pcap::CAPTURE_CLOCK;
use hystall::commands::pcap_bytes::analyse_bytes;
use hystall::sinks::{report, svg};
use libfuzzer_sys::fuzz_target;

/// The seed captures' key log (the lab's secrets), so that mutated packets reach
/// the frame parser.
const KEYLOG: &str = include_str!("../../hystall/tests/data/lab.keylog");

fuzz_target!(|data: &[u8]| {
    let Some((&choice, capture)) = data.split_first() else { return };
    let keylog = (choice & 1 == 1).then_some(KEYLOG);
    if let Ok(r) = analyse_bytes(capture, keylog) {
        let _ = report::text(&r, &CAPTURE_CLOCK);
        let _ = svg::render(&r);
    }
});
