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
    };
}

/// Offsets of fields in classic tracepoint records (from tracefs `format` files).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TpOffsets {
    /// `tcp/tcp_probe`: `sock_cookie`, `snd_nxt`, `snd_una`, `snd_wnd`.
    pub probe_cookie: u32,
    pub probe_snd_nxt: u32,
    pub probe_snd_una: u32,
    pub probe_snd_wnd: u32,
    /// `tcp/tcp_destroy_sock`: `sock_cookie`.
    pub destroy_cookie: u32,
    /// `raw_syscalls/sys_enter`: `id`, `args`.
    pub enter_id: u32,
    pub enter_args: u32,
    /// `raw_syscalls/sys_exit`: `id`, `ret`.
    pub exit_id: u32,
    pub exit_ret: u32,
}

impl TpOffsets {
    pub const ZERO: Self = Self {
        probe_cookie: 0,
        probe_snd_nxt: 0,
        probe_snd_una: 0,
        probe_snd_wnd: 0,
        destroy_cookie: 0,
        enter_id: 0,
        enter_args: 0,
        exit_id: 0,
        exit_ret: 0,
    };
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
