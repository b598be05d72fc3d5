//! Capabilities instead of "root": what each command needs, checked at start
//! against the effective set, so a service running as an unprivileged user
//! with exactly these (deploy/systemd/hystall.service) works, and one missing
//! gives one clear line instead of an EPERM from deep inside a loader.
//! docs/SERVICE.md says why each one is needed.

use caps::{CapSet, Capability};

/// One capability a command needs, and why (shown when it is missing).
#[derive(Clone, Copy, Debug)]
pub struct Need {
    pub cap: Capability,
    pub why: &'static str,
}

/// `watch` and `top`: load and attach the probes, see the watched processes'
/// sockets.
pub const WATCH: &[Need] = &[
    Need { cap: Capability::CAP_BPF, why: "needed to load eBPF programs and create their maps" },
    Need { cap: Capability::CAP_PERFMON, why: "needed to load tracing programs and attach them to tracepoints" },
    Need { cap: Capability::CAP_NET_ADMIN, why: "needed to load and attach the QUIC traffic classifier, a TC program" },
    Need { cap: Capability::CAP_DAC_READ_SEARCH, why: "needed to read tracefs, which is root-only" },
    Need { cap: Capability::CAP_SYS_PTRACE, why: "needed to read /proc/PID/fd of watched processes of other users" },
];

/// `--enforce` (without --dry-run), on top of `WATCH`.
pub const ENFORCE: &[Need] = &[
    Need { cap: Capability::CAP_NET_ADMIN, why: "needed by --enforce to destroy sockets with SOCK_DESTROY" },
    Need { cap: Capability::CAP_SYS_PTRACE, why: "needed by --enforce for the pidfd_getfd fallback" },
];

#[derive(Debug, thiserror::Error)]
#[error("missing {} {}; run as root or grant {} (see deploy/systemd/hystall.service)",
    if .0.len() == 1 { "capability" } else { "capabilities" },
    .0.iter().map(|n| format!("{} ({})", n.cap, n.why)).collect::<Vec<_>>().join(", "),
    if .0.len() == 1 { "it" } else { "them" })]
pub struct Missing(pub Vec<Need>);

/// Whether the calling thread holds `cap` in its effective set. CAP_SYS_ADMIN
/// stands in for CAP_BPF and CAP_PERFMON, as the kernel accepts (and kernels
/// before 5.8 know only it).
pub fn held(cap: Capability) -> bool {
    let has = |c| caps::has_cap(None, CapSet::Effective, c).unwrap_or(false);
    has(cap) || matches!(cap, Capability::CAP_BPF | Capability::CAP_PERFMON) && has(Capability::CAP_SYS_ADMIN)
}

/// The needs not met by `holds`, each capability once (first reason kept).
pub fn missing_of(needs: &[&[Need]], holds: impl Fn(Capability) -> bool) -> Vec<Need> {
    let mut out: Vec<Need> = Vec::new();
    for n in needs.iter().flat_map(|s| s.iter()) {
        if !holds(n.cap) && !out.iter().any(|m| m.cap == n.cap) {
            out.push(*n);
        }
    }
    out
}

/// Fails with one line naming every missing capability.
pub fn require(needs: &[&[Need]]) -> Result<(), Missing> {
    let missing = missing_of(needs, held);
    if missing.is_empty() { Ok(()) } else { Err(Missing(missing)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_missing_capability_is_one_clear_line() {
        let m = missing_of(&[WATCH], |c| c != Capability::CAP_BPF);
        assert_eq!(
            Missing(m).to_string(),
            "missing capability CAP_BPF (needed to load eBPF programs and create their maps); \
             run as root or grant it (see deploy/systemd/hystall.service)"
        );
    }

    #[test]
    fn several_are_each_named_once() {
        let m = missing_of(&[WATCH, ENFORCE], |c| c == Capability::CAP_BPF);
        let caps: Vec<_> = m.iter().map(|n| n.cap).collect();
        assert_eq!(
            caps,
            [
                Capability::CAP_PERFMON,
                Capability::CAP_NET_ADMIN,
                Capability::CAP_DAC_READ_SEARCH,
                Capability::CAP_SYS_PTRACE
            ]
        );
        let line = Missing(m).to_string();
        assert!(line.starts_with("missing capabilities CAP_PERFMON ("), "{line}");
        assert!(line.contains("grant them"), "{line}");
        assert!(missing_of(&[WATCH, ENFORCE], |_| true).is_empty());
    }
}
