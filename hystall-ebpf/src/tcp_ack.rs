//! `tcp/tcp_probe`: every segment received on an established socket. For our
//! sockets it tells whether the peer still acknowledges new data (snd_una moves)
//! and what window it offers; a never-reading target answers zero-window probes
//! with the same snd_una and a zero window forever.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use hystall_common::{SOCK_ZERO_WINDOW, SockEventKind};

use crate::maps::{SOCKS, emit, now_ns, tp_offsets};

#[tracepoint(category = "tcp", name = "tcp_probe")]
pub fn tcp_probe(ctx: TracePointContext) -> u32 {
    match try_tcp_probe(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

fn try_tcp_probe(ctx: &TracePointContext) -> Result<(), ()> {
    let offs = tp_offsets();
    let cookie: u64 = unsafe { ctx.read_at(offs.probe_cookie as usize) }.map_err(|_| ())?;
    let stats = SOCKS.get_ptr_mut(&cookie).ok_or(())?;
    let st = unsafe { &mut *stats };
    let una: u32 = unsafe { ctx.read_at(offs.probe_snd_una as usize) }.map_err(|_| ())?;
    let nxt: u32 = unsafe { ctx.read_at(offs.probe_snd_nxt as usize) }.map_err(|_| ())?;
    let wnd: u32 = unsafe { ctx.read_at(offs.probe_snd_wnd as usize) }.map_err(|_| ())?;
    let now = now_ns();

    st.acks += 1;
    // snd_una is the value before this ACK is processed; an advance shows up on
    // the next segment, which for a stalled peer is its zero-window probe reply.
    if st.snd_una != 0 && una != st.snd_una {
        let delta = una.wrapping_sub(st.snd_una);
        // Sequence numbers wrap; a "negative" delta is reordering, not progress.
        if delta < (1 << 31) {
            st.acked_bytes += delta as u64;
            st.last_ack_ns = now;
        }
    }
    st.snd_una = una;
    st.snd_nxt = nxt;
    st.snd_wnd = wnd;

    let was_zero = st.flags & SOCK_ZERO_WINDOW != 0;
    let is_zero = wnd == 0;
    if was_zero != is_zero {
        st.flags ^= SOCK_ZERO_WINDOW;
        emit(SockEventKind::Window, wnd, now, cookie, stats);
    }
    Ok(())
}
