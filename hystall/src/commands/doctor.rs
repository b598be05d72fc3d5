//! `hystall doctor`: what works on this kernel, what is degraded, what to do.
//!
//! Every check is done for real (load and attach each program, create the ring
//! buffer, destroy a loopback socket of our own), not inferred from versions,
//! except where a check would need a program that does not exist yet.

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use ::caps::Capability;

use super::caps;
use crate::cli::DoctorArgs;
use crate::sources::kernel::probes::{ProbeConfig, Probes, btf, send_path::SendPath, tracefs};
use crate::sources::processes::sockdiag::SockDiag;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Degraded,
    Missing,
}

#[derive(Debug, Serialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advice: Option<String>,
}

fn check(name: &str, status: Status, detail: impl Into<String>, advice: Option<&str>) -> Check {
    Check { name: name.into(), status, detail: detail.into(), advice: advice.map(Into::into) }
}

pub fn run(args: DoctorArgs) -> Result<()> {
    let mut checks = checks();
    if args.selftest {
        checks.extend(selftest());
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&checks)?);
    } else {
        let uname = kernel_release();
        println!("hystall doctor — kernel {uname}, {}", std::env::consts::ARCH);
        for c in &checks {
            let tag = match c.status {
                Status::Ok => "ok      ",
                Status::Degraded => "DEGRADED",
                Status::Missing => "MISSING ",
            };
            println!("  {tag} {:<36} {}", c.name, c.detail);
            if let Some(a) = &c.advice {
                println!("           {:<36} → {a}", "");
            }
        }
        let bad = checks.iter().filter(|c| c.status != Status::Ok).count();
        println!(
            "{}",
            if bad == 0 {
                "everything hystall uses works here".to_string()
            } else {
                format!("{bad} check(s) need attention")
            }
        );
    }
    Ok(())
}

pub fn checks() -> Vec<Check> {
    let mut out = Vec::new();
    out.extend(capability_checks());
    let can_load = caps::held(Capability::CAP_BPF) && caps::held(Capability::CAP_PERFMON);

    out.push(match btf::sock_offsets() {
        Ok(o) => check(
            "BTF",
            Status::Ok,
            format!("{} (struct sock: protocol at {}, family at {})", btf::VMLINUX_BTF, o.sk_protocol, o.skc_family),
            None,
        ),
        Err(e) => {
            check("BTF", Status::Missing, e.to_string(), Some("a kernel built with CONFIG_DEBUG_INFO_BTF=y is needed"))
        }
    });

    let tfs = tracefs::ensure_mounted();
    out.push(match &tfs {
        Ok(p) => check("tracefs", Status::Ok, p.display().to_string(), None),
        Err(e) => {
            let advice = if e.to_string().contains("not readable") {
                "run as root or grant CAP_DAC_READ_SEARCH"
            } else {
                "mount -t tracefs nodev /sys/kernel/tracing"
            };
            check("tracefs", Status::Missing, e.to_string(), Some(advice))
        }
    });
    if let Ok(root) = &tfs {
        for (cat, name, what) in [
            (
                "sock",
                "sock_send_length",
                "send results (non-blocking writers; fexit on tcp_sendmsg or zero windows stand in); added in Linux 6.4",
            ),
            ("sock", "inet_sock_set_state", "connect and close of target sockets"),
            ("tcp", "tcp_probe", "ACK progress and peer window"),
            ("tcp", "tcp_destroy_sock", "socket close"),
            ("sched", "sched_process_exec", "a selected proxy that starts is watched within milliseconds"),
            ("raw_syscalls", "sys_enter", "blocking writers"),
        ] {
            let ok = tracefs::exists(root, cat, name);
            out.push(if ok {
                check(&format!("tracepoint {cat}/{name}"), Status::Ok, what, None)
            } else if name == "sock_send_length" {
                // Not a loss by itself: the "send results" line says what stands in.
                check(
                    &format!("tracepoint {cat}/{name}"),
                    Status::Ok,
                    "absent (added in Linux 6.4): see \"send results\" for what stands in",
                    None,
                )
            } else {
                check(&format!("tracepoint {cat}/{name}"), Status::Degraded, format!("absent: loses {what}"), None)
            });
        }
    }

    if can_load {
        match Probes::load(&ProbeConfig { filter_pids: true, ..Default::default() }) {
            Ok(mut p) => {
                // `watch` attaches these on demand; the doctor checks they can attach.
                let _ = p.attach_syscalls();
                for s in &p.status {
                    out.push(if s.attached {
                        check(&format!("program {}", s.name), Status::Ok, "loaded and attached", None)
                    } else {
                        check(
                            &format!("program {}", s.name),
                            Status::Degraded,
                            s.note.clone().unwrap_or_default(),
                            None,
                        )
                    });
                }
                let sp = crate::sources::kernel::probes::send_path::info(p.send_path);
                let status = match p.send_path {
                    Some(SendPath::Tracepoint | SendPath::Fexit) => Status::Ok,
                    _ => Status::Degraded,
                };
                let advice = (status != Status::Ok).then_some(
                    "a kernel with the sock_send_length tracepoint (6.4+) or fexit (BTF trampolines) sees every send's result",
                );
                out.push(check(&format!("send results ({})", sp.path), status, sp.note, advice));
                out.push(match p.take_events() {
                    Ok(_) => check("ring buffer", Status::Ok, "BPF_MAP_TYPE_RINGBUF created", None),
                    Err(e) => {
                        check("ring buffer", Status::Missing, e.to_string(), Some("Linux 5.8 or later is needed"))
                    }
                });
                out.extend(decrypt_checks(&mut p));
            }
            Err(e) => out.push(check("programs", Status::Missing, e.to_string(), None)),
        }
    }

    out.push(match SockDiag::open().and_then(|mut d| d.dump_tcp(netlink_packet_sock_diag::inet::StateFlags::LISTEN)) {
        Ok(v) => check("sock_diag", Status::Ok, format!("{} listening TCP sockets visible", v.len()), None),
        Err(e) => check(
            "sock_diag",
            Status::Missing,
            e.to_string(),
            Some("CONFIG_INET_DIAG and CONFIG_INET_TCP_DIAG are needed"),
        ),
    });
    out.push(sock_destroy_check(caps::held(Capability::CAP_NET_ADMIN)));
    out.push(quic_servers_check());

    let (maj, min) = kernel_version();
    out.push(if (maj, min) >= (6, 6) {
        check("TC attach", Status::Ok, "TCX available (Linux 6.6+); clsact otherwise", None)
    } else {
        check("TC attach", Status::Ok, "clsact qdisc (TCX needs Linux 6.6+)", None)
    });
    out.push(check(
        "kprobes",
        Status::Ok,
        format!(
            "not used (kprobes {}present); hystall needs tracepoints, tp_btf, TC and sock_diag, and fexit on tcp_sendmsg only where sock_send_length is absent",
            if Path::new("/sys/kernel/tracing/kprobe_events").exists() { "" } else { "not " }
        ),
        None,
    ));
    out
}

/// What `watch` with no options would watch on the QUIC side here: the known
/// proxies running, and their UDP ports (server ports at once, or candidates
/// that a client's Initial will show), or why nothing QUIC would be watched.
fn quic_servers_check() -> Check {
    use crate::sources::{discovery::server_ports::ServerPorts, kernel::quic, processes::procs};
    const NAME: &str = "QUIC servers";
    let advice = Some("select the proxy (--pid, --comm, --unit) or name its port with --port P");
    let mode = match procs::Mode::from_selection(&[], &[], &[]) {
        Ok(m) => m,
        Err(e) => return check(NAME, Status::Missing, e.to_string(), None),
    };
    let procs::Mode::Detected { comms } = &mode else {
        return check(
            NAME,
            Status::Degraded,
            format!(
                "no known QUIC proxy running ({}): `watch` would watch every process and find no QUIC server port by itself",
                procs::KNOWN_PROXIES.join(", ")
            ),
            advice,
        );
    };
    let pids = mode.resolve();
    let socks = match SockDiag::open() {
        Ok(mut d) => quic::unconnected_udp(&mut d, &pids, &mut Default::default(), &mut None),
        Err(e) => return check(NAME, Status::Missing, format!("sock_diag: {e}"), None),
    };
    let mut ports = ServerPorts::new(Default::default(), quic::ephemeral_range(), true);
    ports.set_configured(pids.iter().flat_map(|&p| crate::sources::discovery::proxy_config::ports_of(p)).collect());
    ports.update(&socks);
    let info = ports.info("doctor".into());
    let who = format!("{} ({} process(es))", comms.join(", "), pids.len());
    match info.note {
        None => {
            let mut detail = format!("{who}: {}", info.summary());
            if !info.candidates.is_empty() {
                detail.push_str(" (those become server ports when a client's Initial arrives)");
            }
            check(NAME, Status::Ok, detail, None)
        }
        // Only candidates: nothing wrong, the first client shows which serve QUIC.
        Some(_) if !info.candidates.is_empty() => check(
            NAME,
            Status::Ok,
            format!(
                "{who}: UDP port(s) {:?} are watched for a client's Initial, which shows they serve QUIC",
                info.candidates
            ),
            None,
        ),
        Some(note) => check(NAME, Status::Degraded, format!("{who}: {note}"), advice),
    }
}

/// `--decrypt`: uprobes work, and what the key-log uprobe would read in the
/// known proxies running now (each one's Go symbol table is read, and the
/// uprobe attached and detached).
fn decrypt_checks(p: &mut Probes) -> Vec<Check> {
    use crate::sources::{decrypt::uprobes::Uprobes, processes::procs};
    const NAME: &str = "--decrypt";
    if !Path::new("/sys/bus/event_source/devices/uprobe").exists() {
        return vec![check(
            NAME,
            Status::Degraded,
            "uprobes are not available (CONFIG_UPROBES): --decrypt cannot read TLS secrets",
            None,
        )];
    }
    let pids = match procs::Mode::from_selection(&[], &[], &[]) {
        Ok(m @ procs::Mode::Detected { .. }) => m.resolve(),
        _ => {
            return vec![check(
                NAME,
                Status::Ok,
                "uprobes available; no known proxy is running to read secrets from (selected Go servers are probed when they run)",
                None,
            )];
        }
    };
    let mut probes = Uprobes::default();
    probes.sync(p, &pids);
    let out = probes
        .procs()
        .into_iter()
        .map(|pr| {
            let name = format!("{NAME} pid {}", pr.pid);
            match (&pr.note, pr.functions.is_empty()) {
                (None, false) => check(
                    &name,
                    Status::Ok,
                    format!(
                        "{} ({}): TLS secrets at {}; suspect connections' frames can be read live",
                        pr.binary,
                        pr.go_version.as_deref().unwrap_or("Go"),
                        pr.functions.join(", ")
                    ),
                    None,
                ),
                (note, _) => check(
                    &name,
                    Status::Degraded,
                    format!("{}: {}", pr.binary, note.as_deref().unwrap_or("not probed")),
                    Some("verdicts stay inferred (likely); a Clash or Hysteria API confirms them"),
                ),
            }
        })
        .collect();
    probes.sync(p, &Default::default());
    out
}

/// One line per capability `watch` and `--enforce` need: held or missing, and why.
fn capability_checks() -> Vec<Check> {
    let all = caps::missing_of(&[caps::WATCH, caps::ENFORCE], |_| false);
    let enforce_only = |c| !caps::WATCH.iter().any(|n| n.cap == c);
    all.iter()
        .map(|n| {
            let name = format!("capability {}", n.cap);
            if caps::held(n.cap) {
                check(&name, Status::Ok, format!("held ({})", n.why), None)
            } else {
                let status = if enforce_only(n.cap) { Status::Degraded } else { Status::Missing };
                check(&name, status, format!("missing ({})", n.why), Some("run as root or grant it: docs/SERVICE.md"))
            }
        })
        .collect()
}

/// Runs `hystall watch --lab` (4 uploads into never-reading targets, stall
/// timeout 3 s) for 12 s and checks each part of the signature in its events.
fn selftest() -> Vec<Check> {
    let name = |s: &str| format!("selftest: {s}");
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return vec![check(&name("run"), Status::Missing, e.to_string(), None)],
    };
    let out = std::process::Command::new(exe)
        .args(["watch", "--json", "--lab", "--stall-timeout", "3", "--duration", "12"])
        .stderr(std::process::Stdio::null())
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            return vec![check(&name("run"), Status::Missing, format!("watch --lab failed: {}", o.status), None)];
        }
        Err(e) => return vec![check(&name("run"), Status::Missing, e.to_string(), None)],
    };
    let events: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let count = |ev: &str| events.iter().filter(|e| e["event"] == ev).count();
    let starved = events.iter().rfind(|e| e["event"] == "quic_starved");
    let verdict = |ok: bool, what: &str, detail: String, advice: &str| {
        if ok {
            check(&name(what), Status::Ok, detail, None)
        } else {
            check(&name(what), Status::Missing, detail, Some(advice))
        }
    };
    vec![
        verdict(
            count("socket_stalled") >= 3,
            "stalled targets",
            format!("{} socket_stalled (4 expected)", count("socket_stalled")),
            "the send-path probes do not see the lab's blocked writes",
        ),
        verdict(
            count("quic_conn_opened") == 1,
            "QUIC connection",
            format!("{} quic_conn_opened (1 expected)", count("quic_conn_opened")),
            "the TC classifier does not see the lab's QUIC traffic on lo",
        ),
        verdict(
            starved.is_some(),
            "starvation",
            starved.map_or_else(
                || "no quic_starved".to_string(),
                |e| {
                    format!(
                        "quic_starved, {} with {} stalled targets",
                        e["confidence"],
                        e["stalled"].as_array().map_or(0, Vec::len)
                    )
                },
            ),
            "see docs/DETECTOR.md",
        ),
    ]
}

/// Destroys a loopback connection of our own: whether SOCK_DESTROY works.
pub fn destroy_works() -> Result<bool> {
    {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let c = TcpStream::connect(l.local_addr()?)?;
        let _accepted = l.accept()?;
        let cookie = socket_cookie(c.as_raw_fd())?;
        let mut d = SockDiag::open()?;
        d.destroy(cookie, c.local_addr()?, c.peer_addr()?)?;
        // A destroyed socket reports ECONNABORTED to its owner.
        c.set_nonblocking(true)?;
        let mut buf = [0u8; 1];
        Ok(matches!(std::io::Read::read(&mut &c, &mut buf), Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED)))
    }
}

fn sock_destroy_check(net_admin: bool) -> Check {
    const NAME: &str = "SOCK_DESTROY";
    if !net_admin {
        return check(NAME, Status::Missing, "needs CAP_NET_ADMIN", Some("run as root or grant CAP_NET_ADMIN"));
    }
    match destroy_works() {
        Ok(true) => check(NAME, Status::Ok, "destroyed a loopback test socket (enforcement can work)", None),
        Ok(false) => check(NAME, Status::Degraded, "the destroy was accepted but the socket lived on", None),
        Err(e) => check(
            NAME,
            Status::Missing,
            format!("{e:#}"),
            Some("needs CONFIG_INET_DIAG_DESTROY; enforcement falls back to pidfd_getfd + shutdown"),
        ),
    }
}

/// SO_COOKIE of a socket: the key the probes and sock_diag share.
pub fn socket_cookie(fd: i32) -> std::io::Result<u64> {
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cookie`.
    let rc = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_COOKIE, (&raw mut cookie).cast(), &mut len) };
    if rc == 0 { Ok(cookie) } else { Err(std::io::Error::last_os_error()) }
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_owned()).unwrap_or_else(|_| "?".into())
}

fn kernel_version() -> (u32, u32) {
    let r = kernel_release();
    let mut it = r.split(|c: char| !c.is_ascii_digit()).filter_map(|s| s.parse().ok());
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}
