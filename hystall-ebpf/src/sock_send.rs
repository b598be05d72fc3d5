//! The result of every send on a TCP socket, from whichever hook the running
//! kernel has (user space attaches one, `sources::kernel::probes`):
//!
//! - `sock_send_length` (BTF tracepoint, Linux 6.4+) at the end of
//!   `sock_sendmsg`;
//! - else fexit on `tcp_sendmsg` (BTF trampolines, 5.5+; not on every build:
//!   our 6.18 development kernel attaches neither fentry nor fexit).
//!
//! Both run in the writer's context, so the tgid is the owner's. Go servers
//! write on non-blocking sockets: a stalled Write is one `-EAGAIN` and then
//! nothing, so "blocked since" is the first failed (or short) send after the
//! last send that moved all its bytes.

use aya_ebpf::{
    macros::{btf_tracepoint, fexit},
    programs::{BtfTracePointContext, FExitContext},
};
use hystall_common::{MARK_SEND, SOCK_OUTBOUND, SockEventKind, SockStats, crossed};

use crate::maps::{
    SOCKS, buffer_full, current_ids, emit, inflight, is_tcp, mark, monitored, now_ns, send_syscalls, sk_cookie,
    sock_offsets, track_sock,
};

const EAGAIN: i32 = 11;

#[btf_tracepoint(function = "sock_send_length")]
pub fn sock_send_length(ctx: BtfTracePointContext) -> i32 {
    let sk: *const u8 = ctx.arg(0);
    let ret: i32 = ctx.arg(1);
    // The tracepoint does not say how much was asked for.
    match on_send(sk, ret, 0) {
        Ok(()) | Err(()) => 0,
    }
}

/// `int tcp_sendmsg(struct sock *sk, struct msghdr *msg, size_t size)`: an
/// fexit program sees the arguments, then the return value as one more.
#[fexit(function = "tcp_sendmsg")]
pub fn tcp_sendmsg_exit(ctx: FExitContext) -> i32 {
    let sk: *const u8 = ctx.arg(0);
    let size: u64 = ctx.arg(2);
    let ret: i64 = ctx.arg(3);
    match on_send(sk, ret as i32, size) {
        Ok(()) | Err(()) => 0,
    }
}

/// `size`: the bytes asked for, when the hook says (fexit), else 0.
fn on_send(sk: *const u8, ret: i32, size: u64) -> Result<(), ()> {
    let (tgid, tid) = current_ids();
    if !monitored(tgid) {
        return Err(());
    }
    let offs = sock_offsets();
    if sk.is_null() || !is_tcp(sk, &offs) {
        return Err(());
    }
    let cookie = sk_cookie(sk, &offs);
    if cookie == 0 {
        // No cookie yet (kernels before 5.12 only): nothing could join it.
        return Err(());
    }
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
    // so this, not EAGAIN, is often the only sign. A short send (fewer bytes
    // than asked: fexit sees `size`, the syscall probes the write's count)
    // says the same, and is the surer sign: `release_sock` at the end of
    // `tcp_sendmsg` handles the ACKs that came in meanwhile, so a send cut
    // short by a full buffer can return with the buffer no longer quite full
    // but still not writeable, and the writer then waits for a wake-up that
    // never comes (seen on 6.1-rt: a non-blocking writer never flagged).
    let asked = match inflight(tid) {
        Some(f) if send_syscalls().has_count(f.nr) => f.count.max(size),
        _ => size,
    };
    let full = buffer_full(sk, &offs);

    if ret > 0 {
        // Byte marks of target sockets only (the process connected them):
        // what a proxy sends back to its own TCP clients is not wanted.
        if st.flags & SOCK_OUTBOUND != 0 && crossed(st.send_bytes, st.send_bytes + ret as u64) {
            mark(MARK_SEND, now, st.send_bytes + ret as u64, cookie, None);
        }
        st.send_bytes += ret as u64;
        st.last_send_ns = now;
        st.last_errno = 0;
        if asked > ret as u64 || full {
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
