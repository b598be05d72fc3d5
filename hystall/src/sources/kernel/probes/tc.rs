//! Attaching the QUIC flow classifier to interfaces, and cleaning up after it.
//!
//! aya attaches through TCX on Linux 6.6+ (links that vanish with the
//! program). Older kernels need a clsact qdisc: if hystall had to add one, it
//! removes it again on exit, and leaves alone one that was there before.

use std::process::Command;

use aya::programs::{SchedClassifier, TcAttachType, tc};

use crate::core::event::ProbeStatus;

/// An interface to watch: name, index, link-layer header length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Iface {
    pub name: String,
    pub index: u32,
    pub l2_len: u32,
}

impl Iface {
    /// Looks an interface up in /sys/class/net.
    pub fn by_name(name: &str) -> Option<Iface> {
        let base = format!("/sys/class/net/{name}");
        let index = std::fs::read_to_string(format!("{base}/ifindex")).ok()?.trim().parse().ok()?;
        let ty: u32 = std::fs::read_to_string(format!("{base}/type")).ok()?.trim().parse().unwrap_or(1);
        // ARPHRD_ETHER (1) and ARPHRD_LOOPBACK (772) carry an Ethernet header in
        // TC; L3 devices (tun, WireGuard: ARPHRD_NONE 65534) start at the IP header.
        let l2_len = if ty == 1 || ty == 772 { 14 } else { 0 };
        Some(Iface { name: name.to_owned(), index, l2_len })
    }

    /// Every interface that is up (loopback included).
    pub fn all_up() -> Vec<Iface> {
        let Ok(rd) = std::fs::read_dir("/sys/class/net") else { return Vec::new() };
        let mut out: Vec<Iface> = rd
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .filter(|n| {
                let flags = std::fs::read_to_string(format!("/sys/class/net/{n}/flags")).unwrap_or_default();
                u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).is_ok_and(|f| f & 1 != 0)
            })
            .filter_map(|n| Iface::by_name(&n))
            .collect();
        out.sort_by_key(|i| i.index);
        out
    }
}

/// clsact qdiscs hystall added (removed on drop, after the programs are gone).
#[derive(Default)]
pub struct QdiscGuard {
    added: Vec<String>,
}

impl Drop for QdiscGuard {
    fn drop(&mut self) {
        for iface in self.added.drain(..) {
            // aya has no qdisc deletion; iproute2's `tc` does it.
            // Its own stdio: ours may be a pipe the reader already closed
            // (`watch | head`), and tc must not die of that.
            let out = Command::new("tc")
                .args(["qdisc", "del", "dev", &iface, "clsact"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .output();
            let why = match &out {
                Ok(o) if o.status.success() => continue,
                Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_owned(),
                Err(e) => e.to_string(),
            };
            eprintln!(
                "hystall: could not remove the clsact qdisc it added on {iface} ({why}): run `tc qdisc del dev {iface} clsact`"
            );
        }
    }
}

fn kernel_has_tcx() -> bool {
    let r = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut it = r.split(|c: char| !c.is_ascii_digit()).filter_map(|s| s.parse::<u32>().ok());
    (it.next().unwrap_or(0), it.next().unwrap_or(0)) >= (6, 6)
}

/// Attaches `ingress`/`egress` (already loaded) to each interface.
pub fn attach(ebpf: &mut aya::Ebpf, ifaces: &[Iface], guard: &mut QdiscGuard) -> Vec<ProbeStatus> {
    let tcx = kernel_has_tcx();
    let mut out = Vec::new();
    for iface in ifaces {
        let mut note = None;
        if !tcx {
            match tc::qdisc_add_clsact(&iface.name) {
                Ok(()) => guard.added.push(iface.name.clone()),
                Err(e) if e.to_string().contains("exists") => {}
                Err(e) => note = Some(format!("clsact on {}: {e}", iface.name)),
            }
        }
        // One program pair per link-layer length: a constant offset in each
        // (no per-packet lookup of the interface).
        let pair = if iface.l2_len == 0 { L3 } else { ETH };
        for (prog, at) in [(pair[0], TcAttachType::Ingress), (pair[1], TcAttachType::Egress)] {
            let res = (|| -> Result<(), String> {
                let p: &mut SchedClassifier =
                    ebpf.program_mut(prog).ok_or("missing from the object")?.try_into().map_err(|e| format!("{e}"))?;
                p.attach(&iface.name, at).map_err(|e| format!("{e}"))?;
                Ok(())
            })();
            let name = format!("{prog}@{}", iface.name);
            out.push(match (&res, &note) {
                (Ok(()), _) => ProbeStatus { name, attached: true, note: None },
                (Err(e), n) => ProbeStatus {
                    name,
                    attached: false,
                    note: Some(format!(
                        "{e}{}; without it: no QUIC flow counts on this interface",
                        n.as_deref().map(|n| format!(" ({n})")).unwrap_or_default()
                    )),
                },
            });
        }
    }
    out
}

/// The classifiers for Ethernet-like interfaces (and loopback): ingress, egress.
const ETH: [&str; 2] = ["quic_ingress", "quic_egress"];
/// The classifiers for interfaces without a link-layer header (WireGuard, tun).
const L3: [&str; 2] = ["quic_ingress_l3", "quic_egress_l3"];

/// Loads the classifiers (once).
pub fn load(ebpf: &mut aya::Ebpf) -> Result<(), String> {
    for prog in ETH.into_iter().chain(L3) {
        load_one(ebpf, prog)?;
    }
    Ok(())
}

/// Loads one classifier of the object (not attached).
pub fn load_one(ebpf: &mut aya::Ebpf, prog: &str) -> Result<(), String> {
    let p: &mut SchedClassifier = ebpf
        .program_mut(prog)
        .ok_or_else(|| format!("{prog} missing from the object"))?
        .try_into()
        .map_err(|e| format!("{e}"))?;
    p.load().map_err(|e| format!("load {prog}: {e}"))
}
