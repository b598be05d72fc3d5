//! TC classifier on the server's interfaces: per-flow packet and byte counts of
//! the QUIC server's UDP traffic, by direction and size class, plus header
//! samples so user space can learn connection IDs. It never drops or changes a
//! packet.
//!
//! Each packet is counted once, where the server host handles it: client →
//! server at ingress (the destination port is a server port; before any DNAT of
//! a port-hopping range), server → client at egress (the source port is a
//! server port; after the reverse NAT). On loopback both directions pass both
//! hooks, and this rule still counts each exactly once.
//!
//! It returns TCX_NEXT (-1, which is TC_ACT_UNSPEC for clsact): "no verdict,
//! go on", so the programs after it (a firewall, another observer) still run.
//! TC_ACT_OK would end the chain there.

use aya_ebpf::{
    helpers::generated::bpf_skb_load_bytes,
    macros::{classifier, map},
    maps::{Array, HashMap, LruPerCpuHashMap, PerCpuArray, RingBuf},
    programs::TcContext,
};
use hystall_common::{
    AF_INET, AF_INET6, DIR_C2S, DIR_S2C, FlowKey, FlowSample, FlowStats, MARK_FLOW, MAX_FLOWS, MAX_IFACES, MAX_PORTS,
    SAMPLE_BYTES, SAMPLES_RING_BYTES, counter, crossed, size_class,
};

use crate::maps::{bump, mark, now_ns};

/// Server UDP ports (host order), including port-hopping ranges: 1 = watched.
/// An array indexed by port, not a hash: the verifier inlines array lookups,
/// and this runs for every UDP packet on the watched interfaces.
#[map]
pub static PORTS: Array<u8> = Array::with_max_entries(MAX_PORTS, 0);
/// Link-layer header length per ifindex (14 for Ethernet and loopback, 0 for
/// L3 devices such as WireGuard or tun). Missing = 14.
#[map]
pub static IFACES: HashMap<u32, u32> = HashMap::with_max_entries(MAX_IFACES, 0);
/// Per-CPU so that counting needs no atomics and loses nothing when both
/// directions of a flow are handled on different CPUs; user space sums.
#[map]
pub static FLOWS: LruPerCpuHashMap<FlowKey, FlowStats> = LruPerCpuHashMap::with_max_entries(MAX_FLOWS, 0);
#[map]
pub static FLOW_SAMPLES: RingBuf = RingBuf::with_byte_size(SAMPLES_RING_BYTES, 0);
#[map]
static FLOW_SCRATCH: PerCpuArray<FlowStats> = PerCpuArray::with_max_entries(1, 0);

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_UDP: u8 = 17;

/// TCX_NEXT / TC_ACT_UNSPEC: let the next program decide.
const NEXT: i32 = -1;

#[classifier]
pub fn quic_ingress(ctx: TcContext) -> i32 {
    let _ = try_flow(&ctx, true);
    NEXT
}

#[classifier]
pub fn quic_egress(ctx: TcContext) -> i32 {
    let _ = try_flow(&ctx, false);
    NEXT
}

struct Parsed {
    key: FlowKey,
    dir: usize,
    payload_off: usize,
    payload_len: u32,
}

#[inline(always)]
fn try_flow(ctx: &TcContext, ingress: bool) -> Result<(), ()> {
    let skb = unsafe { &*ctx.skb.skb };
    let proto = u16::from_be(skb.protocol as u16);
    if proto != ETH_P_IP && proto != ETH_P_IPV6 {
        return Err(());
    }
    let ifindex = skb.ifindex;
    // Only two link-layer lengths exist here; a constant keeps offsets bounded.
    let l2 = if unsafe { IFACES.get(&ifindex) }.copied().unwrap_or(14) == 0 { 0 } else { 14 };
    let Some(p) = parse(ctx, l2, proto == ETH_P_IPV6, ingress) else {
        return Err(());
    };
    bump(counter::UDP_PACKETS);

    // GSO (egress) and GRO (ingress) super-packets: count their segments.
    let segs = if skb.gso_segs > 1 { skb.gso_segs } else { 1 };
    let seg_len = if segs > 1 && skb.gso_size > 0 { skb.gso_size } else { p.payload_len };
    let class = size_class(seg_len);
    let now = now_ns();

    let stats = match FLOWS.get_ptr_mut(&p.key) {
        Some(s) => s,
        None => {
            let scratch = FLOW_SCRATCH.get_ptr_mut(0).ok_or(())?;
            unsafe {
                core::ptr::write_bytes(scratch, 0, 1);
                (*scratch).ifindex = ifindex;
            }
            // BPF_NOEXIST: another CPU may have created it meanwhile; then use it.
            // (A per-CPU insert sets this CPU's copy; the others start zeroed.)
            if FLOWS.insert(&p.key, unsafe { &*scratch }, 1).is_err() && FLOWS.get_ptr(&p.key).is_none() {
                bump(counter::FLOWS_FULL);
                return Err(());
            }
            FLOWS.get_ptr_mut(&p.key).ok_or(())?
        }
    };
    // Checked indexing (no panic paths: the verifier rejects them).
    let d = unsafe { (*stats).dir.get_mut(p.dir).ok_or(())? };
    // This CPU's client bytes before the packet, for the byte marks.
    let before = d.bytes[0] + d.bytes[1] + d.bytes[2];
    if p.dir == DIR_C2S && crossed(before, before + p.payload_len as u64) {
        mark(MARK_FLOW, now, before + p.payload_len as u64, 0, Some(&p.key));
    }
    if let (Some(pk), Some(by), Some(ls)) = (d.packets.get_mut(class), d.bytes.get_mut(class), d.last_ns.get_mut(class))
    {
        *pk += segs as u64;
        // The whole payload of a super-packet (its last segment may be short).
        *by += p.payload_len as u64;
        *ls = now;
    }
    if d.first_ns == 0 {
        d.first_ns = now;
    }

    // Sample the header? (One load of the first five bytes; a shorter
    // payload falls back to its first byte.)
    let head: [u8; 5] = rd(ctx, p.payload_off).unwrap_or_else(|_| [rd(ctx, p.payload_off).unwrap_or(0), 0, 0, 0, 0]);
    if d.sampling.take(now, head, p.dir == DIR_C2S) {
        sample(ctx, &p, now, ifindex, segs, seg_len);
    }
    Ok(())
}

#[inline(always)]
fn watched(port: u16) -> Option<()> {
    (PORTS.get(port as u32).copied().unwrap_or(0) != 0).then_some(())
}

/// Reads a `T` at `off` in the packet (`bpf_skb_load_bytes`). Direct packet
/// access would save the helper calls, but LLVM's bounds checks on a variable
/// offset are not ones the verifier accepts (tried: "R1 offset is outside of
/// the packet"); left for a later optimisation.
#[inline(always)]
fn rd<T>(ctx: &TcContext, off: usize) -> Result<T, i64> {
    ctx.load(off)
}

#[inline(always)]
fn parse(ctx: &TcContext, l2: usize, v6: bool, ingress: bool) -> Option<Parsed> {
    let mut key = FlowKey::default();
    let (l4, src_off, dst_off, alen) = if !v6 {
        let vihl: u8 = rd(ctx, l2).ok()?;
        if vihl >> 4 != 4 {
            return None;
        }
        let ihl = ((vihl & 0x0f) as usize) * 4;
        let frag: u16 = u16::from_be(rd(ctx, l2 + 6).ok()?);
        let proto: u8 = rd(ctx, l2 + 9).ok()?;
        if proto != IPPROTO_UDP {
            return None;
        }
        if frag & 0x1fff != 0 {
            // A later fragment has no UDP header: counted, not guessed.
            bump(counter::UNPARSED);
            return None;
        }
        key.family = AF_INET;
        (l2 + ihl, l2 + 12, l2 + 16, 4usize)
    } else {
        let next: u8 = rd(ctx, l2 + 6).ok()?;
        if next != IPPROTO_UDP {
            // Extension headers (rare on QUIC paths) are not walked.
            if next == 0 || next == 43 || next == 44 || next == 60 {
                bump(counter::UNPARSED);
            }
            return None;
        }
        key.family = AF_INET6;
        (l2 + 40, l2 + 8, l2 + 24, 16usize)
    };
    let sport = u16::from_be(rd(ctx, l4).ok()?);
    let dport = u16::from_be(rd(ctx, l4 + 2).ok()?);
    let udp_len = u16::from_be(rd(ctx, l4 + 4).ok()?) as u32;

    let (dir, client_off, server_off) = if ingress {
        watched(dport)?;
        key.client_port = sport;
        key.server_port = dport;
        (DIR_C2S, src_off, dst_off)
    } else {
        watched(sport)?;
        key.client_port = dport;
        key.server_port = sport;
        (DIR_S2C, dst_off, src_off)
    };
    if alen == 4 {
        let c: [u8; 4] = rd(ctx, client_off).ok()?;
        let s: [u8; 4] = rd(ctx, server_off).ok()?;
        key.client[..4].copy_from_slice(&c);
        key.server[..4].copy_from_slice(&s);
    } else {
        key.client = rd(ctx, client_off).ok()?;
        key.server = rd(ctx, server_off).ok()?;
    }
    // The UDP length field of a GSO super-packet may describe one segment or
    // the whole; the skb length is what is really there.
    let payload_off = l4 + 8;
    let in_skb = (ctx.len() as usize).saturating_sub(payload_off) as u32;
    let payload_len = if udp_len >= 8 && udp_len - 8 <= in_skb { udp_len - 8 } else { in_skb };
    Some(Parsed { key, dir, payload_off, payload_len })
}

#[inline(always)]
fn sample(ctx: &TcContext, p: &Parsed, now: u64, ifindex: u32, segs: u32, seg_len: u32) {
    let Some(mut entry) = FLOW_SAMPLES.reserve::<FlowSample>(0) else {
        bump(counter::SAMPLES_LOST);
        return;
    };
    let s = entry.as_mut_ptr();
    let avail = (ctx.len() as usize).saturating_sub(p.payload_off);
    unsafe {
        (*s).key = p.key;
        (*s).ts_ns = now;
        (*s).dir = p.dir as u32;
        (*s).ifindex = ifindex;
        (*s).payload_len = seg_len;
        (*s).segs = segs;
        (*s)._pad = 0;
        let bytes = &mut (*s).bytes;
        *bytes = [0; SAMPLE_BYTES];
        // min(available, 64) bytes (ACK-sized packets are shorter). The mask
        // shows the verifier a length in 1..=64, never zero.
        (*s).caplen = 0;
        if avail > 0 {
            let n = (((avail.min(SAMPLE_BYTES) - 1) & (SAMPLE_BYTES - 1)) + 1) as u32;
            let ret = bpf_skb_load_bytes(ctx.skb.skb as *const _, p.payload_off as u32, bytes.as_mut_ptr().cast(), n);
            if ret == 0 {
                (*s).caplen = n;
            }
        }
    }
    entry.submit(0);
}
