//! One module per subcommand: each wires sources → core → sinks.

pub mod caps;
pub mod doctor;
pub mod lab_side;
pub mod metrics;
pub mod pcap;
pub mod pcap_bytes;
pub mod pipeline;
pub mod record;
pub mod replay;
pub mod top;
pub mod watch;
