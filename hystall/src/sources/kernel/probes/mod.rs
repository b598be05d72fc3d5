//! The kernel programs: loading, configuring, attaching, and reading their maps.
//!
//! Dropping `Probes` detaches every program and frees every map (aya owns the
//! links), so an early return, a signal handled by the caller, or a panic that
//! unwinds leaves nothing behind in the kernel.

pub mod batch;
pub mod btf;
pub mod moved;
pub mod send_path;
pub mod stats;
pub mod syscalls;
pub mod tc;
pub mod tracefs;
pub mod upkeep;

use std::collections::HashSet;
use std::path::Path;

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::{
        BtfTracePoint, CgroupAttachMode, CgroupSockAddr, FExit, TracePoint, UProbe, uprobe::UProbeAttachLocation,
        uprobe::UProbeLinkId, uprobe::UProbeScope,
    },
};
use hystall_common::{
    Budget, COMM_LEN, FlowKey, FlowStats, SendSyscalls, Snips, SockStats, TpOffsets, counter, switch,
};
use send_path::SendPath;
use thiserror::Error;

use crate::core::event::ProbeStatus;

/// The kernel object, built by build.rs from `hystall-ebpf`.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/hystall"));

#[derive(Debug, Error)]
pub enum ProbeError {
    #[error(
        "not permitted to load eBPF programs: run as root or with CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN and CAP_DAC_READ_SEARCH (docs/SERVICE.md)"
    )]
    NotPermitted,
    #[error("BTF: {0}")]
    Btf(String),
    #[error("{0}")]
    Tracefs(String),
    #[error("tracepoint {0} is not available on this kernel: {1}")]
    MissingTracepoint(String, String),
    #[error("loading the eBPF object failed: {0}")]
    Load(String),
    #[error("eBPF map {0}: {1}")]
    Map(&'static str, String),
}

/// What to watch, decided by user space before the programs are verified.
#[derive(Clone, Debug, Default)]
pub struct ProbeConfig {
    /// Watch only these processes (their tgids go into the PIDS map).
    pub filter_pids: bool,
    /// `--decrypt`: the classifier keeps snips and passes selected flows.
    pub decrypt: bool,
}

/// One program: its name in the object, and where it attaches.
struct Spec {
    prog: &'static str,
    kind: Kind,
    /// Whether hystall can work without it (it degrades; doctor says how).
    why: &'static str,
}

enum Kind {
    Btf(&'static str),
    Raw(&'static str),
    Tp(&'static str, &'static str),
    FExit(&'static str),
    /// A cgroup connect hook, on the cgroup v2 root.
    Cgroup,
}

const SPECS: &[Spec] = &[
    Spec {
        prog: "sock_send_length",
        kind: Kind::Btf("sock_send_length"),
        why: "results of sends (EAGAIN, short sends): non-blocking writers",
    },
    Spec {
        prog: "tcp_sendmsg_exit",
        kind: Kind::FExit("tcp_sendmsg"),
        why: "results of sends (EAGAIN, short sends): non-blocking writers",
    },
    Spec {
        prog: "cookie_connect4",
        kind: Kind::Cgroup,
        why: "cookies of IPv4 target sockets at connect (kernels before 5.12)",
    },
    Spec {
        prog: "cookie_connect6",
        kind: Kind::Cgroup,
        why: "cookies of IPv6 target sockets at connect (kernels before 5.12)",
    },
    Spec {
        prog: "inet_sock_set_state",
        kind: Kind::Btf("inet_sock_set_state"),
        why: "connect/close of target sockets",
    },
    Spec { prog: "tcp_probe", kind: Kind::Btf("tcp_probe"), why: "ACK progress and the peer's window" },
    Spec { prog: "tcp_destroy_sock", kind: Kind::Tp("tcp", "tcp_destroy_sock"), why: "socket close" },
    Spec { prog: "sys_enter", kind: Kind::Raw("sys_enter"), why: "blocking writers parked in send syscalls" },
    Spec { prog: "sys_exit", kind: Kind::Raw("sys_exit"), why: "blocking writers parked in send syscalls" },
];

/// Process starts, for a selection to follow a proxy that starts or restarts
/// within milliseconds (`proc_exec.rs`): attached only when processes are
/// selected (with every process watched there is nothing to follow).
const EXEC_SPEC: Spec = Spec {
    prog: "sched_process_exec",
    kind: Kind::Tp("sched", "sched_process_exec"),
    why: "a selected proxy that starts is watched within milliseconds (else at the next second's rescan)",
};

/// Programs `watch` never attaches: raw_syscalls puts every task of the
/// machine on the slow syscall path (about +180 ns per syscall here, see
/// docs/PERFORMANCE.md), and blocked writers are found from /proc instead
/// (`sources::parked`). The benchmarks and `doctor` attach them on request.
const ON_DEMAND: &[&str] = &["sys_enter", "sys_exit"];
/// The uprobe on Go's `crypto/tls.(*Config).writeKeyLog` (`--decrypt`).
const KEYLOG_PROG: &str = "go_tls_keylog";
const ON_DEMAND_NOTE: &str = "not attached: only on request (blocked writers are read from /proc)";

/// A program left detached on purpose until it is needed (not a degradation).
pub fn is_waiting(st: &ProbeStatus) -> bool {
    !st.attached && ON_DEMAND.contains(&st.name.as_str()) && st.note.as_deref() == Some(ON_DEMAND_NOTE)
}

pub struct Probes {
    // Field order is drop order: programs detach before added qdiscs go.
    ebpf: Ebpf,
    qdiscs: tc::QdiscGuard,
    tc_loaded: bool,
    /// `flow_copy` loaded and working (`moved.rs`): moved flows are read in
    /// batches, else one look-up each.
    flow_copy: bool,
    /// Ports marked in the PORTS array.
    ports: HashSet<u16>,
    pub status: Vec<ProbeStatus>,
    /// How blocked writers of non-blocking sockets are seen (None: not at all).
    pub send_path: Option<SendPath>,
}

fn is_eperm(e: &impl std::fmt::Display) -> bool {
    let s = e.to_string();
    s.contains("Operation not permitted") || s.contains("EPERM") || s.contains("os error 1)")
}

impl Probes {
    /// Loads the programs, hands them this kernel's offsets, and attaches each
    /// one it can. A program that cannot attach is reported in `status`, not fatal,
    /// unless none attaches at all.
    pub fn load(cfg: &ProbeConfig) -> Result<Probes, ProbeError> {
        raise_memlock();
        let root = tracefs::ensure_mounted()?;
        let floor =
            SendPath::forced_from(std::env::var(send_path::FORCE_ENV).ok().as_deref()).map_err(ProbeError::Load)?;
        let kbtf = btf::load()?;
        let sock_offsets = btf::sock_offsets_from(&kbtf)?;
        // Tracing programs may call bpf_get_socket_cookie since 5.12, which
        // added this helper's implementation; before, they read the cookie
        // from the socket and the cgroup connect hooks make sure it exists.
        let cookie_helper = btf::has_function(&kbtf, "bpf_get_socket_ptr_cookie");
        let tp = TpOffsets { destroy_cookie: tracefs::field_offset(&root, "tcp", "tcp_destroy_sock", "sock_cookie")? };
        let calls = syscalls::send_syscalls().unwrap_or(SendSyscalls::NONE);
        let filter: u8 = cfg.filter_pids.into();
        let decrypt: u8 = cfg.decrypt.into();
        let cookie_helper_flag: u8 = cookie_helper.into();

        let mut loader = EbpfLoader::new();
        loader
            .override_global("SOCK_OFFSETS", &sock_offsets, true)
            .override_global("TP_OFFSETS", &tp, true)
            .override_global("SEND_SYSCALLS", &calls, true)
            .override_global("FILTER_PIDS", &filter, true)
            .override_global("DECRYPT", &decrypt, true)
            .override_global("COOKIE_HELPER", &cookie_helper_flag, true);
        if !cfg.decrypt {
            // The maps only --decrypt writes: the smallest the kernel takes
            // (the snips map alone is 21 MiB, allocated up front).
            let page = page_size();
            loader.map_max_entries("SNIPPED", 1).map_max_entries("PACKETS", page).map_max_entries("SECRETS", page);
        }
        let mut ebpf = loader
            .load(EBPF_OBJECT)
            .map_err(|e| if is_eperm(&e) { ProbeError::NotPermitted } else { ProbeError::Load(e.to_string()) })?;

        let btf = Btf::from_sys_fs().map_err(|e| ProbeError::Btf(e.to_string()))?;
        let mut status = Vec::new();
        let mut send: Option<SendPath> = None;
        let mut replaced: Vec<ProbeStatus> = Vec::new();
        for spec in SPECS {
            // Not used by `watch` (blocked writers are read from /proc, see
            // `sources::parked`); `attach_syscalls` attaches them on request.
            if ON_DEMAND.contains(&spec.prog) {
                continue;
            }
            if !send_path::wanted(spec.prog, floor, send) || (matches!(spec.kind, Kind::Cgroup) && cookie_helper) {
                continue;
            }
            let res = attach(&mut ebpf, spec, &btf);
            if let Err(e) = &res
                && is_eperm(e)
            {
                return Err(ProbeError::NotPermitted);
            }
            let note = match (&res, &spec.kind) {
                (Ok(()), _) => None,
                (Err(e), _) => Some(format!("{e}; without it hystall loses: {}", spec.why)),
            };
            let st = ProbeStatus { name: spec.prog.into(), attached: res.is_ok(), note };
            match SendPath::ALL.into_iter().find(|p| p.program() == Some(spec.prog)) {
                Some(p) if res.is_ok() => send = Some(p),
                // A send-result program that failed is a degradation only if no
                // other one takes its place (decided below).
                Some(_) => replaced.push(st),
                None => status.push(st),
            }
        }
        if cfg.filter_pids {
            let res = attach(&mut ebpf, &EXEC_SPEC, &btf);
            let note = res.as_ref().err().map(|e| format!("{e}; without it hystall loses: {}", EXEC_SPEC.why));
            status.push(ProbeStatus { name: EXEC_SPEC.prog.into(), attached: res.is_ok(), note });
        }
        let tcp_probe = status.iter().any(|s| s.name == "tcp_probe" && s.attached);
        if let Some(p) = send {
            status.insert(0, ProbeStatus { name: p.program().unwrap_or_default().into(), attached: true, note: None });
        } else {
            // Every send-result program failed: each says why, and what is left.
            for mut st in replaced {
                if let Some(n) = &mut st.note
                    && tcp_probe
                {
                    n.push_str("; blocks are read from zero windows instead (tcp_probe)");
                }
                status.insert(0, st);
            }
        }
        if status.iter().all(|s| !s.attached) {
            let why = status.iter().filter_map(|s| s.note.clone()).next().unwrap_or_default();
            return Err(ProbeError::Load(format!("no program could attach: {why}")));
        }
        // Decided once, from what attached.
        let attached: Vec<&str> = status.iter().filter(|s| s.attached).map(|s| s.name.as_str()).collect();
        let path = send_path::chosen(&attached, tcp_probe);
        if path == Some(SendPath::ZeroWindow) {
            set_switch(&mut ebpf, switch::ZERO_WINDOW)?;
        }
        Ok(Probes {
            ebpf,
            qdiscs: tc::QdiscGuard::default(),
            tc_loaded: false,
            flow_copy: false,
            ports: HashSet::new(),
            status,
            send_path: path,
        })
    }

    /// Attaches the QUIC flow classifier to `ifaces` and watches `ports`.
    pub fn attach_quic(&mut self, ifaces: &[tc::Iface], ports: &HashSet<u16>) -> Result<Vec<ProbeStatus>, ProbeError> {
        self.set_ports(ports)?;
        if !self.tc_loaded {
            tc::load(&mut self.ebpf).map_err(ProbeError::Load)?;
            self.tc_loaded = true;
            // Not needed to count: without it, flows are read one at a time.
            match tc::load_one(&mut self.ebpf, moved::COPY_PROG) {
                Ok(()) => self.flow_copy = true,
                Err(e) => tracing::warn!("flow reads: {e}; reading one flow at a time"),
            }
        }
        let st = tc::attach(&mut self.ebpf, ifaces, &mut self.qdiscs);
        self.status.extend(st.iter().cloned());
        Ok(st)
    }

    /// Makes the PORTS array mark exactly `ports`.
    pub fn set_ports(&mut self, ports: &HashSet<u16>) -> Result<(), ProbeError> {
        let map = self.ebpf.map_mut("PORTS").ok_or_else(|| ProbeError::Map("PORTS", "missing".into()))?;
        let mut m: aya::maps::Array<_, u8> =
            aya::maps::Array::try_from(map).map_err(|e| ProbeError::Map("PORTS", e.to_string()))?;
        for p in self.ports.difference(ports) {
            m.set(u32::from(*p), 0, 0).map_err(|e| ProbeError::Map("PORTS", e.to_string()))?;
        }
        for p in ports.difference(&self.ports) {
            m.set(u32::from(*p), 1, 0).map_err(|e| ProbeError::Map("PORTS", e.to_string()))?;
        }
        self.ports = ports.clone();
        Ok(())
    }

    /// The ring buffer of QUIC header samples (can be taken once).
    pub fn take_samples(&mut self) -> Result<RingBuf<MapData>, ProbeError> {
        let map =
            self.ebpf.take_map("FLOW_SAMPLES").ok_or_else(|| ProbeError::Map("FLOW_SAMPLES", "missing".into()))?;
        RingBuf::try_from(map).map_err(|e| ProbeError::Map("FLOW_SAMPLES", e.to_string()))
    }

    /// Hands every UDP flow the classifier counts to `f` (in batches; entry
    /// by entry on kernels without batch reads), without a copy of the map.
    pub fn each_flow(&self, mut f: impl FnMut(FlowKey, FlowStats)) {
        let Some(map) = self.ebpf.map("FLOWS") else { return };
        if let Err(e) = batch::for_each(map, &mut f) {
            tracing::debug!("FLOWS batch read: {e}");
            let Ok(m) = BpfHashMap::<_, FlowKey, FlowStats>::try_from(map) else { return };
            m.iter().filter_map(Result::ok).for_each(|(k, v)| f(k, v));
        }
    }

    /// The ring buffer of byte marks (can be taken once).
    pub fn take_marks(&mut self) -> Result<RingBuf<MapData>, ProbeError> {
        let map = self.ebpf.take_map("MARKS").ok_or_else(|| ProbeError::Map("MARKS", "missing".into()))?;
        RingBuf::try_from(map).map_err(|e| ProbeError::Map("MARKS", e.to_string()))
    }

    /// The ring buffer of state-change events (can be taken once).
    pub fn take_events(&mut self) -> Result<RingBuf<MapData>, ProbeError> {
        let map = self.ebpf.take_map("EVENTS").ok_or_else(|| ProbeError::Map("EVENTS", "missing".into()))?;
        RingBuf::try_from(map).map_err(|e| ProbeError::Map("EVENTS", e.to_string()))
    }

    /// Makes the PIDS map hold exactly `pids`.
    pub fn set_pids(&mut self, pids: &HashSet<u32>) -> Result<(), ProbeError> {
        let map = self.ebpf.map_mut("PIDS").ok_or_else(|| ProbeError::Map("PIDS", "missing".into()))?;
        let mut m: BpfHashMap<_, u32, u8> =
            BpfHashMap::try_from(map).map_err(|e| ProbeError::Map("PIDS", e.to_string()))?;
        let old: Vec<u32> = m.keys().filter_map(Result::ok).collect();
        for k in old.iter().filter(|k| !pids.contains(k)) {
            let _ = m.remove(k);
        }
        for p in pids {
            m.insert(p, 1, 0).map_err(|e| ProbeError::Map("PIDS", e.to_string()))?;
        }
        Ok(())
    }

    /// Makes the exec tracepoint hand over only the execs of these comms
    /// (`procs::comm_key`) and pids (`Mode::exec_selection`). The filter is
    /// turned on only once both maps hold them all: on an error (more than
    /// `MAX_EXEC_SELECT` of either) every exec is still handed over.
    pub fn filter_execs(&mut self, comms: &[[u8; COMM_LEN]], pids: &[u32]) -> Result<(), ProbeError> {
        let map = self.ebpf.map_mut("EXEC_COMMS").ok_or_else(|| ProbeError::Map("EXEC_COMMS", "missing".into()))?;
        let mut m: BpfHashMap<_, [u8; COMM_LEN], u8> =
            BpfHashMap::try_from(map).map_err(|e| ProbeError::Map("EXEC_COMMS", e.to_string()))?;
        for c in comms {
            m.insert(c, 1, 0).map_err(|e| ProbeError::Map("EXEC_COMMS", e.to_string()))?;
        }
        let map = self.ebpf.map_mut("EXEC_PIDS").ok_or_else(|| ProbeError::Map("EXEC_PIDS", "missing".into()))?;
        let mut m: BpfHashMap<_, u32, u8> =
            BpfHashMap::try_from(map).map_err(|e| ProbeError::Map("EXEC_PIDS", e.to_string()))?;
        for p in pids {
            m.insert(p, 1, 0).map_err(|e| ProbeError::Map("EXEC_PIDS", e.to_string()))?;
        }
        set_switch(&mut self.ebpf, switch::EXEC_FILTER)
    }

    /// Attaches the on-demand syscall probes (blocking writers). Idempotent.
    pub fn attach_syscalls(&mut self) -> Result<(), ProbeError> {
        let btf = Btf::from_sys_fs().map_err(|e| ProbeError::Btf(e.to_string()))?;
        for spec in SPECS.iter().filter(|s| ON_DEMAND.contains(&s.prog)) {
            if !self.status.iter().any(|s| s.name == spec.prog) {
                self.status.push(ProbeStatus {
                    name: spec.prog.into(),
                    attached: false,
                    note: Some(ON_DEMAND_NOTE.into()),
                });
            }
            let Some(st) = self.status.iter_mut().find(|s| s.name == spec.prog) else { continue };
            if st.attached {
                continue;
            }
            match attach(&mut self.ebpf, spec, &btf) {
                Ok(()) => {
                    st.attached = true;
                    st.note = None;
                }
                Err(e) => st.note = Some(format!("{e}; without it hystall loses: {}", spec.why)),
            }
        }
        if self.syscalls_attached() {
            // The send probe may now find threads in INFLIGHT.
            set_switch(&mut self.ebpf, switch::SYSCALLS)?;
        }
        Ok(())
    }

    /// `--decrypt`: attaches the key-log uprobe to `binary` (a path the
    /// kernel can open, e.g. `/proc/PID/exe`) at file offset `offset`, for
    /// process `pid` only. Loads the program the first time.
    pub fn attach_keylog(&mut self, pid: u32, binary: &Path, offset: u64) -> Result<UProbeLinkId, ProbeError> {
        let prog =
            self.ebpf.program_mut(KEYLOG_PROG).ok_or_else(|| ProbeError::Load(format!("{KEYLOG_PROG} missing")))?;
        let p: &mut UProbe = prog.try_into().map_err(|e| ProbeError::Load(format!("{KEYLOG_PROG}: {e}")))?;
        if p.fd().is_err() {
            p.load().map_err(|e| ProbeError::Load(format!("load uprobe {KEYLOG_PROG}: {}", chain(&e))))?;
        }
        let scope =
            UProbeScope::OneProcess(std::num::NonZeroU32::new(pid).ok_or_else(|| ProbeError::Load("pid 0".into()))?);
        p.attach(UProbeAttachLocation::AbsoluteOffset(offset), binary, scope)
            .map_err(|e| ProbeError::Load(format!("uprobe on {} at {offset:#x}: {}", binary.display(), chain(&e))))
    }

    /// Detaches one key-log uprobe (its process is gone or no longer watched).
    pub fn detach_keylog(&mut self, link: UProbeLinkId) {
        if let Some(prog) = self.ebpf.program_mut(KEYLOG_PROG)
            && let Ok(p) = <&mut UProbe>::try_from(prog)
        {
            let _ = p.detach(link);
        }
    }

    /// `--decrypt`: whole packets of `key` go to the PACKETS ring from now on.
    pub fn select_flow(&mut self, key: &FlowKey) -> Result<(), ProbeError> {
        let map = self.ebpf.map_mut("SELECTED").ok_or_else(|| ProbeError::Map("SELECTED", "missing".into()))?;
        let mut m: BpfHashMap<_, FlowKey, Budget> =
            BpfHashMap::try_from(map).map_err(|e| ProbeError::Map("SELECTED", e.to_string()))?;
        m.insert(key, Budget::default(), 0).map_err(|e| ProbeError::Map("SELECTED", e.to_string()))
    }

    pub fn deselect_flow(&mut self, key: &FlowKey) {
        if let Some(map) = self.ebpf.map_mut("SELECTED")
            && let Ok(mut m) = BpfHashMap::<_, FlowKey, Budget>::try_from(map)
        {
            let _ = m.remove(key);
        }
    }

    /// The small client packets kept after `key`'s last full-size one.
    pub fn snips(&self, key: &FlowKey) -> Option<Snips> {
        let m: BpfHashMap<_, FlowKey, Snips> = BpfHashMap::try_from(self.ebpf.map("SNIPPED")?).ok()?;
        m.get(key, 0).ok()
    }

    /// The ring buffer of selected flows' packets (can be taken once).
    pub fn take_packets(&mut self) -> Result<RingBuf<MapData>, ProbeError> {
        let map = self.ebpf.take_map("PACKETS").ok_or_else(|| ProbeError::Map("PACKETS", "missing".into()))?;
        RingBuf::try_from(map).map_err(|e| ProbeError::Map("PACKETS", e.to_string()))
    }

    /// The ring buffer of TLS secrets (can be taken once).
    pub fn take_secrets(&mut self) -> Result<RingBuf<MapData>, ProbeError> {
        let map = self.ebpf.take_map("SECRETS").ok_or_else(|| ProbeError::Map("SECRETS", "missing".into()))?;
        RingBuf::try_from(map).map_err(|e| ProbeError::Map("SECRETS", e.to_string()))
    }

    /// Run time and run count of each loaded program (non-zero only while BPF
    /// statistics are enabled, see `stats::StatsGuard`).
    pub fn prog_stats(&self) -> Vec<stats::ProgStats> {
        stats::prog_stats(&self.ebpf)
    }

    pub fn syscalls_attached(&self) -> bool {
        ON_DEMAND.iter().all(|n| self.status.iter().any(|s| s.name == *n && s.attached))
    }

    /// Marks a tracked socket as blocked since `now` unless it already is (a
    /// writer found stuck by user space: queued bytes and no recorded block).
    pub fn mark_blocked(&mut self, cookie: u64, now_ns: u64) -> Result<(), ProbeError> {
        let map = self.ebpf.map_mut("SOCKS").ok_or_else(|| ProbeError::Map("SOCKS", "missing".into()))?;
        let mut m: BpfHashMap<_, u64, SockStats> =
            BpfHashMap::try_from(map).map_err(|e| ProbeError::Map("SOCKS", e.to_string()))?;
        if let Ok(mut st) = m.get(&cookie, 0)
            && st.blocked_since_ns == 0
        {
            st.blocked_since_ns = now_ns;
            const BPF_EXIST: u64 = 2;
            let _ = m.insert(cookie, st, BPF_EXIST);
        }
        Ok(())
    }

    /// Starts tracking a socket found by user space (already stuck when we
    /// attached). An entry the kernel created meanwhile is left alone.
    pub fn track(&mut self, cookie: u64, stats: &SockStats) -> Result<(), ProbeError> {
        let map = self.ebpf.map_mut("SOCKS").ok_or_else(|| ProbeError::Map("SOCKS", "missing".into()))?;
        let mut m: BpfHashMap<_, u64, SockStats> =
            BpfHashMap::try_from(map).map_err(|e| ProbeError::Map("SOCKS", e.to_string()))?;
        const BPF_NOEXIST: u64 = 1;
        match m.insert(cookie, stats, BPF_NOEXIST) {
            Ok(()) => Ok(()),
            Err(e) if e.to_string().contains("File exists") => Ok(()),
            Err(e) => Err(ProbeError::Map("SOCKS", e.to_string())),
        }
    }

    /// The kernel aggregate of one socket.
    pub fn sock(&self, cookie: u64) -> Option<SockStats> {
        let m: BpfHashMap<_, u64, SockStats> = BpfHashMap::try_from(self.ebpf.map("SOCKS")?).ok()?;
        m.get(&cookie, 0).ok()
    }

    /// Every socket the kernel tracks (for the first look and for `top`), in
    /// batches where the kernel can.
    pub fn socks(&self) -> Vec<(u64, SockStats)> {
        let Some(map) = self.ebpf.map("SOCKS") else { return Vec::new() };
        batch::read_all(map).unwrap_or_else(|_| {
            BpfHashMap::<_, u64, SockStats>::try_from(map)
                .map(|m| m.iter().filter_map(Result::ok).collect())
                .unwrap_or_default()
        })
    }

    /// Health counters summed over CPUs: `[lost, sent, map_full, _]`.
    pub fn counters(&self) -> [u64; counter::LEN as usize] {
        let mut out = [0u64; counter::LEN as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = self.counter(i as u32);
        }
        out
    }

    /// One health counter (`hystall_common::counter`), summed over CPUs.
    pub fn counter(&self, idx: u32) -> u64 {
        let Some(map) = self.ebpf.map("COUNTERS") else { return 0 };
        let Ok(arr) = PerCpuArray::<_, u64>::try_from(map) else { return 0 };
        arr.get(&idx, 0).map_or(0, |v| v.iter().sum())
    }
}

/// Turns on slot `idx` of the SWITCHES array (`hystall_common::switch`).
fn set_switch(ebpf: &mut Ebpf, idx: u32) -> Result<(), ProbeError> {
    let map = ebpf.map_mut("SWITCHES").ok_or_else(|| ProbeError::Map("SWITCHES", "missing".into()))?;
    let mut m: aya::maps::Array<_, u32> =
        aya::maps::Array::try_from(map).map_err(|e| ProbeError::Map("SWITCHES", e.to_string()))?;
    m.set(idx, 1, 0).map_err(|e| ProbeError::Map("SWITCHES", e.to_string()))
}

fn attach(ebpf: &mut Ebpf, spec: &Spec, btf: &Btf) -> Result<(), String> {
    let prog = ebpf.program_mut(spec.prog).ok_or_else(|| format!("program {} missing from the object", spec.prog))?;
    match spec.kind {
        Kind::Btf(func) => {
            let p: &mut BtfTracePoint = prog.try_into().map_err(|e| format!("{e}"))?;
            p.load(func, btf).map_err(|e| format!("load tp_btf/{func}: {}", chain(&e)))?;
            p.attach().map_err(|e| format!("attach tp_btf/{func}: {}", chain(&e)))?;
        }
        Kind::Raw(name) => {
            let p: &mut aya::programs::RawTracePoint = prog.try_into().map_err(|e| format!("{e}"))?;
            p.load().map_err(|e| format!("load raw_tp/{name}: {}", chain(&e)))?;
            p.attach(name).map_err(|e| format!("attach raw_tp/{name}: {}", chain(&e)))?;
        }
        Kind::Tp(cat, name) => {
            let p: &mut TracePoint = prog.try_into().map_err(|e| format!("{e}"))?;
            p.load().map_err(|e| format!("load {cat}/{name}: {}", chain(&e)))?;
            p.attach(cat, name).map_err(|e| format!("attach {cat}/{name}: {}", chain(&e)))?;
        }
        Kind::FExit(func) => {
            let p: &mut FExit = prog.try_into().map_err(|e| format!("{e}"))?;
            p.load(func, btf).map_err(|e| format!("load fexit/{func}: {}", chain(&e)))?;
            p.attach().map_err(|e| format!("attach fexit/{func}: {}", chain(&e)))?;
        }
        Kind::Cgroup => {
            let root = crate::sources::processes::cgroup::cgroup2_mount().map_err(|e| e.to_string())?;
            let dir = std::fs::File::open(&root).map_err(|e| format!("open {}: {e}", root.display()))?;
            let p: &mut CgroupSockAddr = prog.try_into().map_err(|e| format!("{e}"))?;
            p.load().map_err(|e| format!("load cgroup/{}: {}", spec.prog, chain(&e)))?;
            // A bpf_link (5.7+) sits beside whatever else is attached there
            // (systemd's, other tools'); the kernel rejects any mode flag on it.
            p.attach(&dir, CgroupAttachMode::Single)
                .map_err(|e| format!("attach cgroup/{} on {}: {}", spec.prog, root.display(), chain(&e)))?;
        }
    }
    Ok(())
}

/// An error and its sources on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK.
fn raise_memlock() {
    let lim = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: setrlimit with a valid struct; failure only matters on old kernels.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
}

/// The kernel's page size (ring buffers are a power-of-two number of pages).
fn page_size() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(n).ok().filter(|n| n.is_power_of_two()).unwrap_or(4096)
}

#[cfg(test)]
mod exec_tests;
#[cfg(test)]
mod snips_tests;
