//! Sources: where observations come from. Only this layer touches the OS.

pub mod cgroup;
pub mod hysteria_api;
pub mod live;
pub mod probes;
pub mod procs;
pub mod quic;
pub mod seed;
pub mod sockdiag;
