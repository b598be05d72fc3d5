//! The kernel side: the eBPF programs (loading, the probe path each kernel allows, their maps) and the TC classifier's flow map turned into observations.

pub mod flow_map;
pub mod probes;
pub mod quic;
