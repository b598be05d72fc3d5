//! Send-family syscall numbers per architecture (raw_syscalls carry only the
//! number). Unknown architectures get none: blocking writers are then seen only
//! when their send returns, and `doctor` says so.

use hystall_common::SendSyscalls;

pub fn send_syscalls() -> Option<SendSyscalls> {
    if cfg!(target_arch = "x86_64") {
        Some(SendSyscalls {
            write: 1,
            writev: 20,
            sendto: 44,
            sendmsg: 46,
            sendmmsg: 307,
            sendfile: 40,
            splice: 275,
            _pad: 0,
        })
    } else if cfg!(target_arch = "aarch64") {
        Some(SendSyscalls {
            write: 64,
            writev: 66,
            sendto: 206,
            sendmsg: 211,
            sendmmsg: 269,
            sendfile: 71,
            splice: 76,
            _pad: 0,
        })
    } else {
        None
    }
}
