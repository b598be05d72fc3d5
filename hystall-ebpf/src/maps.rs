//! Maps, load-time globals and the helpers every program shares.

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel,
        generated::bpf_get_socket_cookie,
    },
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use hystall_common::{
    AF_INET, AF_INET6, COMM_LEN, EVENTS_RING_BYTES, FlowKey, InflightSend, MARKS_RING_BYTES, MAX_EXEC_SELECT,
    MAX_INFLIGHT, MAX_PIDS, MAX_SOCKS, Mark, SendSyscalls, SockEvent, SockEventKind, SockOffsets, SockStats, TpOffsets,
    Tuple, counter, switch,
};

/// Offsets in `struct sock`, from the running kernel's BTF.
#[unsafe(no_mangle)]
static SOCK_OFFSETS: SockOffsets = SockOffsets::ZERO;
/// Offsets in classic tracepoint records, from tracefs format files.
#[unsafe(no_mangle)]
static TP_OFFSETS: TpOffsets = TpOffsets::ZERO;
/// Send-family syscall numbers of this architecture.
#[unsafe(no_mangle)]
static SEND_SYSCALLS: SendSyscalls = SendSyscalls::NONE;
/// 1 = only processes in `PIDS` are watched; 0 = every process.
#[unsafe(no_mangle)]
static FILTER_PIDS: u8 = 0;
/// 1 = tracing programs may call `bpf_get_socket_cookie` (Linux 5.12+); 0 =
/// the cookie is read from the socket (`skc_cookie`). A constant of the
/// frozen .rodata: the verifier drops the branch not taken, so the helper
/// call a 5.10 kernel rejects in tracing programs is never even checked there.
#[unsafe(no_mangle)]
static COOKIE_HELPER: u8 = 1;

/// Monitored processes (tgid → 1).
#[map]
pub static PIDS: HashMap<u32, u8> = HashMap::with_max_entries(MAX_PIDS, 0);
/// The exec filter (`proc_exec.rs`, on with `switch::EXEC_FILTER`): the
/// selection's names as the kernel keeps a comm (cut to 15 bytes,
/// NUL-padded) and its explicit pids (tgid), → 1.
#[map]
pub static EXEC_COMMS: HashMap<[u8; COMM_LEN], u8> = HashMap::with_max_entries(MAX_EXEC_SELECT, 0);
#[map]
pub static EXEC_PIDS: HashMap<u32, u8> = HashMap::with_max_entries(MAX_EXEC_SELECT, 0);
/// Per-socket aggregates, keyed by socket cookie. LRU: a socket whose destroy we
/// missed cannot pin an entry forever.
#[map]
pub static SOCKS: LruHashMap<u64, SockStats> = LruHashMap::with_max_entries(MAX_SOCKS, 0);
/// Send syscalls in flight, keyed by thread id. LRU: a thread that dies inside
/// a send never reaches sys_exit, and its entry must not pin a slot.
#[map]
pub static INFLIGHT: LruHashMap<u32, InflightSend> = LruHashMap::with_max_entries(MAX_INFLIGHT, 0);
/// Switches user space flips at run time (`hystall_common::switch`): [0] = 1
/// while the syscall probes are attached (until then `INFLIGHT` is empty and
/// sends skip its lookup); [1] = 1 when blocks are read from zero windows;
/// [2] = 1 when only the selection's execs are handed over.
#[map]
pub static SWITCHES: Array<u32> = Array::with_max_entries(switch::LEN, 0);
/// State-change events for user space.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_RING_BYTES, 0);
/// Byte marks of client flows and target sockets (`hystall_common::mark`).
#[map]
pub static MARKS: RingBuf = RingBuf::with_byte_size(MARKS_RING_BYTES, 0);
/// Scratch space for a new `SockStats` (too large for the 512-byte BPF stack
/// once an event is built beside it).
#[map]
pub static SCRATCH: PerCpuArray<SockStats> = PerCpuArray::with_max_entries(1, 0);
/// Health counters (see `hystall_common::counter`).
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::LEN, 0);

#[inline(always)]
pub fn sock_offsets() -> SockOffsets {
    unsafe { core::ptr::read_volatile(&SOCK_OFFSETS) }
}

#[inline(always)]
pub fn tp_offsets() -> TpOffsets {
    unsafe { core::ptr::read_volatile(&TP_OFFSETS) }
}

#[inline(always)]
pub fn send_syscalls() -> SendSyscalls {
    unsafe { core::ptr::read_volatile(&SEND_SYSCALLS) }
}

/// The cookie of `sk` (the key of `SOCKS`, what sock_diag and SOCK_DESTROY
/// take), or 0 when the kernel has not generated one yet (only where it is
/// read from the socket: see `COOKIE_HELPER`).
#[inline(always)]
pub fn sk_cookie(sk: *const u8, offs: &SockOffsets) -> u64 {
    if unsafe { core::ptr::read_volatile(&COOKIE_HELPER) } != 0 {
        unsafe { bpf_get_socket_cookie(sk as *mut _) }
    } else if offs.skc_cookie != 0 {
        unsafe { read_at::<u64>(sk, offs.skc_cookie) }
    } else {
        0
    }
}

/// Whether user space turned switch `idx` on.
#[inline(always)]
pub fn switched_on(idx: u32) -> bool {
    SWITCHES.get(idx).copied().unwrap_or(0) != 0
}

#[inline(always)]
pub fn now_ns() -> u64 {
    unsafe { bpf_ktime_get_ns() }
}

/// (tgid, tid) of the current task.
#[inline(always)]
pub fn current_ids() -> (u32, u32) {
    let id = bpf_get_current_pid_tgid();
    ((id >> 32) as u32, id as u32)
}

/// Whether `tgid` is one of the processes we watch.
#[inline(always)]
pub fn monitored(tgid: u32) -> bool {
    let filter = unsafe { core::ptr::read_volatile(&FILTER_PIDS) };
    filter == 0 || unsafe { PIDS.get(&tgid) }.is_some()
}

#[inline(always)]
pub fn bump(idx: u32) {
    if let Some(p) = COUNTERS.get_ptr_mut(idx) {
        unsafe { *p += 1 };
    }
}

#[inline(always)]
pub fn comm() -> [u8; 16] {
    bpf_get_current_comm().unwrap_or([0; 16])
}

/// Reads a `T` at `off` bytes into a kernel object.
#[inline(always)]
pub unsafe fn read_at<T: Copy + Default>(base: *const u8, off: u32) -> T {
    if base.is_null() {
        return T::default();
    }
    unsafe { bpf_probe_read_kernel(base.add(off as usize) as *const T) }.unwrap_or_default()
}

/// Whether `sk` is a TCP socket (`sk->sk_protocol`).
#[inline(always)]
pub fn is_tcp(sk: *const u8, offs: &SockOffsets) -> bool {
    offs.sk_protocol != 0 && unsafe { read_at::<u16>(sk, offs.sk_protocol) } == hystall_common::IPPROTO_TCP
}

/// The 4-tuple of `sk`, read through the BTF offsets.
#[inline(always)]
pub fn read_tuple(sk: *const u8, offs: &SockOffsets) -> Tuple {
    let mut t = Tuple::default();
    unsafe {
        t.family = read_at::<u16>(sk, offs.skc_family);
        t.sport = read_at::<u16>(sk, offs.skc_num);
        t.dport = u16::from_be(read_at::<u16>(sk, offs.skc_dport));
        if t.family == AF_INET {
            let s: [u8; 4] = read_at(sk, offs.skc_rcv_saddr);
            let d: [u8; 4] = read_at(sk, offs.skc_daddr);
            t.saddr[..4].copy_from_slice(&s);
            t.daddr[..4].copy_from_slice(&d);
        } else if t.family == AF_INET6 {
            t.saddr = read_at(sk, offs.skc_v6_rcv_saddr);
            t.daddr = read_at(sk, offs.skc_v6_daddr);
        }
    }
    t
}

/// Submit flags for a ring of `size` bytes: wake user space only once an
/// eighth of it is waiting. Each wakeup is a context switch of the reader
/// (at node rates, most of its CPU); user space drains every ring on each
/// 200 ms tick anyway, so a quiet ring waits at most that long.
#[inline(always)]
pub fn wakeup(ring: &RingBuf, size: u32) -> u64 {
    if ring.query(BPF_RB_AVAIL_DATA as u64) >= u64::from(size / 8) {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// Writes an event; a full ring buffer is counted, never silent. The stats are
/// copied from the map value straight into the ring buffer (not via the stack).
#[inline(always)]
pub fn emit(kind: SockEventKind, arg: u32, ts_ns: u64, cookie: u64, stats: *const SockStats) {
    match EVENTS.reserve::<SockEvent>(0) {
        Some(mut entry) => {
            let ev = entry.as_mut_ptr();
            unsafe {
                (*ev).kind = kind as u32;
                (*ev).arg = arg;
                (*ev).ts_ns = ts_ns;
                (*ev).cookie = cookie;
                core::ptr::copy_nonoverlapping(stats, &raw mut (*ev).stats, 1);
            }
            entry.submit(wakeup(&EVENTS, EVENTS_RING_BYTES));
            bump(counter::EVENTS_SENT);
        }
        None => bump(counter::EVENTS_LOST),
    }
}

/// Writes a byte mark (a full ring buffer is counted). Rare by construction:
/// one per `MARK_BYTES` moved.
#[inline(always)]
pub fn mark(kind: u32, ts_ns: u64, bytes: u64, cookie: u64, flow: Option<&FlowKey>) {
    match MARKS.reserve::<Mark>(0) {
        Some(mut entry) => {
            let m = entry.as_mut_ptr();
            unsafe {
                (*m).kind = kind;
                (*m).cpu = 0;
                (*m).ts_ns = ts_ns;
                (*m).bytes = bytes;
                (*m).cookie = cookie;
                match flow {
                    Some(f) => (*m).flow = *f,
                    None => core::ptr::write_bytes(&raw mut (*m).flow, 0, 1),
                }
            }
            entry.submit(wakeup(&MARKS, MARKS_RING_BYTES));
        }
        None => bump(counter::MARKS_LOST),
    }
}

/// Starts tracking `cookie` for a socket first seen in the current task's
/// context, and returns a pointer to the map's entry.
#[inline(always)]
pub fn track_sock(cookie: u64, sk: *const u8, offs: &SockOffsets, now: u64, flags: u32) -> Option<*mut SockStats> {
    let (tgid, _) = current_ids();
    let scratch = SCRATCH.get_ptr_mut(0)?;
    unsafe {
        core::ptr::write_bytes(scratch, 0, 1);
        let st = &mut *scratch;
        st.tgid = tgid;
        st.comm = comm();
        st.tuple = read_tuple(sk, offs);
        st.flags = hystall_common::SOCK_HAS_TUPLE | flags;
        st.first_seen_ns = now;
    }
    let blocking = fd_blocking(sk, offs);
    if blocking {
        unsafe { (*scratch).flags |= hystall_common::SOCK_BLOCKING };
    }
    if SOCKS.insert(&cookie, unsafe { &*scratch }, 0).is_err() {
        bump(counter::MAP_FULL);
        return None;
    }
    let st = SOCKS.get_ptr_mut(&cookie)?;
    if blocking {
        emit(SockEventKind::Blocking, 0, now, cookie, st);
    }
    Some(st)
}

/// Whether the send buffer of `sk` is full (`sk_wmem_queued >= sk_sndbuf`):
/// a writer's next send cannot queue anything and blocks (or fails with
/// EAGAIN) until the peer acknowledges data.
#[inline(always)]
pub fn buffer_full(sk: *const u8, offs: &SockOffsets) -> bool {
    let queued: i32 = unsafe { read_at(sk, offs.sk_wmem_queued) };
    let sndbuf: i32 = unsafe { read_at(sk, offs.sk_sndbuf) };
    offs.sk_sndbuf != 0 && sndbuf > 0 && queued >= sndbuf
}

/// Whether a writer waiting on `sk` stays waiting: the kernel wakes it (and
/// epoll reports the socket writable) only once the free space is at least
/// half the queued bytes (`sk_stream_is_writeable`: `sk_sndbuf -
/// sk_wmem_queued >= sk_wmem_queued / 2`). Send buffer autotuning may grow
/// `sk_sndbuf` after the writer parked, so "full" is the wrong test here.
#[inline(always)]
pub fn not_writeable(sk: *const u8, offs: &SockOffsets) -> bool {
    let queued: i32 = unsafe { read_at(sk, offs.sk_wmem_queued) };
    let sndbuf: i32 = unsafe { read_at(sk, offs.sk_sndbuf) };
    offs.sk_sndbuf != 0 && queued > 0 && sndbuf.saturating_sub(queued) < queued / 2
}

/// Whether the socket's fd is in blocking mode (`sk->sk_socket->file->f_flags`
/// without `O_NONBLOCK`). Read when a socket is first tracked and when its
/// peer's window closes (`tcp_probe`), not per send. Go, tokio and most proxies
/// make every socket non-blocking; false when a pointer is missing (a socket
/// being torn down) or the offsets are unknown.
#[inline(always)]
pub fn fd_blocking(sk: *const u8, offs: &SockOffsets) -> bool {
    if offs.sk_socket == 0 || offs.file_f_flags == 0 {
        return false;
    }
    let sock = unsafe { read_at::<u64>(sk, offs.sk_socket) } as *const u8;
    let file = unsafe { read_at::<u64>(sock, offs.socket_file) } as *const u8;
    if file.is_null() {
        return false;
    }
    let flags: u32 = unsafe { read_at(file, offs.file_f_flags) };
    flags & hystall_common::O_NONBLOCK == 0
}

/// The in-flight send of thread `tid`, if any (an array test first: the hash
/// lookup is most of a send's cost, and the table is empty while the
/// syscall probes are not attached, which is the usual case).
#[inline(always)]
pub fn inflight(tid: u32) -> Option<InflightSend> {
    if !switched_on(switch::SYSCALLS) {
        return None;
    }
    unsafe { INFLIGHT.get(&tid) }.copied()
}
