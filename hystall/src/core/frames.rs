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
    /// STREAM_DATA_BLOCKED frames from the client.
    pub stream_data_blocked: u64,
    /// The client's streams seen in the frames read, most recently moved
    /// first kept (at most `MAX_CLIENT_STREAMS`).
    pub client_streams: Vec<ClientStream>,
    /// MAX_STREAM_DATA frames from the server.
    pub max_stream_data: u64,
    pub reset_stream: PerDir<u64>,
    pub stop_sending: PerDir<u64>,
    pub connection_close: PerDir<u64>,
    /// The negotiated cipher suite, when known ("TLS_AES_128_GCM_SHA256").
    pub suite: Option<String>,
}

/// Client streams listed per connection, at most: the ones that matter are
/// the few that hold the window; the oldest quiet ones make room.
pub const MAX_CLIENT_STREAMS: usize = 64;

/// One client stream as its frames show it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientStream {
    pub id: u64,
    /// The highest offset the client sent (the end of its last new bytes).
    pub offset: u64,
    /// When new bytes last came (None: only frames with no new bytes were read).
    pub last_new: Option<Mono>,
    /// The stream ended: FIN sent, or reset by either side.
    pub ended: bool,
    /// The stream limit its STREAM_DATA_BLOCKED named, if the client sent one.
    pub blocked_at: Option<u64>,
}

impl FrameState {
    /// The entry of client stream `id`, made if new (the oldest quiet
    /// stream, preferring ended ones, makes room when the list is full).
    pub fn client_stream(&mut self, id: u64) -> &mut ClientStream {
        let i = match self.client_streams.iter().position(|s| s.id == id) {
            Some(i) => i,
            None => {
                if self.client_streams.len() >= MAX_CLIENT_STREAMS
                    && let Some(old) = (0..self.client_streams.len())
                        .min_by_key(|&i| (!self.client_streams[i].ended, self.client_streams[i].last_new))
                {
                    self.client_streams.swap_remove(old);
                }
                self.client_streams.push(ClientStream { id, ..Default::default() });
                self.client_streams.len() - 1
            }
        };
        &mut self.client_streams[i]
    }

    /// The client's streams that hold unread bytes at a stop: not ended,
    /// with bytes sent, and no new bytes after `stop`; the largest first.
    pub fn held_streams(&self, stop: Mono) -> Vec<&ClientStream> {
        let mut v: Vec<&ClientStream> = self
            .client_streams
            .iter()
            .filter(|s| !s.ended && s.offset > 0 && s.last_new.is_none_or(|t| t <= stop))
            .collect();
        v.sort_by(|a, b| b.offset.cmp(&a.offset).then(a.id.cmp(&b.id)));
        v
    }
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
    /// The client streams the frames read show holding bytes at the stop
    /// (not ended, no new bytes since), the largest first: the streams whose
    /// unread bytes pin the window. Live, only streams whose last frames
    /// were read are known.
    pub blocked_streams: Vec<BlockedStream>,
}

/// A client stream that stopped with bytes in it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BlockedStream {
    pub id: u64,
    /// The highest offset the client sent on it.
    pub offset: u64,
    /// The stream limit the client named in STREAM_DATA_BLOCKED, if it did
    /// (then `offset` is at its window).
    pub stream_limit: Option<u64>,
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

    #[test]
    fn client_streams_list_the_ones_that_hold_bytes_and_stay_bounded() {
        let mut f = FrameState::default();
        for id in 0..(MAX_CLIENT_STREAMS as u64 + 10) {
            let s = f.client_stream(id * 4);
            s.offset = 100 + id;
            s.last_new = Some(Mono(id));
            // Every other one finished.
            s.ended = id % 2 == 1;
        }
        assert_eq!(f.client_streams.len(), MAX_CLIENT_STREAMS, "bounded");
        // Ended streams made room first: every open one is still there.
        assert_eq!(f.client_streams.iter().filter(|s| !s.ended).count(), MAX_CLIENT_STREAMS / 2 + 5);
        let held = f.held_streams(Mono(u64::MAX));
        assert!(held.iter().all(|s| !s.ended), "finished streams hold nothing");
        assert!(held.windows(2).all(|w| w[0].offset >= w[1].offset), "largest first");
        // A stream that moved after the stop does not hold the window at it.
        assert!(f.held_streams(Mono(3)).iter().all(|s| s.last_new <= Some(Mono(3))));
    }
}
