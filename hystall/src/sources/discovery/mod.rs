//! QUIC server discovery: the ports the proxy's own config names, the UDP sockets that receive a client's Initial, and the port-hopping ranges nftables sends to them.

pub mod nft;
pub mod proxy_config;
pub mod server_ports;
pub mod udp_rescan;
