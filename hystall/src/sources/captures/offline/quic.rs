//! Decryption of a capture's QUIC connections with a key log, and what their
//! frames say ([`FrameState`]): the part of the offline path that has no live
//! counterpart. Packets are routed to one decryptor per QUIC connection by
//! flow, and by the server's connection IDs (from its long headers and
//! NEW_CONNECTION_ID frames) when the client moves to a new port.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::core::flows::{Dir, FlowId};
use crate::core::frames::FrameState;
use crate::core::quic::{
    ConnDecryptor, DecodeOptions, Direction, Frame, Header, KeyLog, LongType, Opened, Packet, ShortDcidLen, Space,
    packets, parse_frames,
};
use crate::core::time::Mono;

/// Server handshake bytes kept to read its transport parameters.
const MAX_HANDSHAKE_BYTES: u64 = 64 << 10;
/// Streams whose highest offset is tracked, per connection and direction.
const MAX_STREAMS: usize = 100_000;
/// Connection ID lengths tried on a short header whose length is not known,
/// the common ones first (quinn 8, quic-go 4, others 16 and 20).
const CID_LENS: [u8; 21] = [8, 4, 16, 20, 0, 1, 2, 3, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 17, 18, 19];
/// Datagrams a connection tries `CID_LENS` on, per direction, before it
/// stops (its keys are known: something else is wrong).
const MAX_CID_TRIALS: u8 = 16;

struct QConn {
    dec: ConnDecryptor,
    /// The DCID of the client's first Initial.
    orig_dcid: Vec<u8>,
    /// DCID lengths of short headers: client→server (the server's CIDs) and server→client.
    cid_len: [Option<u8>; 2],
    /// Datagrams on which `CID_LENS` were tried, per direction.
    cid_trials: [u8; 2],
    /// The last flow the connection was seen on (frame figures are reported on it).
    flow: FlowId,
    frames: FrameState,
    offsets: [HashMap<u64, u64>; 2],
    /// The server's Handshake CRYPTO bytes, by offset, until its parameters are read.
    hs: BTreeMap<u64, Vec<u8>>,
    hs_done: bool,
    dirty: bool,
    /// New stream bytes per time bucket and direction (for the timeline picture).
    pub series: crate::core::series::Series<[u32; 2]>,
}

/// Every decryptor of a capture.
pub struct Decryptors {
    keylog: Arc<KeyLog>,
    conns: Vec<QConn>,
    by_flow: HashMap<FlowId, usize>,
    /// Server connection IDs → connection, and the lengths they come in.
    by_cid: HashMap<Vec<u8>, usize>,
    cid_lens: std::collections::BTreeSet<u8>,
    /// Server CID lengths seen per server endpoint (mid-capture connections).
    server_cid_len: HashMap<std::net::SocketAddr, u8>,
    /// The same, told by the caller (live: from header samples).
    given_cid_len: HashMap<std::net::SocketAddr, u8>,
    pub frame_errors: u64,
    /// ClientHello randoms told for flows whose connection is not seen yet.
    randoms: HashMap<FlowId, crate::core::quic::ClientRandom>,
    /// Live: the connection (the model's id) each read flow belongs to, and
    /// the decryptor of each such connection. A client that hops ports
    /// opens a new flow whose packets trial decryption would give a
    /// decryptor of its own: its frames (nothing but ACKs once blocked)
    /// then replaced the connection's, DATA_BLOCKED included.
    model_conn: HashMap<FlowId, u64>,
    by_model: HashMap<u64, usize>,
}

impl Decryptors {
    pub fn new(keylog: KeyLog) -> Self {
        Decryptors {
            keylog: Arc::new(keylog),
            conns: Vec::new(),
            by_flow: HashMap::new(),
            by_cid: HashMap::new(),
            cid_lens: Default::default(),
            server_cid_len: HashMap::new(),
            given_cid_len: HashMap::new(),
            frame_errors: 0,
            randoms: HashMap::new(),
            model_conn: HashMap::new(),
            by_model: HashMap::new(),
        }
    }

    /// Adds secrets found in the capture itself (pcapng Decryption Secrets Blocks);
    /// connections that start afterwards use them.
    pub fn add_keys(&mut self, more: &KeyLog) {
        let mut k = (*self.keylog).clone();
        k.merge(more);
        self.keylog = Arc::new(k);
        for c in &mut self.conns {
            c.dec.set_keylog(Arc::clone(&self.keylog));
        }
    }

    pub fn keylog(&self) -> &KeyLog {
        &self.keylog
    }

    /// Replaces the key log (live: the secrets of recent handshakes).
    pub fn set_keys(&mut self, keylog: Arc<KeyLog>) {
        self.keylog = keylog;
        for c in &mut self.conns {
            if !c.dec.secrets_found() {
                c.dec.set_keylog(Arc::clone(&self.keylog));
            }
        }
    }

    /// Whether some connection still waits for its secrets.
    pub fn waiting_for_keys(&self) -> bool {
        self.by_flow.values().any(|&i| self.conns.get(i).is_some_and(|c| !c.dec.secrets_found()))
    }

    /// The length of the server's connection IDs at `server`, when learnt
    /// elsewhere (live: from header samples; the handshake was not passed).
    pub fn set_server_cid_len(&mut self, server: std::net::SocketAddr, len: u8) {
        self.server_cid_len.insert(server, len);
        self.given_cid_len.insert(server, len);
    }

    /// The ClientHello random of the connection `flow` belongs to, as its
    /// Initial showed it (whether or not its secrets are known).
    pub fn hello_random_of(&self, flow: &FlowId) -> Option<crate::core::quic::ClientRandom> {
        self.conns.get(*self.by_flow.get(flow)?)?.dec.client_random().copied()
    }

    /// Tells the connection of `flow` its ClientHello random (live: read from
    /// its Initial when it began): its secrets are then looked up, not tried.
    /// Kept for a connection not seen yet.
    pub fn set_client_random(&mut self, flow: FlowId, random: crate::core::quic::ClientRandom) {
        match self.by_flow.get(&flow).and_then(|&i| self.conns.get_mut(i)) {
            Some(c) => c.dec.set_client_random(random),
            None => {
                self.randoms.insert(flow, random);
            }
        }
    }

    /// The ClientHello random of the connection `flow` belongs to, once
    /// its secrets were found.
    pub fn client_random_of(&self, flow: &FlowId) -> Option<crate::core::quic::ClientRandom> {
        let c = self.conns.get(*self.by_flow.get(flow)?)?;
        c.dec.secrets_found().then(|| c.dec.client_random().copied()).flatten()
    }

    /// Forgets the connections of `flows` (live: no longer selected). Their
    /// slots stay, emptied, so the other indexes hold.
    /// Live: `flow` belongs to the model's connection `conn` (its flows
    /// were joined by connection ID from the headers): its packets go to
    /// that connection's decryptor, whichever of its flows made it.
    pub fn same_conn(&mut self, flow: FlowId, conn: u64) {
        self.model_conn.insert(flow, conn);
        if let Some(&i) = self.by_model.get(&conn) {
            self.by_flow.entry(flow).or_insert(i);
        }
    }

    pub fn forget(&mut self, flows: &[FlowId]) {
        for f in flows {
            self.randoms.remove(f);
            self.model_conn.remove(f);
            if let Some(i) = self.by_flow.remove(f)
                && !self.by_flow.values().any(|&j| j == i)
                && let Some(c) = self.conns.get_mut(i)
            {
                self.by_cid.retain(|_, j| *j != i);
                self.by_model.retain(|_, j| *j != i);
                c.dec = ConnDecryptor::new(Arc::new(KeyLog::default()));
                c.offsets = [HashMap::new(), HashMap::new()];
                c.hs.clear();
                c.frames = FrameState::default();
                c.dirty = false;
            }
        }
    }

    /// The short-header DCID of `flow` in direction `dir`, when known (for GSO splitting).
    pub fn dcid_for(&self, flow: &FlowId, dir: Dir, first_segment: &[u8]) -> Option<Vec<u8>> {
        let c = self.conns.get(*self.by_flow.get(flow)?)?;
        let len = usize::from(c.cid_len[dir as usize]?);
        first_segment.get(1..1 + len).map(<[u8]>::to_vec)
    }

    /// Opens the QUIC packets of one datagram (segment) and records their frames.
    pub fn datagram(&mut self, at: Mono, bucket: usize, flow: FlowId, dir: Dir, d: &[u8]) {
        let Some(idx) = self.route(flow, dir, d) else { return };
        let c = &mut self.conns[idx];
        c.flow = flow;
        // Peers may grease the fixed bit (RFC 9287; quinn does): decryption decides.
        let opts = DecodeOptions {
            short_dcid_len: c.cid_len[dir as usize].map_or(ShortDcidLen::Unknown, ShortDcidLen::Known),
            allow_clear_fixed_bit: true,
        };
        let direction = match dir {
            Dir::C2s => Direction::ClientToServer,
            Dir::S2c => Direction::ServerToClient,
        };
        let mut learned = Vec::new();
        for p in packets(d, opts) {
            let p = match p {
                Ok(p) => p,
                Err(e) => {
                    tracing::debug!("{flow:?} {dir:?}: undecodable QUIC packet: {e}");
                    c.frames.unopened[dir as usize] += 1;
                    c.dirty = true;
                    break;
                }
            };
            // CID lengths for short headers, from the long headers' SCIDs.
            if let Header::Long(h) = &p.header {
                let other = 1 - dir as usize;
                if c.cid_len[other].is_none() && h.scid.len() <= 20 {
                    c.cid_len[other] = Some(h.scid.len() as u8);
                }
                if dir == Dir::S2c && !h.scid.is_empty() {
                    learned.push(h.scid.to_vec());
                    self.server_cid_len.insert(flow.server, h.scid.len() as u8);
                }
            }
            let opened = match open_unknown_cid(c, dir, direction, &p, d) {
                Some(opened) => Ok(opened),
                None => c.dec.decrypt(direction, &p, d),
            };
            match opened {
                Ok(opened) => {
                    c.frames.opened[dir as usize] += 1;
                    let (frames, err) = parse_frames(&opened.payload);
                    if err.is_some() {
                        self.frame_errors += 1;
                    }
                    let before = c.frames.stream_bytes[dir as usize];
                    for f in &frames {
                        record(c, at, dir, opened.space, f, &mut learned);
                    }
                    let new = c.frames.stream_bytes[dir as usize] - before;
                    if new > 0 && c.series.stored() + c.series.growth(bucket) <= super::MAX_BUCKETS / 4 {
                        let cell = &mut c.series.at(bucket)[dir as usize];
                        *cell = cell.saturating_add(u32::try_from(new).unwrap_or(u32::MAX));
                    }
                    c.dirty = true;
                }
                Err(crate::core::quic::DecryptError::NotEncrypted(_)) => {}
                Err(e) => {
                    tracing::debug!("{flow:?} {dir:?}: {e}");
                    c.frames.unopened[dir as usize] += 1;
                    c.dirty = true;
                }
            }
        }
        if c.frames.suite.is_none()
            && let Some(s) = c.dec.suite()
        {
            c.frames.suite = Some(format!("{s:?}"));
        }
        for cid in learned {
            self.cid_lens.insert(cid.len() as u8);
            self.by_cid.insert(cid, idx);
        }
    }

    /// The connection of a datagram: by flow, else by the server CID a client
    /// packet carries (a port hop), else a new one.
    fn route(&mut self, flow: FlowId, dir: Dir, d: &[u8]) -> Option<usize> {
        if let Some(&i) = self.by_flow.get(&flow) {
            // A client Initial to a DCID this connection never used: a new
            // connection from the same client port.
            let fresh = dir == Dir::C2s
                && initial_dcid(d).is_some_and(|dcid| {
                    dcid != self.conns[i].orig_dcid.as_slice() && self.by_cid.get(dcid) != Some(&i)
                });
            if !fresh {
                return Some(i);
            }
        }
        let first = *d.first()?;
        let mut found = None;
        if dir == Dir::C2s && first & 0x80 == 0 {
            found = self
                .cid_lens
                .iter()
                .find_map(|&l| d.get(1..1 + usize::from(l)).and_then(|cid| self.by_cid.get(cid)).copied());
        }
        if found.is_none()
            && let Some(m) = self.model_conn.get(&flow)
        {
            found = self.by_model.get(m).copied();
        }
        let idx = match found {
            Some(i) => i,
            None => {
                if dir == Dir::S2c && first & 0x80 == 0 {
                    return None; // a server packet on a path we never saw the client use
                }
                let mut cid_len = [None, None];
                if first & 0x80 == 0 {
                    cid_len[0] = self.server_cid_len.get(&flow.server).copied();
                }
                // Live, the length is known from elsewhere, and the first
                // packet passed may be the client's last Handshake packet.
                if let Some(&l) = self.given_cid_len.get(&flow.server) {
                    cid_len[0] = Some(l);
                }
                let mut dec = ConnDecryptor::new(self.keylog.clone());
                if let Some(r) = self.randoms.remove(&flow) {
                    dec.set_client_random(r);
                }
                self.conns.push(QConn {
                    orig_dcid: initial_dcid(d).map(<[u8]>::to_vec).unwrap_or_default(),
                    dec,
                    cid_len,
                    cid_trials: [0, 0],
                    flow,
                    frames: FrameState::default(),
                    offsets: [HashMap::new(), HashMap::new()],
                    hs: BTreeMap::new(),
                    hs_done: false,
                    dirty: false,
                    series: Default::default(),
                });
                self.conns.len() - 1
            }
        };
        self.by_flow.insert(flow, idx);
        if let Some(&m) = self.model_conn.get(&flow) {
            self.by_model.entry(m).or_insert(idx);
        }
        Some(idx)
    }

    /// Frame figures that changed since the last call, on each connection's latest flow.
    pub fn changed(&mut self) -> Vec<(FlowId, FrameState)> {
        self.conns.iter_mut().filter_map(|c| std::mem::take(&mut c.dirty).then(|| (c.flow, c.frames.clone()))).collect()
    }

    /// Per connection, what the report needs.
    pub fn summary(&self) -> Vec<Decrypted> {
        let mut flows: HashMap<usize, Vec<FlowId>> = HashMap::new();
        for (f, i) in &self.by_flow {
            flows.entry(*i).or_default().push(*f);
        }
        self.conns
            .iter()
            .enumerate()
            .map(|(i, c)| Decrypted {
                flows: flows.remove(&i).unwrap_or_default(),
                frames: c.frames.clone(),
                stats: c.dec.stats(),
                secrets_found: c.dec.secrets_found(),
                series: c.series.clone(),
            })
            .collect()
    }
}

/// One decrypted connection, for the report.
#[derive(Clone, Debug)]
pub struct Decrypted {
    pub flows: Vec<FlowId>,
    pub frames: FrameState,
    pub stats: crate::core::quic::DecryptStats,
    pub secrets_found: bool,
    /// New stream bytes per bucket: [client→server, server→client].
    pub series: crate::core::series::Series<[u32; 2]>,
}

/// A short header whose DCID length is not known, opened by trying each
/// length; the one that opens it is kept. Live, the server's packets are
/// passed without the client's Initial (which says the client's length), and
/// a capture may start after the handshake. Tried only once the keys are
/// known, on a few datagrams: a wrong length fails authentication.
fn open_unknown_cid(c: &mut QConn, dir: Dir, direction: Direction, p: &Packet<'_>, d: &[u8]) -> Option<Opened> {
    let Header::Short(h) = &p.header else { return None };
    let trials = &mut c.cid_trials[dir as usize];
    if h.pn_offset.is_some() || !c.dec.secrets_found() || *trials >= MAX_CID_TRIALS {
        return None;
    }
    *trials += 1;
    // A short header runs to the end of the datagram.
    let rest = d.get(p.offset..)?;
    for len in CID_LENS {
        let opts = DecodeOptions { short_dcid_len: ShortDcidLen::Known(len), allow_clear_fixed_bit: true };
        let Some(Ok(q)) = packets(rest, opts).next() else { continue };
        if let Some(opened) = c.dec.try_decrypt(direction, &q, rest) {
            c.cid_len[dir as usize] = Some(len);
            return Some(opened);
        }
    }
    None
}

/// The DCID of a datagram's first packet, if it is an Initial.
fn initial_dcid(d: &[u8]) -> Option<&[u8]> {
    // Short headers (nearly every packet) need no decoding to say no.
    if d.first()? & 0x80 == 0 {
        return None;
    }
    match packets(d, DecodeOptions::default()).next()?.ok()?.header {
        Header::Long(h) if h.packet_type == LongType::Initial => Some(h.dcid),
        _ => None,
    }
}

fn record(c: &mut QConn, at: Mono, dir: Dir, space: Space, f: &Frame<'_>, learned: &mut Vec<Vec<u8>>) {
    let d = dir as usize;
    let st = &mut c.frames;
    match *f {
        Frame::Stream { stream_id, offset, data, fin, .. } => {
            st.stream_frames[d] += 1;
            let end = offset.saturating_add(data.len() as u64);
            let offsets = &mut c.offsets[d];
            let prev = offsets.get(&stream_id).copied();
            if prev.is_none() && stream_id & 1 == d as u64 {
                st.streams_opened[d] += 1;
            }
            let moved = end > prev.unwrap_or(0) && (prev.is_some() || offsets.len() < MAX_STREAMS);
            if moved {
                let new = end - prev.unwrap_or(0);
                offsets.insert(stream_id, end);
                st.stream_bytes[d] = st.stream_bytes[d].saturating_add(new);
                st.last_stream[d] = Some(at);
                if dir == Dir::C2s {
                    st.client_consumed = st.client_consumed.saturating_add(new);
                }
            } else if prev.is_none() && offsets.len() < MAX_STREAMS {
                offsets.insert(stream_id, end);
            }
            if dir == Dir::C2s {
                let s = st.client_stream(stream_id);
                s.offset = s.offset.max(end);
                if moved {
                    s.last_new = Some(at);
                }
                s.ended |= fin;
            }
        }
        Frame::Ack(_) => {
            st.acks[d] += 1;
            st.last_ack[d] = Some(at);
        }
        Frame::Datagram { .. } => {
            st.datagrams[d] += 1;
            st.last_datagram[d] = Some(at);
        }
        Frame::MaxData { max } if dir == Dir::S2c && st.server_max_data.is_none_or(|m| max > m) => {
            st.server_max_data = Some(max);
            st.max_data_raised = Some(at);
        }
        Frame::MaxStreamData { .. } if dir == Dir::S2c => st.max_stream_data += 1,
        Frame::DataBlocked { limit } if dir == Dir::C2s => {
            st.data_blocked_frames += 1;
            st.data_blocked = Some(match st.data_blocked {
                Some((l, first, _)) if l == limit => (l, first, at),
                _ => (limit, at, at),
            });
        }
        Frame::StreamDataBlocked { stream_id, limit } if dir == Dir::C2s => {
            st.stream_data_blocked += 1;
            let s = st.client_stream(stream_id);
            s.blocked_at = Some(limit);
            s.offset = s.offset.max(limit);
        }
        Frame::ResetStream { stream_id, .. } => {
            st.reset_stream[d] += 1;
            // The client abandons what it was sending on the stream.
            if dir == Dir::C2s {
                st.client_stream(stream_id).ended = true;
            }
        }
        Frame::StopSending { stream_id, .. } => {
            st.stop_sending[d] += 1;
            // The server wants no more of it: the client resets it.
            if dir == Dir::S2c {
                st.client_stream(stream_id).ended = true;
            }
        }
        Frame::ConnectionClose { .. } => st.connection_close[d] += 1,
        Frame::NewConnectionId { cid, .. } if dir == Dir::S2c => learned.push(cid.to_vec()),
        Frame::Crypto { offset, data } if dir == Dir::S2c && space == Space::Handshake && !c.hs_done => {
            let held: usize = c.hs.values().map(Vec::len).sum();
            if offset < MAX_HANDSHAKE_BYTES && held + data.len() <= MAX_HANDSHAKE_BYTES as usize {
                c.hs.insert(offset, data.to_vec());
            }
            if let Some(max) = server_initial_max_data(&c.hs) {
                c.hs_done = true;
                c.hs.clear();
                // The initial limit; MAX_DATA frames raise it.
                if st.server_max_data.is_none_or(|m| max > m) {
                    st.server_max_data = Some(max);
                }
            }
        }
        _ => {}
    }
}

/// The contiguous prefix of a CRYPTO stream.
fn contiguous(parts: &BTreeMap<u64, Vec<u8>>) -> Vec<u8> {
    let mut out: Vec<u8> = Vec::new();
    for (&off, data) in parts {
        let have = out.len() as u64;
        if off > have {
            break;
        }
        let skip = (have - off) as usize;
        if let Some(rest) = data.get(skip..) {
            out.extend_from_slice(rest);
        }
    }
    out
}

/// initial_max_data from the server's EncryptedExtensions (its first Handshake
/// message): extension quic_transport_parameters (0x39, or draft 0xffa5), parameter 0x04.
fn server_initial_max_data(parts: &BTreeMap<u64, Vec<u8>>) -> Option<u64> {
    let hs = contiguous(parts);
    // Handshake message: type (8 = EncryptedExtensions), 24-bit length.
    if *hs.first()? != 8 {
        return None;
    }
    let len = usize::from(*hs.get(1)?) << 16 | usize::from(*hs.get(2)?) << 8 | usize::from(*hs.get(3)?);
    let body = hs.get(4..4 + len)?;
    let ext_len = usize::from(u16::from_be_bytes([*body.first()?, *body.get(1)?]));
    let mut exts = body.get(2..2 + ext_len)?;
    while exts.len() >= 4 {
        let ty = u16::from_be_bytes([exts[0], exts[1]]);
        let l = usize::from(u16::from_be_bytes([exts[2], exts[3]]));
        let data = exts.get(4..4 + l)?;
        if ty == 0x39 || ty == 0xffa5 {
            let mut p = data;
            while !p.is_empty() {
                let (id, rest) = varint(p)?;
                let (plen, rest) = varint(rest)?;
                let value = rest.get(..plen as usize)?;
                if id == 0x04 {
                    return varint(value).map(|(v, _)| v);
                }
                p = rest.get(plen as usize..)?;
            }
            return None;
        }
        exts = exts.get(4 + l..)?;
    }
    None
}

/// A QUIC variable-length integer and the rest.
fn varint(b: &[u8]) -> Option<(u64, &[u8])> {
    let first = *b.first()?;
    let len = 1usize << (first >> 6);
    let bytes = b.get(..len)?;
    let v = bytes[1..].iter().fold(u64::from(first & 0x3f), |v, &x| v << 8 | u64::from(x));
    Some((v, &b[len..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::captures::capture::{CaptureReader, L4, Record};

    /// The lab capture's datagrams: (time, flow, direction, payload).
    fn lab_datagrams() -> Vec<(Mono, FlowId, Dir, Vec<u8>)> {
        let bytes = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/lab.pcap")).unwrap();
        let mut reader = CaptureReader::from_bytes(&bytes).unwrap();
        let mut out = Vec::new();
        while let Ok(Some(r)) = reader.next_record() {
            let Record::Packet(p) = r else { continue };
            let L4::Udp { payload, .. } = p.l4 else { continue };
            let (flow, dir) = if p.dst.port() == 4433 {
                (FlowId { client: p.src, server: p.dst }, Dir::C2s)
            } else {
                (FlowId { client: p.dst, server: p.src }, Dir::S2c)
            };
            out.push((Mono(p.ts), flow, dir, payload));
        }
        out
    }

    #[test]
    fn short_headers_of_an_unknown_cid_length_are_opened_by_trying_lengths() {
        let keys = KeyLog::parse(
            &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/lab.keylog")).unwrap(),
        );
        let datagrams = lab_datagrams();
        // What live reading has: the random from the client's first Initial
        // (read apart), the server's CID length from header samples, and then
        // short headers only; never the long header with the client's CID.
        let (_, flow, _, first) = datagrams.iter().find(|(_, _, d, _)| *d == Dir::C2s).unwrap();
        let mut hello = Decryptors::new(KeyLog::default());
        hello.datagram(Mono(0), 0, *flow, Dir::C2s, first);
        let random = hello.hello_random_of(flow).expect("the ClientHello random");
        let mut all = Decryptors::new(keys.clone());
        for (at, f, dir, d) in &datagrams {
            all.datagram(*at, 0, *f, *dir, d);
        }
        let server_cid = all.conns[0].cid_len[Dir::C2s as usize].expect("the server's CID length");
        let mut live = Decryptors::new(keys);
        live.set_server_cid_len(flow.server, server_cid);
        live.set_client_random(*flow, random);
        for (at, f, dir, d) in datagrams.iter().filter(|(_, _, _, d)| d[0] & 0x80 == 0) {
            live.datagram(*at, 0, *f, *dir, d);
        }
        let c = &live.conns[0];
        assert_eq!(c.cid_len, all.conns[0].cid_len, "both lengths found");
        let f = &c.frames;
        assert!(f.opened[Dir::S2c as usize] > 10, "server packets opened: {f:?}");
        // The same 1-RTT frames as with the handshake seen (the capture's
        // cut packets fail in both; ACKs also ride in long headers).
        let whole = &all.conns[0].frames;
        assert!(f.acks[Dir::S2c as usize] > 0);
        assert_eq!(f.datagrams, whole.datagrams);
        assert_eq!(f.stream_frames, whole.stream_frames);
        assert_eq!(f.unopened[Dir::S2c as usize], whole.unopened[Dir::S2c as usize]);
    }

    #[test]
    fn a_hop_to_a_new_port_keeps_the_connections_frames_when_told_it_is_the_same() {
        // Live, a client that hops ports sends the rest from a new flow; its
        // packets, opened by trial with the same secrets, made a decryptor
        // of their own whose frames replaced the connection's (its
        // DATA_BLOCKED lost). Told the flows are one connection, they share one.
        let keys = KeyLog::parse(
            &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/lab.keylog")).unwrap(),
        );
        let datagrams = lab_datagrams();
        let (_, flow, _, first) = datagrams.iter().find(|(_, _, d, _)| *d == Dir::C2s).unwrap();
        let mut hello = Decryptors::new(KeyLog::default());
        hello.datagram(Mono(0), 0, *flow, Dir::C2s, first);
        let random = hello.hello_random_of(flow).expect("the ClientHello random");
        let mut all = Decryptors::new(keys.clone());
        for (at, f, dir, d) in &datagrams {
            all.datagram(*at, 0, *f, *dir, d);
        }
        let server_cid = all.conns[0].cid_len[Dir::C2s as usize].expect("the server's CID length");
        let short: Vec<_> = datagrams.iter().filter(|(_, _, dir, d)| *dir == Dir::C2s && d[0] & 0x80 == 0).collect();
        let mut hopped = *flow;
        hopped.client.set_port(flow.client.port().wrapping_add(1));
        let run = |tell: bool| {
            let mut live = Decryptors::new(keys.clone());
            live.set_server_cid_len(flow.server, server_cid);
            live.set_client_random(*flow, random);
            if tell {
                live.same_conn(*flow, 7);
                live.same_conn(hopped, 7);
            }
            for (i, (at, f, dir, d)) in short.iter().enumerate() {
                let f = if i < short.len() / 2 { *f } else { hopped };
                live.datagram(*at, 0, f, *dir, d);
            }
            live
        };
        let told = run(true);
        assert_eq!(told.conns.len(), 1, "one decryptor for both flows");
        let mut alone = Decryptors::new(keys.clone());
        alone.set_server_cid_len(flow.server, server_cid);
        alone.set_client_random(*flow, random);
        for (at, f, dir, d) in &short {
            alone.datagram(*at, 0, *f, *dir, d);
        }
        assert_eq!(told.conns[0].frames.stream_frames, alone.conns[0].frames.stream_frames);
        assert_eq!(told.conns[0].frames.acks, alone.conns[0].frames.acks);
        // Untold, the new flow's frames are a connection of their own.
        assert_eq!(run(false).conns.len(), 2);
    }

    #[test]
    fn encrypted_extensions_give_initial_max_data() {
        // Transport parameters: 0x04 initial_max_data = 20 MiB (4-byte varint), 0x01 idle timeout.
        let mut tp = vec![0x01, 0x02, 0x40, 0x64, 0x04, 0x04];
        tp.extend_from_slice(&(0x8000_0000u32 | (20 << 20)).to_be_bytes());
        let mut ext = vec![0x00, 0x39];
        ext.extend_from_slice(&(tp.len() as u16).to_be_bytes());
        ext.extend_from_slice(&tp);
        let mut body = (ext.len() as u16).to_be_bytes().to_vec();
        body.extend_from_slice(&ext);
        let mut msg = vec![8, 0, 0, body.len() as u8];
        msg.extend_from_slice(&body);
        // Split over two CRYPTO frames, out of order.
        let mut parts = BTreeMap::new();
        parts.insert(5, msg[5..].to_vec());
        assert_eq!(server_initial_max_data(&parts), None);
        parts.insert(0, msg[..5].to_vec());
        assert_eq!(server_initial_max_data(&parts), Some(20 << 20));
        // Garbage never panics.
        for cut in 0..msg.len() {
            let mut p = BTreeMap::new();
            p.insert(0, msg[..cut].to_vec());
            let _ = server_initial_max_data(&p);
        }
    }
}
