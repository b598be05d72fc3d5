//! Process starts: `sched/sched_process_exec` (a classic tracepoint, in every
//! kernel hystall runs on), attached only when processes are selected.
//!
//! A proxy started or restarted under load has clients dialling within
//! milliseconds: the port must be watched before their first packets for
//! their connections to be counted from the start. So every exec wakes user
//! space (a few a second on a node; a build farm's thousands cost one event
//! each), which checks it against the selection and reads the new process's
//! config at once instead of at the next second's rescan.

use aya_ebpf::{bindings::BPF_RB_FORCE_WAKEUP, macros::tracepoint, programs::TracePointContext};
use hystall_common::{SockEvent, SockEventKind, counter};

use crate::maps::{EVENTS, bump, comm, current_ids, now_ns};

#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    // After the exec: the task's comm is the new program's name.
    let (tgid, _) = current_ids();
    match EVENTS.reserve::<SockEvent>(0) {
        Some(mut entry) => {
            let ev = entry.as_mut_ptr();
            // Only the fields user space reads for an exec are written.
            unsafe {
                (*ev).kind = SockEventKind::Exec as u32;
                (*ev).arg = 0;
                (*ev).ts_ns = now_ns();
                (*ev).cookie = 0;
                (*ev).stats.tgid = tgid;
                (*ev).stats.comm = comm();
            }
            entry.submit(BPF_RB_FORCE_WAKEUP as u64);
            bump(counter::EVENTS_SENT);
        }
        None => bump(counter::EVENTS_LOST),
    }
    0
}
