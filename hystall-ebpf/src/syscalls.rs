//! `raw_syscalls/sys_enter` and `sys_exit`: send-family syscalls in flight.
//!
//! A blocking writer sits inside write()/sendmsg() while the socket is full and
//! `sock_send_length` fires only when it returns, so user space times the
//! syscall itself from this table (thread id → fd, start).

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use hystall_common::InflightSend;

use crate::maps::{INFLIGHT, current_ids, monitored, now_ns, send_syscalls, tp_offsets};

#[tracepoint(category = "raw_syscalls", name = "sys_enter")]
pub fn sys_enter(ctx: TracePointContext) -> u32 {
    match try_enter(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

fn try_enter(ctx: &TracePointContext) -> Result<(), ()> {
    let offs = tp_offsets();
    let nr: i64 = unsafe { ctx.read_at(offs.enter_id as usize) }.map_err(|_| ())?;
    let calls = send_syscalls();
    // Cheapest test first: this runs on every syscall of the machine.
    if nr < 0 || !calls.contains(nr as u32) {
        return Err(());
    }
    let (tgid, tid) = current_ids();
    if !monitored(tgid) {
        return Err(());
    }
    let fd: u64 = unsafe { ctx.read_at(offs.enter_args as usize) }.map_err(|_| ())?;
    let count: u64 = unsafe { ctx.read_at(offs.enter_args as usize + 16) }.map_err(|_| ())?;
    let entry = InflightSend { tgid, nr: nr as u32, fd, count, start_ns: now_ns() };
    INFLIGHT.insert(&tid, &entry, 0).map_err(|_| ())
}

#[tracepoint(category = "raw_syscalls", name = "sys_exit")]
pub fn sys_exit(ctx: TracePointContext) -> u32 {
    match try_exit(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

fn try_exit(ctx: &TracePointContext) -> Result<(), ()> {
    let offs = tp_offsets();
    let nr: i64 = unsafe { ctx.read_at(offs.exit_id as usize) }.map_err(|_| ())?;
    if nr < 0 || !send_syscalls().contains(nr as u32) {
        return Err(());
    }
    let (_, tid) = current_ids();
    INFLIGHT.remove(&tid).map_err(|_| ())
}
