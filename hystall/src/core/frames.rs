//! What decrypted QUIC frames say about one connection (offline, with a key
//! log): cumulative figures, updated by the capture source as packets open.
//! Headers and timing only suggest a starvation; these figures prove it: the
//! client used up the connection's flow-control credit (its stream bytes reached
//! the server's MAX_DATA, or it says so with DATA_BLOCKED), its STREAM frames
//! stopped, and the server never raised the limit while ACKs and DATAGRAM frames
//! kept flowing.

use serde::{Deserialize, Serialize};

use super::flows::FlowId;
use super::time::Mono;

/// Per direction: `[client→server, server→client]`.
pub type PerDir<T> = [T; 2];

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameState {
    /// Packets opened and packets that could not be (no keys, failed).
    pub opened: PerDir<u64>,
    pub unopened: PerDir<u64>,
    /// New stream bytes (beyond each stream's highest offset so far).
    pub stream_bytes: PerDir<u64>,
    pub stream_frames: PerDir<u64>,
    /// The last STREAM frame that carried new bytes.
    pub last_stream: PerDir<Option<Mono>>,
    /// Streams opened by each side.
    pub streams_opened: PerDir<u64>,
    pub datagrams: PerDir<u64>,
    pub last_datagram: PerDir<Option<Mono>>,
    pub acks: PerDir<u64>,
    pub last_ack: PerDir<Option<Mono>>,
    /// The client's connection-level flow-control usage: the sum over its
    /// streams of the highest offset sent.
    pub client_consumed: u64,
    /// The server's connection limit for the client: initial_max_data from its
    /// transport parameters, raised by MAX_DATA frames.
    pub server_max_data: Option<u64>,
    /// When the server last raised it.
    pub max_data_raised: Option<Mono>,
    /// The client's DATA_BLOCKED frames: (limit named, first seen, last seen).
    pub data_blocked: Option<(u64, Mono, Mono)>,
    pub data_blocked_frames: u64,
    /// STREAM_DATA_BLOCKED frames from the client, and the streams they name.
    pub stream_data_blocked: u64,
    pub blocked_streams: Vec<(u64, u64)>,
    /// MAX_STREAM_DATA frames from the server.
    pub max_stream_data: u64,
    pub reset_stream: PerDir<u64>,
    pub stop_sending: PerDir<u64>,
    pub connection_close: PerDir<u64>,
    /// The negotiated cipher suite, when known ("TLS_AES_128_GCM_SHA256").
    pub suite: Option<String>,
}

impl FrameState {
    /// The client has no connection credit left: its stream bytes reached the
    /// server's limit, or it said so with DATA_BLOCKED at the current limit.
    pub fn client_blocked_at_limit(&self) -> Option<u64> {
        // The limit: the server's (initial_max_data, MAX_DATA frames) or the one
        // the client names in DATA_BLOCKED, if higher (a raise we did not see).
        let named = self.data_blocked.map(|(l, _, _)| l);
        let limit = match (self.server_max_data, named) {
            (Some(k), Some(n)) => k.max(n),
            (k, n) => k.or(n)?,
        };
        // Past every limit we know of: a raise we did not see, nothing proven.
        if self.client_consumed > limit {
            return None;
        }
        (named == Some(limit) || self.client_consumed == limit).then_some(limit)
    }

    /// Client packets that are not stream data (ACKs, DATAGRAM frames) after `t`.
    pub fn client_alive_after(&self, t: Mono) -> bool {
        self.last_ack[0].is_some_and(|a| a > t) || self.last_datagram[0].is_some_and(|d| d > t)
    }
}

/// The frame figures of the connection a flow belongs to, as of `at`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameSample {
    pub flow: FlowId,
    pub state: FrameState,
}

/// The decrypted evidence in a `quic_starved` event.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FrameEvidence {
    /// The server's connection limit the client reached (bytes).
    pub max_data: u64,
    /// Client stream bytes sent over the connection (flow-control usage).
    pub client_consumed: u64,
    /// The limit the client's DATA_BLOCKED frames named, if it sent any.
    pub data_blocked_limit: Option<u64>,
    pub data_blocked_frames: u64,
    pub stream_data_blocked_frames: u64,
    /// Milliseconds since the client's last STREAM frame with new data.
    pub client_stream_quiet_ms: u64,
    /// Milliseconds since the server last raised MAX_DATA (none: never raised).
    pub max_data_raised_ms_ago: Option<u64>,
    /// Client ACK and DATAGRAM frames over the whole capture.
    pub client_acks: u64,
    pub client_datagrams: u64,
    pub server_datagrams: u64,
    pub reset_stream: u64,
    pub stop_sending: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_at_the_limit_only_when_the_figures_prove_it() {
        let st = |consumed: u64, max: Option<u64>, named: Option<u64>| FrameState {
            client_consumed: consumed,
            server_max_data: max,
            data_blocked: named.map(|l| (l, Mono(1), Mono(1))),
            ..Default::default()
        };
        assert_eq!(st(100, Some(100), None).client_blocked_at_limit(), Some(100));
        assert_eq!(st(90, Some(100), None).client_blocked_at_limit(), None, "credit left");
        assert_eq!(st(120, Some(100), None).client_blocked_at_limit(), None, "a raise we missed");
        // The client names a higher limit than we saw raised: it is blocked there.
        assert_eq!(st(150, Some(100), Some(150)).client_blocked_at_limit(), Some(150));
        // An old DATA_BLOCKED, then a raise: credit left.
        assert_eq!(st(120, Some(200), Some(100)).client_blocked_at_limit(), None);
        assert_eq!(st(100, None, Some(100)).client_blocked_at_limit(), Some(100));
        assert_eq!(st(100, None, None).client_blocked_at_limit(), None);
    }
}
