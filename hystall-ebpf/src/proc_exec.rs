//! Process starts: `sched/sched_process_exec` (a classic tracepoint, in every
//! kernel hystall runs on), attached only when processes are selected.
//!
//! A proxy started or restarted under load has clients dialling within
//! milliseconds: the port must be watched before their first packets for
//! their connections to be counted from the start. So an exec the selection
//! may take wakes user space at once, which checks it against the selection
//! and reads the new process's config at once instead of at the next
//! second's rescan.
//!
//! The other execs (a build farm's thousands a second) are dropped here:
//! with `switch::EXEC_FILTER` on, only an exec whose new comm is one of the
//! selection's names (`EXEC_COMMS`) or whose process is one of its explicit
//! pids (`EXEC_PIDS`: a selected pid that execs another program) is sent;
//! each other one is only counted (`EXECS_SKIPPED`). A selection the kernel
//! cannot decide (a cgroup's) leaves the switch off: every exec is sent.

use aya_ebpf::{bindings::BPF_RB_FORCE_WAKEUP, macros::tracepoint, programs::TracePointContext};
use hystall_common::{COMM_LEN, SockEvent, SockEventKind, counter, switch};

use crate::maps::{EVENTS, EXEC_COMMS, EXEC_PIDS, bump, comm, current_ids, now_ns, switched_on};

#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    // After the exec: the task's comm is the new program's name.
    let (tgid, _) = current_ids();
    let comm = comm();
    if !wanted(tgid, &comm) {
        bump(counter::EXECS_SKIPPED);
        return 0;
    }
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
                (*ev).stats.comm = comm;
            }
            entry.submit(BPF_RB_FORCE_WAKEUP as u64);
            bump(counter::EVENTS_SENT);
        }
        None => bump(counter::EVENTS_LOST),
    }
    0
}

/// Whether user space may take this exec (`Mode::selects`): every one while
/// the filter is off, else those of a selected name or explicit pid.
#[inline(always)]
fn wanted(tgid: u32, comm: &[u8; COMM_LEN]) -> bool {
    !switched_on(switch::EXEC_FILTER)
        || unsafe { EXEC_COMMS.get(comm) }.is_some()
        || unsafe { EXEC_PIDS.get(&tgid) }.is_some()
}
