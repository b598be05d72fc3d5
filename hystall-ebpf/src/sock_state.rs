//! Socket lifecycle: `inet_sock_set_state` (BTF tracepoint, for the cookie) and
//! `tcp/tcp_destroy_sock` (classic, it carries the cookie), and the cgroup
//! connect hooks that make the kernel generate a cookie where tracing programs
//! cannot ask for one (before Linux 5.12).
//!
//! CLOSE → SYN_SENT happens inside connect(), in the connecting task: that is how
//! an outbound target socket of a monitored process is told from an accepted one.

use aya_ebpf::{
    helpers::generated::bpf_get_socket_cookie,
    macros::{btf_tracepoint, cgroup_sock_addr, tracepoint},
    programs::{BtfTracePointContext, SockAddrContext, TracePointContext},
};
use hystall_common::{SOCK_OUTBOUND, SockEventKind, TCP_CLOSE, TCP_SYN_SENT};

use crate::maps::{
    SOCKS, current_ids, emit, is_tcp, monitored, now_ns, read_tuple, sk_cookie, sock_offsets, tp_offsets, track_sock,
};

/// Before Linux 5.12 a tracing program reads the cookie from the socket, and
/// the kernel makes one only when something asks (sock_diag, SO_COOKIE...):
/// at `connect()` nobody has, and `inet_sock_set_state` would find 0. These
/// cgroup hooks run in `connect()` just before the socket enters SYN_SENT and
/// ask for it (`bpf_get_socket_cookie` is allowed here since 5.0). They never
/// change the connect: 1 = let it proceed.
#[cgroup_sock_addr(connect4)]
pub fn cookie_connect4(ctx: SockAddrContext) -> i32 {
    unsafe { bpf_get_socket_cookie(ctx.sock_addr as *mut _) };
    1
}

#[cgroup_sock_addr(connect6)]
pub fn cookie_connect6(ctx: SockAddrContext) -> i32 {
    unsafe { bpf_get_socket_cookie(ctx.sock_addr as *mut _) };
    1
}

#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn inet_sock_set_state(ctx: BtfTracePointContext) -> i32 {
    match try_set_state(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

fn try_set_state(ctx: &BtfTracePointContext) -> Result<(), ()> {
    let sk: *const u8 = ctx.arg(0);
    let old: i32 = ctx.arg(1);
    let new: i32 = ctx.arg(2);
    let offs = sock_offsets();
    if sk.is_null() || !is_tcp(sk, &offs) {
        return Err(());
    }
    let cookie = sk_cookie(sk, &offs);
    if cookie == 0 {
        // Not generated (before 5.12, a socket nobody asked about): not ours.
        return Err(());
    }
    let now = now_ns();
    let arg = ((old as u32 & 0xff) << 8) | (new as u32 & 0xff);

    let stats = match SOCKS.get_ptr_mut(&cookie) {
        Some(p) => p,
        None => {
            // Only a connect() by a monitored process starts tracking here; other
            // sockets are picked up at their first send.
            let (tgid, _) = current_ids();
            if !(old as u32 == TCP_CLOSE && new as u32 == TCP_SYN_SENT && monitored(tgid)) {
                return Err(());
            }
            track_sock(cookie, sk, &offs, now, SOCK_OUTBOUND).ok_or(())?
        }
    };
    let st = unsafe { &mut *stats };
    st.state = new as u32;
    // The source port is bound after SYN_SENT is set: refresh the tuple when
    // the connect completes (or while it has no port); the other changes
    // keep it (seven kernel reads saved on each).
    if old as u32 == TCP_SYN_SENT || st.tuple.sport == 0 {
        st.tuple = read_tuple(sk, &offs);
    }
    emit(SockEventKind::State, arg, now, cookie, stats);
    Ok(())
}

#[tracepoint(category = "tcp", name = "tcp_destroy_sock")]
pub fn tcp_destroy_sock(ctx: TracePointContext) -> u32 {
    match try_destroy(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

fn try_destroy(ctx: &TracePointContext) -> Result<(), ()> {
    let offs = tp_offsets();
    let cookie: u64 = unsafe { ctx.read_at(offs.destroy_cookie as usize) }.map_err(|_| ())?;
    let stats = SOCKS.get_ptr(&cookie).ok_or(())?;
    emit(SockEventKind::Destroyed, 0, now_ns(), cookie, stats);
    let _ = SOCKS.remove(&cookie);
    Ok(())
}
