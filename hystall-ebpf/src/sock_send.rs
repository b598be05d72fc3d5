//! `sock_send_length` (BTF tracepoint): the result of every send on a socket.
//!
//! Runs in the writer's context at the end of `sock_sendmsg`, so the tgid is the
//! owner's. Go servers write on non-blocking sockets: a stalled Write is one
//! `-EAGAIN` and then nothing, so "blocked since" is the first failed (or short)
//! send after the last send that moved all its bytes.

use aya_ebpf::{helpers::generated::bpf_get_socket_cookie, macros::btf_tracepoint, programs::BtfTracePointContext};
use hystall_common::{MARK_SEND, SOCK_OUTBOUND, SockEventKind, SockStats, crossed};

use crate::maps::{
    SOCKS, current_ids, emit, inflight, is_tcp, mark, monitored, now_ns, read_at, send_syscalls, sock_offsets,
    track_sock,
};

const EAGAIN: i32 = 11;

#[btf_tracepoint(function = "sock_send_length")]
pub fn sock_send_length(ctx: BtfTracePointContext) -> i32 {
    match try_sock_send_length(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

fn try_sock_send_length(ctx: &BtfTracePointContext) -> Result<(), ()> {
    let (tgid, tid) = current_ids();
    if !monitored(tgid) {
        return Err(());
    }
    let sk: *const u8 = ctx.arg(0);
    let ret: i32 = ctx.arg(1);
    let offs = sock_offsets();
    if sk.is_null() || !is_tcp(sk, &offs) {
        return Err(());
    }
    let cookie = unsafe { bpf_get_socket_cookie(sk as *mut _) };
    let now = now_ns();

    let stats: *mut SockStats = match SOCKS.get_ptr_mut(&cookie) {
        Some(p) => p,
        None => track_sock(cookie, sk, &offs, now, 0).ok_or(())?,
    };
    let st = unsafe { &mut *stats };
    st.send_calls += 1;

    // A send that leaves the buffer full (sk_wmem_queued >= sk_sndbuf) is both
    // progress and the start of a block: the writer's next send cannot proceed.
    // tokio, for one, does not even try it (a short write clears its readiness),
    // so this, not EAGAIN, is often the only sign. A short write/sendto (fewer
    // bytes than asked, when the syscall probes are attached) says the same.
    let asked = match inflight(tid) {
        Some(f) if send_syscalls().has_count(f.nr) => f.count,
        _ => 0,
    };
    let buffer_full = {
        let queued: i32 = unsafe { read_at(sk, offs.sk_wmem_queued) };
        let sndbuf: i32 = unsafe { read_at(sk, offs.sk_sndbuf) };
        offs.sk_sndbuf != 0 && sndbuf > 0 && queued >= sndbuf
    };

    if ret > 0 {
        // Byte marks of target sockets only (the process connected them):
        // what a proxy sends back to its own TCP clients is not wanted.
        if st.flags & SOCK_OUTBOUND != 0 && crossed(st.send_bytes, st.send_bytes + ret as u64) {
            mark(MARK_SEND, now, st.send_bytes + ret as u64, cookie, None);
        }
        st.send_bytes += ret as u64;
        st.last_send_ns = now;
        st.last_errno = 0;
        if asked > ret as u64 || buffer_full {
            st.short_sends += 1;
            if st.blocked_since_ns == 0 {
                st.blocked_since_ns = now;
                emit(SockEventKind::Blocked, 0, now, cookie, stats);
            }
        } else if st.blocked_since_ns != 0 {
            st.blocked_since_ns = 0;
            emit(SockEventKind::Unblocked, 0, now, cookie, stats);
        }
    } else if ret < 0 {
        let errno = -ret;
        if errno == EAGAIN {
            st.send_eagain += 1;
        } else {
            st.send_errors += 1;
        }
        st.last_errno = errno;
        // Only "would block" is a block: EPIPE, ECONNRESET... end the copy, the
        // writer gives up on the socket, and nothing is waiting on it.
        if errno == EAGAIN && st.blocked_since_ns == 0 {
            st.blocked_since_ns = now;
            emit(SockEventKind::Blocked, errno as u32, now, cookie, stats);
        }
    }
    Ok(())
}
