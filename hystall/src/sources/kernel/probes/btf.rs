//! `struct sock` field offsets from the running kernel's BTF.
//!
//! Kernel structs move between versions; reading the offsets from
//! /sys/kernel/btf/vmlinux at load time (instead of baking in one kernel's)
//! keeps the programs correct on every kernel that has BTF.

use btf_rs::{Btf, Type};
use hystall_common::SockOffsets;

use super::ProbeError;

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// The running kernel's BTF.
pub fn load() -> Result<Btf, ProbeError> {
    Btf::from_file(VMLINUX_BTF).map_err(|e| ProbeError::Btf(format!("cannot read {VMLINUX_BTF}: {e}")))
}

/// Reads the offsets the programs need from the kernel's BTF.
pub fn sock_offsets() -> Result<SockOffsets, ProbeError> {
    sock_offsets_from(&load()?)
}

/// Whether the kernel has a function named `name` (a BTF `FUNC`): how a
/// kernel feature that has no tracepoint or type of its own is probed.
pub fn has_function(btf: &Btf, name: &str) -> bool {
    btf.resolve_types_by_name(name).is_ok_and(|tys| tys.iter().any(|t| matches!(t, Type::Func(_))))
}

pub fn sock_offsets_from(btf: &Btf) -> Result<SockOffsets, ProbeError> {
    let common = member_offset(btf, "sock", "__sk_common")?;
    let c = |field: &str| -> Result<u32, ProbeError> { Ok(common + member_offset(btf, "sock_common", field)?) };
    Ok(SockOffsets {
        skc_daddr: c("skc_daddr")?,
        skc_rcv_saddr: c("skc_rcv_saddr")?,
        skc_dport: c("skc_dport")?,
        skc_num: c("skc_num")?,
        skc_family: c("skc_family")?,
        skc_v6_daddr: c("skc_v6_daddr")?,
        skc_v6_rcv_saddr: c("skc_v6_rcv_saddr")?,
        sk_protocol: member_offset(btf, "sock", "sk_protocol")?,
        tcp_snd_una: member_offset(btf, "tcp_sock", "snd_una")?,
        tcp_snd_nxt: member_offset(btf, "tcp_sock", "snd_nxt")?,
        tcp_snd_wnd: member_offset(btf, "tcp_sock", "snd_wnd")?,
        regs_arg0: regs_offset(btf, 0)?,
        regs_arg2: regs_offset(btf, 2)?,
        regs_nr: regs_nr_offset(btf)?,
        sk_wmem_queued: member_offset(btf, "sock", "sk_wmem_queued")?,
        sk_sndbuf: member_offset(btf, "sock", "sk_sndbuf")?,
        sk_socket: member_offset(btf, "sock", "sk_socket")?,
        socket_file: member_offset(btf, "socket", "file")?,
        file_f_flags: member_offset(btf, "file", "f_flags")?,
        // Read only where tracing programs cannot ask for the cookie.
        skc_cookie: c("skc_cookie").unwrap_or(0),
    })
}

/// Offset of syscall argument `n` (0 or 2) in `struct pt_regs`.
fn regs_offset(btf: &Btf, n: usize) -> Result<u32, ProbeError> {
    if cfg!(target_arch = "x86_64") {
        member_offset(btf, "pt_regs", ["di", "si", "dx"][n.min(2)])
    } else if cfg!(target_arch = "aarch64") {
        // user_pt_regs.regs[n], 8 bytes each, at the start of pt_regs.
        Ok(member_offset(btf, "pt_regs", "regs")? + 8 * n as u32)
    } else {
        Err(ProbeError::Btf(format!("syscall arguments are not mapped on {}", std::env::consts::ARCH)))
    }
}

/// Offset of the syscall number in `struct pt_regs` (read at syscall exit).
fn regs_nr_offset(btf: &Btf) -> Result<u32, ProbeError> {
    if cfg!(target_arch = "x86_64") {
        member_offset(btf, "pt_regs", "orig_ax")
    } else if cfg!(target_arch = "aarch64") {
        member_offset(btf, "pt_regs", "syscallno")
    } else {
        Err(ProbeError::Btf(format!("the syscall number is not mapped on {}", std::env::consts::ARCH)))
    }
}

/// Byte offset of `field` in `struct name`, looking through anonymous
/// structs and unions (sock_common keeps its addresses in them).
pub fn member_offset(btf: &Btf, name: &str, field: &str) -> Result<u32, ProbeError> {
    let missing = || ProbeError::Btf(format!("struct {name} has no field {field} in this kernel's BTF"));
    for ty in btf.resolve_types_by_name(name).map_err(|_| ProbeError::Btf(format!("no struct {name} in BTF")))? {
        if let Type::Struct(st) = ty
            && let Some(bits) = find_in(btf, &st, field, 0)
        {
            if bits % 8 != 0 {
                return Err(ProbeError::Btf(format!("{name}.{field} is a bitfield; cannot read it")));
            }
            return Ok(bits / 8);
        }
    }
    Err(missing())
}

fn find_in(btf: &Btf, st: &btf_rs::Struct, field: &str, base_bits: u32) -> Option<u32> {
    for m in &st.members {
        let off = base_bits + m.bit_offset();
        let mname = btf.resolve_name(m).unwrap_or_default();
        if mname == field {
            return Some(off);
        }
        if mname.is_empty() {
            // Anonymous struct/union: search inside (through typedefs/modifiers).
            let mut ty = btf.resolve_chained_type(m).ok()?;
            loop {
                match ty {
                    Type::Struct(ref inner) | Type::Union(ref inner) => {
                        if let Some(found) = find_in(btf, inner, field, off) {
                            return Some(found);
                        }
                        break;
                    }
                    Type::Typedef(_) | Type::Const(_) | Type::Volatile(_) => {
                        let Some(bt) = ty.as_btf_type() else { break };
                        ty = btf.resolve_chained_type(bt).ok()?;
                    }
                    _ => break,
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_of_this_kernel_look_like_sock_common() {
        if !std::path::Path::new(VMLINUX_BTF).exists() {
            eprintln!("skipped: no {VMLINUX_BTF}");
            return;
        }
        let o = sock_offsets().expect("offsets");
        // sock_common starts struct sock, and its address pair has come first
        // for a decade: daddr, rcv_saddr, then the ports.
        assert_eq!(o.skc_daddr, 0);
        assert_eq!(o.skc_rcv_saddr, 4);
        assert_eq!(o.skc_dport, 12);
        assert_eq!(o.skc_num, 14);
        assert_eq!(o.skc_family, 16);
        assert!(o.sk_protocol > o.skc_family, "{o:?}");
        // tcp_sock embeds inet_connection_sock (which embeds sock) first.
        assert!(o.tcp_snd_una > o.sk_protocol && o.tcp_snd_nxt > o.sk_protocol, "{o:?}");
        // The fd's flags, two pointers away: inside their structs.
        assert!(o.sk_socket > o.skc_family && o.socket_file > 0 && o.file_f_flags > 0, "{o:?}");
        assert!(o.skc_cookie > o.skc_family, "{o:?}");
        let btf = load().expect("btf");
        assert!(has_function(&btf, "tcp_sendmsg"));
        assert!(!has_function(&btf, "sock"), "a struct is not a function");
        assert!(!has_function(&btf, "no_such_function_in_any_kernel"));
        if cfg!(target_arch = "x86_64") {
            // di, dx and orig_ax: stable since the x86_64 ABI began.
            assert_eq!((o.regs_arg0, o.regs_arg2, o.regs_nr), (112, 96, 120), "{o:?}");
        }
    }
}
