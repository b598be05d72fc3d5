//! Load-time configuration handed to the kernel programs as read-only globals.
//!
//! Struct field offsets and tracepoint record offsets differ between kernels, so
//! user space reads them from the running kernel (BTF and tracefs format files) and
//! writes them here before the programs are verified. The verifier sees them as
//! constants, so they cost nothing at run time.

/// Offsets inside `struct sock` (from `/sys/kernel/btf/vmlinux`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockOffsets {
    /// `sk->__sk_common.skc_daddr` (IPv4 peer, network order).
    pub skc_daddr: u32,
    /// `sk->__sk_common.skc_rcv_saddr` (IPv4 local, network order).
    pub skc_rcv_saddr: u32,
    /// `sk->__sk_common.skc_dport` (peer port, network order).
    pub skc_dport: u32,
    /// `sk->__sk_common.skc_num` (local port, host order).
    pub skc_num: u32,
    /// `sk->__sk_common.skc_family`.
    pub skc_family: u32,
    /// `sk->__sk_common.skc_v6_daddr`.
    pub skc_v6_daddr: u32,
    /// `sk->__sk_common.skc_v6_rcv_saddr`.
    pub skc_v6_rcv_saddr: u32,
    /// `sk->sk_protocol` (u16 since 5.6).
    pub sk_protocol: u32,
    /// `struct tcp_sock`: `snd_una`, `snd_nxt`, `snd_wnd` (a `struct sock *` of a
    /// TCP socket points at its `tcp_sock`).
    pub tcp_snd_una: u32,
    pub tcp_snd_nxt: u32,
    pub tcp_snd_wnd: u32,
    /// `struct pt_regs`: the first and third syscall argument, and the syscall
    /// number (x86_64: di, dx, orig_ax; arm64: regs[0], regs[2], syscallno).
    pub regs_arg0: u32,
    pub regs_arg2: u32,
    pub regs_nr: u32,
    /// `sk->sk_wmem_queued` and `sk->sk_sndbuf` (ints): a send that leaves the
    /// first at or above the second filled the buffer; the writer blocks next.
    pub sk_wmem_queued: u32,
    pub sk_sndbuf: u32,
    /// `sk->sk_socket`, `socket->file` and `file->f_flags`: whether the
    /// socket's fd is in blocking mode (no `O_NONBLOCK`), read once when a
    /// socket is first tracked (only a blocking writer can park in a send).
    pub sk_socket: u32,
    pub socket_file: u32,
    pub file_f_flags: u32,
    /// `sk->__sk_common.skc_cookie` (an `atomic64_t`): the socket cookie, read
    /// directly where tracing programs may not call `bpf_get_socket_cookie`
    /// (before Linux 5.12). Zero until something generated it (sock_diag, a
    /// classic tcp tracepoint, or our cgroup connect hook).
    pub skc_cookie: u32,
}

impl SockOffsets {
    /// All zero: "not configured" (the programs refuse to read through it).
    pub const ZERO: Self = Self {
        skc_daddr: 0,
        skc_rcv_saddr: 0,
        skc_dport: 0,
        skc_num: 0,
        skc_family: 0,
        skc_v6_daddr: 0,
        skc_v6_rcv_saddr: 0,
        sk_protocol: 0,
        tcp_snd_una: 0,
        tcp_snd_nxt: 0,
        tcp_snd_wnd: 0,
        regs_arg0: 0,
        regs_arg2: 0,
        regs_nr: 0,
        sk_wmem_queued: 0,
        sk_sndbuf: 0,
        sk_socket: 0,
        socket_file: 0,
        file_f_flags: 0,
        skc_cookie: 0,
    };
}

/// Offsets of fields in classic tracepoint records (from tracefs `format` files).
/// Only `tcp/tcp_destroy_sock` stays a classic tracepoint: it is rare, and its
/// record carries the cookie. Hot paths use raw or BTF tracepoints, which skip
/// building the record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TpOffsets {
    /// `tcp/tcp_destroy_sock`: `sock_cookie`.
    pub destroy_cookie: u32,
}

impl TpOffsets {
    pub const ZERO: Self = Self { destroy_cookie: 0 };
}

/// Syscall numbers of the send family on the running architecture. A number of
/// `u32::MAX` means "not on this architecture".
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendSyscalls {
    pub write: u32,
    pub writev: u32,
    pub sendto: u32,
    pub sendmsg: u32,
    pub sendmmsg: u32,
    pub sendfile: u32,
    pub splice: u32,
    pub _pad: u32,
}

impl SendSyscalls {
    pub const NONE: Self = Self {
        write: u32::MAX,
        writev: u32::MAX,
        sendto: u32::MAX,
        sendmsg: u32::MAX,
        sendmmsg: u32::MAX,
        sendfile: u32::MAX,
        splice: u32::MAX,
        _pad: 0,
    };

    /// Whether `nr` is one of the send-family syscalls.
    #[inline(always)]
    pub fn contains(&self, nr: u32) -> bool {
        nr == self.write
            || nr == self.writev
            || nr == self.sendto
            || nr == self.sendmsg
            || nr == self.sendmmsg
            || nr == self.sendfile
            || nr == self.splice
    }

    /// Whether the syscall's third argument is the byte count (`write`, `sendto`),
    /// so that a short send can be recognised.
    #[inline(always)]
    pub fn has_count(&self, nr: u32) -> bool {
        nr == self.write || nr == self.sendto
    }
}

impl Default for SendSyscalls {
    fn default() -> Self {
        Self::NONE
    }
}

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::SockOffsets {}
    unsafe impl aya::Pod for super::TpOffsets {}
    unsafe impl aya::Pod for super::SendSyscalls {}
}
