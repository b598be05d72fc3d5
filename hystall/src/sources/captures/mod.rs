//! Captures and recordings as timelines: pcap/pcapng files read and decoded, rebuilt into what the live probes would have seen, and `hystall record` files replayed.

pub mod capture;
pub mod offline;
pub mod replay;
