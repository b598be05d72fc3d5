//! `tcp_probe` (BTF tracepoint: sk, skb): every segment received on an
//! established socket. For our sockets it tells whether the peer still
//! acknowledges new data (snd_una moves) and what window it offers; a
//! never-reading target answers zero-window probes with the same snd_una and a
//! zero window forever. BTF, not the classic tracepoint: this fires for every
//! incoming segment of the machine, and a classic one builds a record each time.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use hystall_common::{SOCK_BLOCKING, SOCK_ZERO_WINDOW, SockEventKind, switch};

use crate::maps::{SOCKS, emit, fd_blocking, not_writeable, now_ns, read_at, sk_cookie, sock_offsets, switched_on};

#[btf_tracepoint(function = "tcp_probe")]
pub fn tcp_probe(ctx: BtfTracePointContext) -> i32 {
    match try_tcp_probe(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

fn try_tcp_probe(ctx: &BtfTracePointContext) -> Result<(), ()> {
    let sk: *const u8 = ctx.arg(0);
    if sk.is_null() {
        return Err(());
    }
    let offs = sock_offsets();
    // Cheapest test first: most segments belong to sockets we do not track.
    let cookie = sk_cookie(sk, &offs);
    let stats = SOCKS.get_ptr_mut(&cookie).ok_or(())?;
    let st = unsafe { &mut *stats };
    // The values before this segment is processed, as the tracepoint sees them.
    let una: u32 = unsafe { read_at(sk, offs.tcp_snd_una) };
    let nxt: u32 = unsafe { read_at(sk, offs.tcp_snd_nxt) };
    let wnd: u32 = unsafe { read_at(sk, offs.tcp_snd_wnd) };
    let now = now_ns();

    st.acks += 1;
    // An advance shows up on the next segment, which for a stalled peer is its
    // zero-window probe reply.
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
        // A writer may have made its socket blocking after it was tracked
        // (a connect with a timeout, done non-blocking, then blocking
        // writes): looked at again when the peer's window closes, which is
        // rare, and when such a writer parks.
        if is_zero && st.flags & SOCK_BLOCKING == 0 && fd_blocking(sk, &offs) {
            st.flags |= SOCK_BLOCKING;
            emit(SockEventKind::Blocking, 0, now, cookie, stats);
        }
    }
    if switched_on(switch::ZERO_WINDOW) {
        let parked = not_writeable(sk, &offs);
        if is_zero && parked && st.blocked_since_ns == 0 {
            st.blocked_since_ns = now;
            emit(SockEventKind::Blocked, 0, now, cookie, stats);
        } else if !parked && st.blocked_since_ns != 0 {
            // Room in the buffer again: the writer is woken and goes on.
            st.blocked_since_ns = 0;
            emit(SockEventKind::Unblocked, 0, now, cookie, stats);
        }
    }
    Ok(())
}
