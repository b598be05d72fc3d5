//! `struct sock` field offsets from the running kernel's BTF.
//!
//! Kernel structs move between versions; reading the offsets from
//! /sys/kernel/btf/vmlinux at load time (instead of baking in one kernel's)
//! keeps the programs correct on every kernel that has BTF.

use btf_rs::{Btf, Type};
use hystall_common::SockOffsets;

use super::ProbeError;

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Reads the offsets the programs need from the kernel's BTF.
pub fn sock_offsets() -> Result<SockOffsets, ProbeError> {
    let btf = Btf::from_file(VMLINUX_BTF).map_err(|e| ProbeError::Btf(format!("cannot read {VMLINUX_BTF}: {e}")))?;
    sock_offsets_from(&btf)
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
    })
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
    }
}
