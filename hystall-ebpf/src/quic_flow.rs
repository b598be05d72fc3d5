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

use core::intrinsics::{AtomicOrdering, atomic_xadd};

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::generated::bpf_skb_load_bytes,
    macros::{classifier, map},
    maps::{Array, LruHashMap, PerCpuArray, RingBuf},
    programs::TcContext,
};
use hystall_common::{
    AF_INET, AF_INET6, Budget, DIR_C2S, DIR_S2C, FlowKey, FlowPacket, FlowSample, FlowStats, MARK_FLOW, MAX_FLOWS,
    MAX_PORTS, MAX_SELECTED, MAX_SNIP_FLOWS, MOVED_RING_BYTES, NEAR_FULL, PACKET_MAX, PACKETS_RING_BYTES, REPLY_MIN,
    REPLY_SLOTS, SAMPLE_BYTES, SAMPLES_RING_BYTES, SELECTED_BYTES_PER_SEC, SNIP_BYTES, SNIPS, SNIPS_AFTER, SNIPS_FIRST,
    Snips, TAIL_BYTES, TAILS, counter, crossed, size_class,
};

use crate::maps::{bump, mark, now_ns, wakeup};

/// Server UDP ports (host order), including port-hopping ranges: 1 = watched.
/// An array indexed by port, not a hash: the verifier inlines array lookups,
/// and this runs for every UDP packet on the watched interfaces.
#[map]
pub static PORTS: Array<u8> = Array::with_max_entries(MAX_PORTS, 0);
/// One entry per flow for all CPUs (its size does not grow with the CPU
/// count): counts are added atomically, so both directions of a flow handled
/// on different CPUs lose nothing.
#[map]
pub static FLOWS: LruHashMap<FlowKey, FlowStats> = LruHashMap::with_max_entries(MAX_FLOWS, 0);
#[map]
pub static FLOW_SAMPLES: RingBuf = RingBuf::with_byte_size(SAMPLES_RING_BYTES, 0);
#[map]
static FLOW_SCRATCH: PerCpuArray<FlowStats> = PerCpuArray::with_max_entries(1, 0);
/// The read epoch: user space moves it on before each read of `FLOWS` (0:
/// it reads the whole map, nothing is named).
#[map]
pub static FLOW_EPOCH: Array<u32> = Array::with_max_entries(1, 0);
/// The flows that moved in the epoch: each flow's key once, at its first
/// packet in the epoch, so that a read looks up those and not the whole
/// map (at node scale most flows are quiet between two reads).
#[map]
pub static MOVED: RingBuf = RingBuf::with_byte_size(MOVED_RING_BYTES, 0);

/// `--decrypt` (a load-time constant: without it the verifier drops the
/// code below, and it costs nothing).
#[unsafe(no_mangle)]
static DECRYPT: u8 = 0;
/// Flows user space selected for decryption, with their byte budgets.
#[map]
pub static SELECTED: aya_ebpf::maps::HashMap<FlowKey, Budget> =
    aya_ebpf::maps::HashMap::with_max_entries(MAX_SELECTED, 0);
/// Whole packets of selected flows.
#[map]
pub static PACKETS: RingBuf = RingBuf::with_byte_size(PACKETS_RING_BYTES, 0);
/// The first small client packets after each flow's last full-size one.
#[map]
pub static SNIPPED: LruHashMap<FlowKey, Snips> = LruHashMap::with_max_entries(MAX_SNIP_FLOWS, 0);
#[map]
static SNIP_SCRATCH: PerCpuArray<Snips> = PerCpuArray::with_max_entries(1, 0);

/// The snip state's count of small packets since the last large one, and of
/// large runs (`kept` in `classify`).
const SMALL_MASK: u32 = 0xfff;
const RUN_SHIFT: u32 = 12;
const RUN_MASK: u32 = 0xf;

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_UDP: u8 = 17;
/// Link-layer header of Ethernet (and loopback); L3 devices (WireGuard, tun)
/// have none and get the `_l3` programs.
const ETH: usize = 14;

/// TCX_NEXT / TC_ACT_UNSPEC: let the next program decide.
const NEXT: i32 = -1;

#[classifier]
pub fn quic_ingress(ctx: TcContext) -> i32 {
    let _ = try_flow::<ETH>(&ctx, true);
    NEXT
}

#[classifier]
pub fn quic_egress(ctx: TcContext) -> i32 {
    let _ = try_flow::<ETH>(&ctx, false);
    NEXT
}

#[classifier]
pub fn quic_ingress_l3(ctx: TcContext) -> i32 {
    let _ = try_flow::<0>(&ctx, true);
    NEXT
}

#[classifier]
pub fn quic_egress_l3(ctx: TcContext) -> i32 {
    let _ = try_flow::<0>(&ctx, false);
    NEXT
}

struct Parsed {
    key: FlowKey,
    dir: usize,
    payload_off: usize,
    payload_len: u32,
    /// The payload's first five bytes (zero-padded when shorter).
    head: [u8; 5],
}

/// Adds `v` to a counter other CPUs may update too (one locked add; the old
/// value is not read, so it works with every BPF instruction set).
#[inline(always)]
fn add(p: &mut u64, v: u64) {
    // SAFETY: `p` points into a map value, 8-byte aligned. (The BPF target
    // has no AtomicU64::fetch_add; the intrinsic is the same instruction.)
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, v) };
}

#[inline(always)]
fn try_flow<const L2: usize>(ctx: &TcContext, ingress: bool) -> Result<(), ()> {
    let skb = unsafe { &*ctx.skb.skb };
    let proto = u16::from_be(skb.protocol as u16);
    let p = if proto == ETH_P_IP {
        parse_v4::<L2>(ctx, ingress)?
    } else if proto == ETH_P_IPV6 {
        parse_v6::<L2>(ctx, ingress)?
    } else {
        return Err(());
    };
    bump(counter::UDP_PACKETS);
    let ifindex = skb.ifindex;

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
            if FLOWS.insert(&p.key, unsafe { &*scratch }, 1).is_err() && FLOWS.get_ptr(&p.key).is_none() {
                bump(counter::FLOWS_FULL);
                return Err(());
            }
            FLOWS.get_ptr_mut(&p.key).ok_or(())?
        }
    };
    // Its first packet in this read epoch names the flow (no wake-up: user
    // space drains the ring when it reads the map). Two CPUs may both name
    // it: a second look-up, nothing lost.
    if let Some(&epoch) = FLOW_EPOCH.get(0)
        && epoch != 0
    {
        let e = unsafe { &mut (*stats).epoch };
        if *e != epoch {
            *e = epoch;
            if MOVED.output::<FlowKey>(&p.key, BPF_RB_NO_WAKEUP as u64).is_err() {
                bump(counter::MOVED_LOST);
            }
        }
    }
    // Checked indexing (no panic paths: the verifier rejects them).
    let d = unsafe { (*stats).dir.get_mut(p.dir).ok_or(())? };
    // The flow's client bytes before the packet, for the byte marks (read
    // without a lock: two CPUs crossing the same mark at once may both mark
    // it, and user space takes the larger count).
    let before = d.bytes[0] + d.bytes[1] + d.bytes[2];
    // A client's Initial among its first two packets: `--decrypt` ties the
    // handshake's secrets to the flow by the ClientHello random in it.
    let early = p.dir == DIR_C2S && d.packets[0] + d.packets[1] + d.packets[2] < 2;
    if p.dir == DIR_C2S && crossed(before, before + p.payload_len as u64) {
        mark(MARK_FLOW, now, before + p.payload_len as u64, 0, Some(&p.key));
    }
    if let (Some(pk), Some(by), Some(ls)) = (d.packets.get_mut(class), d.bytes.get_mut(class), d.last_ns.get_mut(class))
    {
        add(pk, segs as u64);
        // The whole payload of a super-packet (its last segment may be short).
        add(by, p.payload_len as u64);
        *ls = now;
    }
    if d.first_ns == 0 {
        d.first_ns = now;
    }
    // A server packet larger than an ACK: its time is kept, for the reply
    // evidence of the attribution (which connection was answered right after
    // a target's connect completed). Uploading clients get ACKs only, so
    // this costs a store where the server sends data, not per packet.
    if p.dir == DIR_S2C && seg_len >= REPLY_MIN {
        let n = unsafe { &mut (*stats).replies_n };
        let slot = *n as usize % REPLY_SLOTS;
        if let Some(r) = unsafe { (*stats).replies.get_mut(slot) } {
            *r = now;
        }
        *n = n.wrapping_add(1);
    }

    if d.sampling.take(now, p.head, p.dir == DIR_C2S) {
        sample(ctx, &p, now, ifindex, segs, seg_len);
    }
    if unsafe { core::ptr::read_volatile(&DECRYPT) } != 0 {
        if p.dir == DIR_C2S {
            // The client's last large packets that are shorter than its
            // full size (of a GSO/GRO batch, a short last segment), whole,
            // and the small packets after them: see `hystall_common::Snips`.
            // Full-size packets (stream data, retransmissions; a single
            // packet within `NEAR_FULL` of the size counts) are not copied, so this costs a copy where a burst ends, not one per
            // packet. `snips` holds the client's full size (high 16 bits),
            // the count of its large runs mod 16 (bits 12..16) and of small
            // packets since the last large one (low 12 bits).
            let st = unsafe { &mut (*stats).snips };
            // Full size: the segment size of the client's last batch (not the
            // largest packet: quic-go's path-MTU probes are larger), else the
            // largest single packet.
            let full = if segs > 1 { seg_len.min(0xffff) } else { (*st >> 16).max(seg_len.min(0xffff)) };
            let kept = *st & 0xffff;
            let last =
                if segs > 1 { p.payload_len.saturating_sub((segs - 1).saturating_mul(seg_len)) } else { seg_len };
            let last_off = p.payload_off as u32 + (segs - 1) * seg_len;
            let kept = if last as usize > SNIP_BYTES {
                let short = if segs > 1 { last < full } else { last + NEAR_FULL < full };
                if short {
                    snip(ctx, &p.key, last_off, now, u64::from(last));
                }
                // A large packet: the small ones count from 0 again, the
                // run count stays.
                kept & !SMALL_MASK
            } else if last > 0 {
                // The first after each large run takes its turn among the
                // firsts (run `g`), the next few stay until the next run,
                // later ones take turns (`hystall_common::SNIPS`).
                let k = (kept & SMALL_MASK) as usize;
                let g = kept >> RUN_SHIFT;
                let slot = if k == 0 {
                    g as usize % SNIPS_FIRST
                } else if k <= SNIPS_AFTER {
                    SNIPS_FIRST + k - 1
                } else {
                    SNIPS_FIRST + SNIPS_AFTER + (k - 1 - SNIPS_AFTER) % (SNIPS - SNIPS_FIRST - SNIPS_AFTER)
                };
                snip(ctx, &p.key, last_off, now, ((slot as u64 + 1) << 32) | u64::from(last));
                let g = if k == 0 { (g + 1) & RUN_MASK } else { g };
                let k = if (k as u32) < SMALL_MASK { k as u32 + 1 } else { SNIPS_AFTER as u32 + 1 };
                (g << RUN_SHIFT) | k
            } else {
                kept
            };
            *st = (full << 16) | kept;
        }
        pass(ctx, &p, now, seg_len, early && is_initial(&p.head));
    }
    Ok(())
}

/// A QUIC v1 or v2 Initial packet (long header, its version's Initial type).
#[inline(always)]
fn is_initial(head: &[u8; 5]) -> bool {
    let ty = (head[0] >> 4) & 3;
    head[0] & 0x80 != 0
        && match [head[1], head[2], head[3], head[4]] {
            [0, 0, 0, 1] => ty == 0,
            [0x6b, 0x33, 0x43, 0xcf] => ty == 1,
            _ => false,
        }
}

/// Keeps a client packet (at `off` in the skb) in the flow's tail slot
/// (`slot` None) or small slot `slot`. A subprogram of its own (not
/// inlined): three call sites inlined into four programs overflow the
/// verifier's budget.
#[inline(never)]
fn snip(ctx: &TcContext, key: &FlowKey, off: u32, now: u64, slot_len: u64) {
    // (slot + 1) << 32 | len, slot 0 meaning the tail ring: BPF calls take
    // at most five arguments.
    let len = slot_len as u32;
    let slot = match (slot_len >> 32) as usize {
        0 => None,
        s => Some(s - 1),
    };
    let snips = match SNIPPED.get_ptr_mut(key) {
        Some(s) => s,
        None => {
            let Some(scratch) = SNIP_SCRATCH.get_ptr_mut(0) else { return };
            // Only the lengths and the ring's position: zeroing 26 KiB of
            // bytes would be thousands of stores on every path the verifier
            // walks, and a slot whose length is zero is never read (its
            // time neither). Eight bytes at a time, written out: LLVM turns
            // whole-array stores this large into a byte loop, which the
            // verifier walks once per byte and per path (over its 1M).
            unsafe {
                zero_u32s(&mut (*scratch).tail_len);
                (*scratch).tail_next = 0;
                zero_u32s(&mut (*scratch).len);
            }
            if SNIPPED.insert(key, unsafe { &*scratch }, 0).is_err() {
                return;
            }
            match SNIPPED.get_ptr_mut(key) {
                Some(s) => s,
                None => return,
            }
        }
    };
    if len == 0 {
        return;
    }
    let skb = ctx.skb.skb as *const _;
    unsafe {
        match slot {
            None => {
                // 1..=TAIL_BYTES, shown to the verifier with a mask: it
                // proves 1..=2048, and the last slot's 2048 bytes still end
                // inside the map value (the small slots follow).
                let n = (((len as usize).min(TAIL_BYTES) - 1) & (PACKET_MAX - 1)) + 1;
                // Bounds the verifier can follow (it does not track `%`).
                let i = (*snips).tail_next as usize;
                let i = if i < TAILS { i } else { 0 };
                let Some(dst) = (*snips).tails.get_mut(i) else { return };
                if bpf_skb_load_bytes(skb, off, dst.as_mut_ptr().cast(), n as u32) == 0
                    && let (Some(t), Some(l)) = ((*snips).tail_ts_ns.get_mut(i), (*snips).tail_len.get_mut(i))
                {
                    *t = now;
                    *l = n as u32;
                    (*snips).tail_next = if i + 1 < TAILS { i as u32 + 1 } else { 0 };
                }
            }
            Some(i) => {
                let i = i & (SNIPS - 1);
                let n = (((len as usize).min(SNIP_BYTES) - 1) & (SNIP_BYTES - 1)) + 1;
                let Some(dst) = (*snips).bytes.get_mut(i) else { return };
                if bpf_skb_load_bytes(skb, off, dst.as_mut_ptr().cast(), n as u32) != 0 {
                    return;
                }
                if let (Some(t), Some(l)) = ((*snips).ts_ns.get_mut(i), (*snips).len.get_mut(i)) {
                    *t = now;
                    *l = n as u32;
                }
            }
        }
    }
}

/// Zeroes 16 `u32`s as 8 stores of 8 bytes (see `snip`).
#[inline(always)]
fn zero_u32s(a: &mut [u32; 16]) {
    let p = a.as_mut_ptr().cast::<u64>();
    // SAFETY: 16 u32s are 8 u64s; the map value is 8-aligned (repr(C) with
    // u64 fields first) and these arrays start at 8-byte offsets.
    unsafe {
        core::ptr::write_volatile(p, 0);
        core::ptr::write_volatile(p.add(1), 0);
        core::ptr::write_volatile(p.add(2), 0);
        core::ptr::write_volatile(p.add(3), 0);
        core::ptr::write_volatile(p.add(4), 0);
        core::ptr::write_volatile(p.add(5), 0);
        core::ptr::write_volatile(p.add(6), 0);
        core::ptr::write_volatile(p.add(7), 0);
    }
}

/// Passes a packet of a selected flow to user space, within its budget, and
/// a client's Initial (`initial`: one or two per connection).
#[inline(always)]
fn pass(ctx: &TcContext, p: &Parsed, now: u64, seg_len: u32, initial: bool) {
    let b = SELECTED.get_ptr_mut(&p.key);
    if b.is_none() && !initial {
        return;
    }
    let avail = (ctx.len() as usize).saturating_sub(p.payload_off).min(seg_len as usize);
    if avail == 0 {
        return;
    }
    if let Some(b) = b {
        unsafe {
            if now.saturating_sub((*b).window_ns) >= 1_000_000_000 {
                (*b).window_ns = now;
                (*b).bytes = 0;
            }
            if (*b).bytes + avail as u64 > SELECTED_BYTES_PER_SEC {
                bump(counter::PACKETS_LOST);
                return;
            }
            (*b).bytes += avail as u64;
        }
    }
    let Some(mut entry) = PACKETS.reserve::<FlowPacket>(0) else {
        bump(counter::PACKETS_LOST);
        return;
    };
    let e = entry.as_mut_ptr();
    let n = ((avail.min(PACKET_MAX) - 1) & (PACKET_MAX - 1)) + 1;
    unsafe {
        (*e).key = p.key;
        (*e).ts_ns = now;
        (*e).dir = p.dir as u32;
        (*e).caplen = 0;
        if bpf_skb_load_bytes(ctx.skb.skb as *const _, p.payload_off as u32, (*e).bytes.as_mut_ptr().cast(), n as u32)
            == 0
        {
            (*e).caplen = n as u32;
        }
    }
    entry.submit(wakeup(&PACKETS, PACKETS_RING_BYTES));
}

#[inline(always)]
fn watched(port: u16) -> Result<(), ()> {
    if PORTS.get(port as u32).copied().unwrap_or(0) != 0 { Ok(()) } else { Err(()) }
}

/// The packet's first `n` bytes as a bounds-checked pointer for direct reads,
/// pulling them into the linear part first if they are not there (a driver
/// that left the headers in fragments); None if the packet is shorter.
#[inline(always)]
fn linear(ctx: &TcContext, n: usize) -> Option<*const u8> {
    if ctx.data() + n <= ctx.data_end() {
        return Some(ctx.data() as *const u8);
    }
    if (ctx.len() as usize) < n || ctx.pull_data(n as u32).is_err() {
        return None;
    }
    (ctx.data() + n <= ctx.data_end()).then(|| ctx.data() as *const u8)
}

/// Reads a `T` at a constant offset the caller checked with `linear`.
#[inline(always)]
unsafe fn at<T: Copy>(base: *const u8, off: usize) -> T {
    unsafe { core::ptr::read_unaligned(base.add(off) as *const T) }
}

/// Reads a `T` at `off` in the packet with `bpf_skb_load_bytes` (the slow
/// path: IPv4 options, short payloads).
#[inline(always)]
fn rd<T>(ctx: &TcContext, off: usize) -> Result<T, i64> {
    ctx.load(off)
}

/// Direction, flow key and payload length from the UDP ports, if the packet
/// is on a watched port.
#[inline(always)]
fn ports(sport: u16, dport: u16, ingress: bool, key: &mut FlowKey) -> Result<usize, ()> {
    if ingress {
        watched(dport)?;
        key.client_port = sport;
        key.server_port = dport;
        Ok(DIR_C2S)
    } else {
        watched(sport)?;
        key.client_port = dport;
        key.server_port = sport;
        Ok(DIR_S2C)
    }
}

/// The UDP payload length: the UDP length field of a GSO super-packet may
/// describe one segment or the whole; the skb length is what is really there.
#[inline(always)]
fn payload_len(ctx: &TcContext, udp_len: u32, payload_off: usize) -> u32 {
    let in_skb = (ctx.len() as usize).saturating_sub(payload_off) as u32;
    if udp_len >= 8 && udp_len - 8 <= in_skb { udp_len - 8 } else { in_skb }
}

#[inline(always)]
fn parse_v4<const L2: usize>(ctx: &TcContext, ingress: bool) -> Result<Parsed, ()> {
    // IPv4 without options and the UDP header, read in place: fixed offsets.
    let h = linear(ctx, L2 + 20 + 8).ok_or(())?;
    let (vihl, frag, proto) = unsafe { (at::<u8>(h, L2), at::<u16>(h, L2 + 6), at::<u8>(h, L2 + 9)) };
    if proto != IPPROTO_UDP {
        return Err(());
    }
    if u16::from_be(frag) & 0x1fff != 0 {
        // A later fragment has no UDP header: counted, not guessed.
        bump(counter::UNPARSED);
        return Err(());
    }
    if vihl != 0x45 {
        return parse_v4_options::<L2>(ctx, vihl, ingress);
    }
    let l4 = L2 + 20;
    let (sport, dport, udp_len) = unsafe { (at::<u16>(h, l4), at::<u16>(h, l4 + 2), at::<u16>(h, l4 + 4)) };
    let mut key = FlowKey { family: AF_INET, ..FlowKey::default() };
    let dir = ports(u16::from_be(sport), u16::from_be(dport), ingress, &mut key)?;
    // Re-checked: the verifier does not carry the bound across the lookup.
    let h = linear(ctx, L2 + 20 + 8).ok_or(())?;
    let (src, dst) = unsafe { (at::<[u8; 4]>(h, L2 + 12), at::<[u8; 4]>(h, L2 + 16)) };
    let (c, s) = if dir == DIR_C2S { (src, dst) } else { (dst, src) };
    key.client[..4].copy_from_slice(&c);
    key.server[..4].copy_from_slice(&s);
    let payload_off = l4 + 8;
    let head = head(ctx, L2 + 20 + 8);
    Ok(Parsed { key, dir, payload_off, payload_len: payload_len(ctx, u16::from_be(udp_len) as u32, payload_off), head })
}

/// IPv4 with options (rare): a variable header length, read with helpers.
#[inline(always)]
fn parse_v4_options<const L2: usize>(ctx: &TcContext, vihl: u8, ingress: bool) -> Result<Parsed, ()> {
    if vihl >> 4 != 4 || vihl & 0x0f < 5 {
        return Err(());
    }
    let l4 = L2 + ((vihl & 0x0f) as usize) * 4;
    let sport = u16::from_be(rd(ctx, l4).map_err(|_| ())?);
    let dport = u16::from_be(rd(ctx, l4 + 2).map_err(|_| ())?);
    let udp_len = u16::from_be(rd(ctx, l4 + 4).map_err(|_| ())?) as u32;
    let mut key = FlowKey { family: AF_INET, ..FlowKey::default() };
    let dir = ports(sport, dport, ingress, &mut key)?;
    let src: [u8; 4] = rd(ctx, L2 + 12).map_err(|_| ())?;
    let dst: [u8; 4] = rd(ctx, L2 + 16).map_err(|_| ())?;
    let (c, s) = if dir == DIR_C2S { (src, dst) } else { (dst, src) };
    key.client[..4].copy_from_slice(&c);
    key.server[..4].copy_from_slice(&s);
    let payload_off = l4 + 8;
    let head = rd(ctx, payload_off).unwrap_or_else(|_| [rd(ctx, payload_off).unwrap_or(0), 0, 0, 0, 0]);
    Ok(Parsed { key, dir, payload_off, payload_len: payload_len(ctx, udp_len, payload_off), head })
}

#[inline(always)]
fn parse_v6<const L2: usize>(ctx: &TcContext, ingress: bool) -> Result<Parsed, ()> {
    let h = linear(ctx, L2 + 40 + 8).ok_or(())?;
    let next = unsafe { at::<u8>(h, L2 + 6) };
    if next != IPPROTO_UDP {
        // Extension headers (rare on QUIC paths) are not walked.
        if next == 0 || next == 43 || next == 44 || next == 60 {
            bump(counter::UNPARSED);
        }
        return Err(());
    }
    let l4 = L2 + 40;
    let (sport, dport, udp_len) = unsafe { (at::<u16>(h, l4), at::<u16>(h, l4 + 2), at::<u16>(h, l4 + 4)) };
    let mut key = FlowKey { family: AF_INET6, ..FlowKey::default() };
    let dir = ports(u16::from_be(sport), u16::from_be(dport), ingress, &mut key)?;
    let h = linear(ctx, L2 + 40 + 8).ok_or(())?;
    let (src, dst) = unsafe { (at::<[u8; 16]>(h, L2 + 8), at::<[u8; 16]>(h, L2 + 24)) };
    (key.client, key.server) = if dir == DIR_C2S { (src, dst) } else { (dst, src) };
    let payload_off = l4 + 8;
    let head = head(ctx, L2 + 40 + 8);
    Ok(Parsed { key, dir, payload_off, payload_len: payload_len(ctx, u16::from_be(udp_len) as u32, payload_off), head })
}

/// The first five bytes of a payload at `off`, a constant at each call site
/// (the verifier needs the bound and the read on the same constant offset);
/// zero-padded when shorter.
#[inline(always)]
fn head(ctx: &TcContext, off: usize) -> [u8; 5] {
    if ctx.data() + off + 5 <= ctx.data_end() {
        // SAFETY: bounds checked just above.
        return unsafe { at::<[u8; 5]>(ctx.data() as *const u8, off) };
    }
    rd(ctx, off).unwrap_or_else(|_| [rd(ctx, off).unwrap_or(0), 0, 0, 0, 0])
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
    entry.submit(wakeup(&FLOW_SAMPLES, SAMPLES_RING_BYTES));
}
