//! The pure core: observations in, model and verdicts, events out. No I/O here;
//! time is an input (`Mono`), so every rule can be tested on synthetic timelines.

pub mod activity;
pub mod attribution;
pub mod conns;
pub mod detector;
pub mod enforce;
pub mod event;
pub mod flows;
pub mod frames;
pub mod model;
pub mod observation;
pub mod quic;
pub mod recording;
pub mod series;
pub mod sockets;
pub mod suspects;
pub mod time;
pub mod timeline;
pub mod verdict;

pub use event::{Event, SocketInfo};
pub use observation::{Observation, SockChange, SockSample};
pub use sockets::SocketTable;
pub use time::Mono;
pub use verdict::{Thresholds, Verdict};
