//! Offline triage input: reads pcap and pcapng capture files (`hystall pcap FILE`)
//! and turns them into UDP datagrams, TCP segment summaries and TLS key logs.
//!
//! The layers, one file each, from the file to the records:
//! - [`magic`]: which container the first bytes announce;
//! - [`container`]: pcap-parser's streaming readers, with our own block framing so a
//!   giant or cut-off block is a clear error or a counted skip, never an endless refill;
//! - [`link`]: link-layer headers down to IPv4/IPv6;
//! - [`ip`] and [`reassembly`]: IP headers, IPv6 extension headers, fragments;
//! - [`transport`]: UDP and TCP headers;
//! - [`decode`]: the pipeline from one captured frame to a [`Packet`];
//! - [`reader`]: the public iterator, [`CaptureReader`].
//!
//! Nothing here panics on input: every malformed header becomes a [`SkipReason`] counted
//! in [`Stats`], and only damage that makes the rest of the file unreadable is an error.

mod container;
mod decode;
mod error;
mod fill_read;
mod ip;
mod link;
mod magic;
mod reader;
mod reassembly;
mod record;
mod stats;
mod transport;

#[cfg(test)]
mod tests;

pub use error::CaptureError;
pub use magic::CaptureFormat;
pub use reader::CaptureReader;
pub use record::{L4, Packet, Record, TcpFlags};
pub use stats::{SkipReason, Stats};
