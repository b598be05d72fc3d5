//! The whole model: target sockets and QUIC connections, fed by observations,
//! judged on every tick. Sinks only ever see its events and read its tables.

use std::collections::HashMap;

use super::attribution::Attribution;
use super::conns::{Conn, ConnChange, ConnTable, Grouping};
use super::detector::{Detector, DetectorConfig};
use super::event::{ConnInfo, Event, Stamped};
use super::observation::{Observation, ServerStream, SockChange};
use super::sockets::SocketTable;
use super::time::Mono;
use super::verdict::Thresholds;

/// TCP states of a connect (CLOSE → SYN_SENT → ESTABLISHED), as the kernel numbers them.
const TCP_CLOSE: u8 = 7;
const TCP_SYN_SENT: u8 = 2;
const TCP_ESTABLISHED: u8 = 1;

pub struct Model {
    pub sockets: SocketTable,
    pub conns: ConnTable,
    pub detector: Detector,
    /// Which connection fed each target socket.
    pub attribution: Attribution,
    /// UDP server port → owning process.
    pub owners: HashMap<u16, u32>,
    /// The server's own stream table, when its API is available.
    pub streams: Option<Vec<ServerStream>>,
    /// Flows of the connections the last tick forgot: the live source deletes
    /// their kernel entries (replaced every tick, so bounded when nobody does).
    pub swept_flows: Vec<super::flows::FlowId>,
}

impl Model {
    pub fn new(th: Thresholds, quic_idle: std::time::Duration, detector: DetectorConfig) -> Self {
        Model {
            sockets: SocketTable::new(th),
            conns: ConnTable::new(quic_idle),
            detector: Detector::new(detector),
            attribution: Attribution::new(super::attribution::Config {
                conn_window: detector.windows.conn,
                stream_window: detector.windows.stream,
                ..Default::default()
            }),
            owners: HashMap::new(),
            streams: None,
            swept_flows: Vec::new(),
        }
    }

    pub fn apply(&mut self, obs: Observation) {
        // A target's connect and its completion are the attribution's too
        // (the socket table still takes the change below).
        if let Observation::Sock { at, change: SockChange::State { old, new }, sample } = &obs {
            match (*old, *new) {
                (TCP_CLOSE, TCP_SYN_SENT) => self.attribution.connect(sample.cookie, sample.pid, *at),
                (TCP_SYN_SENT, TCP_ESTABLISHED) => self.attribution.established(sample.cookie, *at),
                _ => {}
            }
        }
        match obs {
            Observation::Header { at, sample } => self.conns.sample(at, &sample),
            Observation::FlowCounts { at, flows } => {
                self.conns.poll(at, flows);
                self.attribution.polled(at);
            }
            Observation::FlowMoves { at, flows } => {
                self.conns.moved(at, flows);
                self.attribution.polled(at);
            }
            Observation::Marks { marks, .. } => self.attribution.marks(&marks, &self.conns),
            Observation::Owners { ports, .. } => self.owners = ports.into_iter().collect(),
            Observation::Streams { streams, .. } => self.streams = Some(streams),
            Observation::Relays { records, .. } => self.attribution.relays(records),
            Observation::Answering { pids, .. } => self.attribution.answering(pids),
            Observation::Frames { sample, .. } => self.conns.frames(*sample),
            Observation::FlowsForgotten { flows, .. } => self.conns.forgotten(&flows),
            other => self.sockets.apply(other),
        }
    }

    pub fn tick(&mut self, now: Mono) -> Vec<Stamped> {
        let mut out = self.sockets.tick(now);
        for change in self.conns.tick(now) {
            let (id, closed) = match change {
                ConnChange::Opened(id) => (id, false),
                ConnChange::Closed(id) => (id, true),
            };
            if let Some(c) = self.conns.get(id) {
                let mut info = conn_info(c);
                out.push(if closed {
                    info.reason = Some("idle");
                    Stamped { at: now, event: Event::QuicConnClosed(info) }
                } else {
                    Stamped { at: now, event: Event::QuicConnOpened(info) }
                });
            }
        }
        self.attribution.tick(now, &self.conns, &self.sockets, &self.owners);
        // Before closed connections are swept: a starved one that closes recovers.
        out.extend(self.detector.tick(
            now,
            &self.conns,
            &self.sockets,
            &self.attribution,
            &self.owners,
            self.streams.as_deref(),
        ));
        self.swept_flows = self.conns.sweep();
        out
    }
}

pub fn conn_info(c: &Conn) -> ConnInfo {
    ConnInfo {
        conn: c.id,
        client: c.client().map(|a| a.to_string()),
        server: c.server().map(|a| a.to_string()),
        dcid: c.dcid_hex(),
        grouping: match c.grouping {
            Grouping::Dcid => "dcid",
            Grouping::Obfuscated => "obfuscated",
            Grouping::FiveTuple => "five_tuple",
        },
        obfuscated: c.grouping == Grouping::Obfuscated,
        hops: c.hops(),
        server_ports: c.server_ports().into_iter().collect(),
        c2s_packets: c.c2s.total_packets(),
        c2s_bytes: c.c2s.total_bytes(),
        s2c_packets: c.s2c.total_packets(),
        s2c_bytes: c.s2c.total_bytes(),
        reason: None,
    }
}
