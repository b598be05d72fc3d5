//! `sys_enter` and `sys_exit` (raw tracepoints): send-family syscalls in flight.
//!
//! A blocking writer sits inside write()/sendmsg() while the socket is full and
//! `sock_send_length` fires only when it returns, so user space times the
//! syscall itself from this table (thread id → fd, start). These run on every
//! syscall of the machine: raw tracepoints (no record is built) and the
//! syscall-number test first keep that cost small.

use aya_ebpf::{macros::raw_tracepoint, programs::RawTracePointContext};
use hystall_common::InflightSend;

use crate::maps::{INFLIGHT, current_ids, monitored, now_ns, read_at, send_syscalls, sock_offsets};

/// `sys_enter(struct pt_regs *regs, long id)`.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn sys_enter(ctx: RawTracePointContext) -> i32 {
    match try_enter(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

fn try_enter(ctx: &RawTracePointContext) -> Result<(), ()> {
    let nr: i64 = ctx.arg(1);
    if nr < 0 || !send_syscalls().contains(nr as u32) {
        return Err(());
    }
    let (tgid, tid) = current_ids();
    if !monitored(tgid) {
        return Err(());
    }
    let regs: *const u8 = ctx.arg(0);
    let offs = sock_offsets();
    let fd: u64 = unsafe { read_at(regs, offs.regs_arg0) };
    let count: u64 = unsafe { read_at(regs, offs.regs_arg2) };
    let entry = InflightSend { tgid, nr: nr as u32, fd, count, start_ns: now_ns() };
    INFLIGHT.insert(&tid, &entry, 0).map_err(|_| ())
}

/// `sys_exit(struct pt_regs *regs, long ret)`: the number is in the registers.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn sys_exit(ctx: RawTracePointContext) -> i32 {
    match try_exit(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

fn try_exit(ctx: &RawTracePointContext) -> Result<(), ()> {
    let regs: *const u8 = ctx.arg(0);
    let nr: i64 = unsafe { read_at(regs, sock_offsets().regs_nr) };
    if nr < 0 || !send_syscalls().contains(nr as u32) {
        return Err(());
    }
    let (_, tid) = current_ids();
    INFLIGHT.remove(&tid).map_err(|_| ())
}
