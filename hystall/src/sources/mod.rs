//! Sources: where observations come from. Only this layer touches the OS.
//!
//! One folder per kind of thing observed; `live` assembles them for `watch`
//! and `top`:
//!
//! - `kernel`: the eBPF programs and their maps;
//! - `processes`: the watched processes and their sockets;
//! - `discovery`: which UDP ports are QUIC servers;
//! - `apis`: the servers' own HTTP APIs;
//! - `captures`: capture files and recordings;
//! - `decrypt`: the servers' TLS secrets, and Go binaries' symbols to find them.

pub mod apis;
pub mod captures;
pub mod decrypt;
pub mod discovery;
pub mod kernel;
pub mod live;
pub mod processes;
