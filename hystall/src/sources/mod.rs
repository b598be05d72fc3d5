//! Sources: where observations come from. Only this layer touches the OS.

pub mod api_poll;
pub mod blocking;
pub mod capture;
pub mod cgroup;
pub mod clash_api;
pub mod decrypt;
pub mod fd_owners;
pub mod flow_map;
/// Functions of (stripped) Go binaries from their pc-line table, for uprobes.
pub mod gosym;
pub mod hysteria_api;
pub mod live;
pub mod nft;
pub mod offline;
pub mod pace;
pub mod parked;
pub mod probes;
pub mod procs;
pub mod proxy_config;
pub mod quic;
pub mod replay;
pub mod seed;
pub mod server_ports;
pub mod sockdiag;
pub mod udp_rescan;
