//! Socket lifecycle: `inet_sock_set_state` (BTF tracepoint, for the cookie) and
//! `tcp/tcp_destroy_sock` (classic, it carries the cookie).
//!
//! CLOSE → SYN_SENT happens inside connect(), in the connecting task: that is how
//! an outbound target socket of a monitored process is told from an accepted one.

use aya_ebpf::{
    helpers::generated::bpf_get_socket_cookie,
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use hystall_common::{SOCK_OUTBOUND, SockEventKind, TCP_CLOSE, TCP_SYN_SENT};

use crate::maps::{
    SOCKS, current_ids, emit, is_tcp, monitored, now_ns, read_tuple, sock_offsets, tp_offsets, track_sock,
};

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
    let cookie = unsafe { bpf_get_socket_cookie(sk as *mut _) };
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
