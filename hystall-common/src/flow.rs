//! Per-UDP-flow aggregates of the QUIC server's traffic (TC classifier), and
//! the header samples user space needs to learn connection IDs.

/// Client → server (counted at ingress, where the server host receives it).
pub const DIR_C2S: usize = 0;
/// Server → client (counted at egress, where the server host sends it).
pub const DIR_S2C: usize = 1;

/// Size classes of a UDP payload (per segment). ACK-only QUIC packets are a few
/// dozen bytes; stream data fills packets to the path MTU (1200–1452 bytes).
pub const CLASS_ACK: usize = 0;
pub const CLASS_MEDIUM: usize = 1;
pub const CLASS_FULL: usize = 2;
/// Largest payload counted as ack-sized.
pub const ACK_MAX: u32 = 80;
/// Smallest payload counted as full-size (bulk stream data).
pub const FULL_MIN: u32 = 1001;

/// Bytes of UDP payload copied into a sample: enough for a long header with
/// two 20-byte connection IDs.
pub const SAMPLE_BYTES: usize = 64;

/// Server → client packets at least this large are *replies* (their times
/// are kept, `FlowStats::replies`): a Hysteria2 server answers each TCP
/// request once the target is dialled (a status and 128–1023 bytes of
/// padding: 150 bytes or more on the wire), while an uploading client gets
/// ACKs (a few dozen bytes) and nothing else.
pub const REPLY_MIN: u32 = 150;
/// Reply times kept per flow.
pub const REPLY_SLOTS: usize = 4;

/// Sizes of the QUIC maps (docs/ARCHITECTURE.md).
pub const MAX_FLOWS: u32 = 65_536;
pub const MAX_PORTS: u32 = 65_536;
pub const SAMPLES_RING_BYTES: u32 = 1 << 20;
/// Names of flows that moved in a read epoch (`MOVED`): 48 bytes a flow
/// with the ring's header, so ~21,000 flows moved between two reads before
/// it fills (then the next read is a whole one).
pub const MOVED_RING_BYTES: u32 = 1 << 20;

/// A UDP flow between a client and the server, direction-normalised. Addresses
/// in network order (IPv4 in the first 4 bytes), ports in host order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub family: u16,
    pub client_port: u16,
    pub server_port: u16,
    pub _pad: u16,
    pub client: [u8; 16],
    pub server: [u8; 16],
}

/// One direction of a flow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirStats {
    /// Packets per size class (GSO/GRO super-packets count as their segments).
    pub packets: [u64; 3],
    pub bytes: [u64; 3],
    /// Last packet of each size class.
    pub last_ns: [u64; 3],
    pub first_ns: u64,
    pub sampling: sampling::State,
}

/// In the order a packet touches it: the classifier's per-packet cost at
/// node scale is its cache misses (the map's element is ~330 bytes with its
/// key, six cache lines), so what every packet reads comes first with the
/// key, each direction's counters together, and the server's reply stamps
/// right after its direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowStats {
    /// The read epoch of the flow's last packet (`FLOW_EPOCH`): its first
    /// packet in an epoch names the flow in `MOVED`.
    pub epoch: u32,
    /// `--decrypt`: small client packets kept as snips since the flow's last
    /// full-size client packet (`decrypt::Snips`).
    pub snips: u32,
    pub dir: [DirStats; 2],
    /// Server → client packets of at least `REPLY_MIN` bytes so far; the
    /// last `REPLY_SLOTS` of them are stamped in `replies` (slot = count %
    /// slots).
    pub replies_n: u32,
    pub ifindex: u32,
    pub replies: [u64; REPLY_SLOTS],
}

/// Flows copied per run of `flow_copy` (a classifier never attached, run by
/// user space with `BPF_PROG_TEST_RUN`): the moved flows of a read in one run
/// per this many, not one `bpf` look-up syscall each.
pub const COPY_BATCH: u32 = 512;

/// The start of one packet's UDP payload, sent to user space for new flows,
/// long headers, and at a low rate otherwise.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowSample {
    pub key: FlowKey,
    pub ts_ns: u64,
    pub dir: u32,
    pub ifindex: u32,
    /// Payload bytes of one segment.
    pub payload_len: u32,
    /// Segments in the skb (GSO/GRO), at least 1.
    pub segs: u32,
    /// Bytes valid in `bytes`.
    pub caplen: u32,
    pub _pad: u32,
    pub bytes: [u8; SAMPLE_BYTES],
}

/// Header sampling, one policy for the kernel program and the capture reader:
/// the first packets of each flow direction, then one every 30 s; long
/// headers (handshakes are short) one per 50 ms; and a client short header
/// whose first connection-ID bytes differ from the last sample's one per
/// 250 ms. QUIC clients move to a new connection ID right after the handshake
/// (quic-go) and now and then later; a port hop after such a move can only be
/// joined to its connection if the new ID was seen on the old path.
/// Obfuscated flows (random bytes) differ every packet and so cost 4 samples
/// a second. A sample of a flow whose ID did not change tells nothing new:
/// at one a second, a node's idle connections (a ping or a datagram every few
/// seconds) had nearly every packet sampled (the node-scale benchmark, 10,000
/// connections: hystall's CPU 9.6 → 8.4 % of a core with 30 s).
pub mod sampling {
    pub const FIRST: u32 = 8;
    pub const EVERY_NS: u64 = 30_000_000_000;
    pub const LONG_EVERY_NS: u64 = 50_000_000;
    pub const CID_CHANGE_EVERY_NS: u64 = 250_000_000;

    /// Sampling state of one flow direction.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct State {
        pub last_ns: u64,
        /// Samples taken so far (saturating).
        pub taken: u32,
        /// The first four DCID bytes of the last sampled client short header
        /// (zero for anything else).
        pub cid: u32,
    }

    impl State {
        /// Whether to sample the packet seen at `now_ns` whose payload starts
        /// with `head` (zero-padded when shorter); if so, counts it.
        #[inline(always)]
        pub fn take(&mut self, now_ns: u64, head: [u8; 5], c2s: bool) -> bool {
            let long = head[0] & 0x80 != 0;
            let cid = if c2s && !long { u32::from_ne_bytes([head[1], head[2], head[3], head[4]]) } else { 0 };
            let since = now_ns.saturating_sub(self.last_ns);
            let want = self.taken < FIRST
                || since >= EVERY_NS
                || (long && since >= LONG_EVERY_NS)
                || (cid != self.cid && since >= CID_CHANGE_EVERY_NS);
            if want {
                self.taken = self.taken.saturating_add(1);
                self.last_ns = now_ns;
                self.cid = cid;
            }
            want
        }
    }
}

/// The size class of a payload of `len` bytes.
#[inline(always)]
pub fn size_class(len: u32) -> usize {
    if len <= ACK_MAX {
        CLASS_ACK
    } else if len < FULL_MIN {
        CLASS_MEDIUM
    } else {
        CLASS_FULL
    }
}

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::FlowKey {}
    unsafe impl aya::Pod for super::DirStats {}
    unsafe impl aya::Pod for super::FlowStats {}
    unsafe impl aya::Pod for super::FlowSample {}
}
