//! `--decrypt`: what the TC classifier keeps and passes so that user space
//! can read the frames of the connections it suspects: for every watched flow
//! the client's last short large packets and its small ones ([`Snips`]) —
//! where a client that ran out of connection credit says so (DATA_BLOCKED),
//! long before anyone suspects the connection — and whole packets of the
//! selected flows, within a byte budget.

use crate::flow::FlowKey;

/// Bytes of one segment's UDP payload copied (QUIC datagrams fit; a power of
/// two, for the verifier's length mask).
pub const PACKET_MAX: usize = 2048;
/// Ring buffer of passed packets.
pub const PACKETS_RING_BYTES: u32 = 1 << 22;
/// Flows user space can select at once.
pub const MAX_SELECTED: u32 = 1024;
/// Bytes a selected flow may pass per second (both directions).
pub const SELECTED_BYTES_PER_SEC: u64 = 1 << 20;

/// Small client packets kept per flow (a power of two, for the verifier's
/// index mask), in three parts:
/// - `SNIPS_FIRST` slots: the first small packet after each of the client's
///   last `SNIPS_FIRST` runs of large packets, a ring. quic-go puts its
///   DATA_BLOCKED in the packet that carries the last bytes of credit: when
///   that packet is small, it is the first small one after the last stream
///   run. Retransmissions often follow it (loss on a loaded or lossy path),
///   each run of them a new "last large packet"; with one slot that was
///   overwritten by the next ACK, and `--decrypt` never saw the DATA_BLOCKED
///   (1 run in 5 of decrypt_e2e's idle-beside-starved test on a loaded
///   machine). Here it survives `SNIPS_FIRST - 1` such runs.
/// - `SNIPS_AFTER` slots: the next small packets after the last run (a
///   DATA_BLOCKED alone may follow a few ACKs).
/// - the rest: the latest ones in a ring (ACKs and datagrams keep coming
///   after a DATA_BLOCKED: the client is alive).
pub const SNIPS: usize = 16;
pub const SNIPS_FIRST: usize = 4;
pub const SNIPS_AFTER: usize = 8;
/// Largest client packet kept as a snip (an ACK with a DATA_BLOCKED frame is
/// a few dozen bytes; a power of two, for the verifier's length mask).
pub const SNIP_BYTES: usize = 128;
/// Flows whose snips are kept (LRU; 26.4 KiB each: 26 MiB). A flow's
/// entry is refreshed by each short packet it sends, so the ones evicted on
/// a node with more are the flows that sent none lately.
pub const MAX_SNIP_FLOWS: u32 = 1024;
/// Large client packets kept per flow, a ring. Only those shorter than the
/// flow's full size are kept: the packet with a DATA_BLOCKED carries what
/// was left of the credit (or nothing), so it is short; retransmissions,
/// which may follow it, are mostly full-size — but not all: a loss burst at
/// the server's socket is repaired in GSO batches whose last segments are
/// short too. decrypt_e2e's four-stalled test once saw 8 such tails within
/// 4 ms after the DATA_BLOCKED (900 KB retransmitted on a loaded machine):
/// with 6 slots it was pushed out and the live verdict stayed `likely`. 16
/// keep it through 15. (`Snips` is also the per-CPU scratch value, which the
/// kernel caps at 32 KiB: 16 is the most that fits.)
pub const TAILS: usize = 16;
/// A single packet this close to the full size counts as full. quic-go sends
/// its retransmissions one by one, a byte or a few short of the segment size
/// of its GSO batches (a longer packet number, a shorter offset): dozens of
/// them after the DATA_BLOCKED would push it out of the ring. (The short last
/// segment of a batch is kept however close: that is where the credit ran
/// out.)
pub const NEAR_FULL: u32 = 24;
/// Bytes of a large packet kept (QUIC's largest on common paths is 1452).
pub const TAIL_BYTES: usize = 1536;

/// One packet of a selected flow.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FlowPacket {
    pub key: FlowKey,
    pub ts_ns: u64,
    pub dir: u32,
    /// Bytes valid in `bytes` (the first segment of a GSO/GRO super-packet).
    pub caplen: u32,
    pub bytes: [u8; PACKET_MAX],
}

/// A selected flow's budget: bytes passed in the current one-second window.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    pub window_ns: u64,
    pub bytes: u64,
}

/// What a flow's client sent last: where a DATA_BLOCKED is.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Snips {
    /// The client's last packets larger than `SNIP_BYTES` but shorter than
    /// its full size (of a GSO/GRO batch, a short last segment), a ring: a
    /// client that runs out of credit puts its DATA_BLOCKED in the packet
    /// with the last stream bytes it may send (quic-go does).
    pub tail_ts_ns: [u64; TAILS],
    pub tail_len: [u32; TAILS],
    /// The slot the next large packet takes.
    pub tail_next: u32,
    pub _pad: u32,
    pub tails: [[u8; TAIL_BYTES]; TAILS],
    /// The small packets after them (ACKs, datagrams, a DATA_BLOCKED alone).
    pub ts_ns: [u64; SNIPS],
    pub len: [u32; SNIPS],
    pub bytes: [[u8; SNIP_BYTES]; SNIPS],
}

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::FlowPacket {}
    unsafe impl aya::Pod for super::Budget {}
    unsafe impl aya::Pod for super::Snips {}
}

// The per-CPU scratch `Snips` is built in must fit the kernel's per-CPU
// value limit (PCPU_MIN_UNIT_SIZE, 32 KiB), or the map fails to load.
const _: () = assert!(core::mem::size_of::<Snips>() <= 32 * 1024);
