//! QUIC server ports that a proxy's own configuration names, for servers whose
//! connections were open before hystall started: traffic shows a server port
//! only at a client's next Initial, the config at once.
//!
//! Read: sing-box (`run -c FILE`, `-C DIR`: JSON, the `listen_port` of
//! hysteria, hysteria2, tuic and naive inbounds) and Hysteria (`server -c
//! FILE`: the top-level `listen:` of its YAML, 443 when absent). Paths are
//! taken from /proc/PID/cmdline, relative to /proc/PID/cwd. Anything else
//! (other proxies, configs from stdin or a remote source) is left to traffic.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Inbound types of sing-box that serve QUIC.
const SING_BOX_QUIC: &[&str] = &["hysteria", "hysteria2", "tuic", "naive"];
/// Those of them whose server answers each TCP request once it dialled
/// (sing-quic's Hysteria 2 `HandshakeSuccess`). Its Hysteria (v1) inbound
/// is not among them: its server showed no answer in the window after a
/// dial (`protocols_e2e`'s debug log: every answer `None` or `Unknown`).
const SING_BOX_ANSWERS: &[&str] = &["hysteria2"];

/// What `pid`'s own configuration says of its QUIC service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Served {
    /// (port, config file) for each QUIC server port it names.
    pub ports: Vec<(u16, String)>,
    /// Every QUIC inbound it names speaks a protocol whose server answers
    /// each TCP request once its target is dialled (Hysteria 2's
    /// `TCPResponse`), so the attribution's reply rule holds for it from the
    /// first request (`attribution::reply`): sing-box's `hysteria2` inbounds,
    /// the Hysteria (2) server. TUIC, naive and sing-box's Hysteria v1 do not
    /// (v1 showed no answer after a dial): a config naming one leaves this
    /// false, and the rule is learned from the traffic as before.
    pub answers: bool,
}

/// (port, config file) for each QUIC server port `pid`'s config names.
pub fn ports_of(pid: u32) -> Vec<(u16, String)> {
    served_by(pid).ports
}

/// What `pid`'s config names: its QUIC ports and whether they answer requests.
pub fn served_by(pid: u32) -> Served {
    let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return Served::default() };
    let args: Vec<String> =
        cmd.split(|b| *b == 0).filter_map(|a| std::str::from_utf8(a).ok()).map(str::to_owned).collect();
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_else(|_| PathBuf::from("/"));
    let comm = crate::sources::processes::procs::comm_of(pid).unwrap_or_default();
    let mut out = Vec::new();
    // None until a config names a QUIC inbound.
    let mut answers: Option<bool> = None;
    for (flag, path) in config_args(&args) {
        let path = cwd.join(path);
        let files: Vec<PathBuf> = if flag == "-C" || flag == "--config-directory" {
            std::fs::read_dir(&path)
                .map(|rd| {
                    rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "json")).collect()
                })
                .unwrap_or_default()
        } else {
            vec![path]
        };
        for f in files {
            let Ok(text) = std::fs::read_to_string(&f) else { continue };
            let (ports, answer) = if comm.starts_with("hysteria") {
                (hysteria_ports(&text), Some(true))
            } else {
                (sing_box_ports(&text), sing_box_answers(&text))
            };
            if let Some(a) = answer {
                answers = Some(answers.unwrap_or(true) && a);
            }
            out.extend(ports.into_iter().map(|p| (p, display(&f))));
        }
    }
    out.sort_unstable();
    out.dedup();
    Served { ports: out, answers: answers.unwrap_or(false) }
}

/// Whether every QUIC inbound of a sing-box config answers each TCP request
/// (None: it names none).
pub fn sing_box_answers(json: &str) -> Option<bool> {
    let v: Value = serde_json::from_str(json).ok()?;
    let kinds: Vec<&str> = v["inbounds"]
        .as_array()?
        .iter()
        .filter_map(|i| i["type"].as_str())
        .filter(|t| SING_BOX_QUIC.contains(t))
        .collect();
    (!kinds.is_empty()).then(|| kinds.iter().all(|t| SING_BOX_ANSWERS.contains(t)))
}

fn display(p: &Path) -> String {
    p.display().to_string()
}

/// (flag, value) of the config options in a command line.
fn config_args(args: &[String]) -> Vec<(&str, &str)> {
    let mut out = Vec::new();
    let mut it = args.iter().skip(1).peekable();
    while let Some(a) = it.next() {
        for flag in ["-c", "--config", "-C", "--config-directory"] {
            if a == flag
                && let Some(v) = it.peek()
            {
                out.push((flag, v.as_str()));
            } else if let Some(v) = a.strip_prefix(&format!("{flag}=")) {
                out.push((flag, v));
            }
        }
    }
    out
}

/// The `listen_port` of sing-box's QUIC inbounds.
pub fn sing_box_ports(json: &str) -> Vec<u16> {
    let Ok(v) = serde_json::from_str::<Value>(json) else { return Vec::new() };
    let Some(inbounds) = v["inbounds"].as_array() else { return Vec::new() };
    inbounds
        .iter()
        .filter(|i| i["type"].as_str().is_some_and(|t| SING_BOX_QUIC.contains(&t)))
        .filter_map(|i| i["listen_port"].as_u64().and_then(|p| u16::try_from(p).ok()))
        .collect()
}

/// The port of Hysteria's top-level `listen:` ("[host]:port"), 443 by default.
pub fn hysteria_ports(yaml: &str) -> Vec<u16> {
    let listen = yaml.lines().find_map(|l| {
        let v = l.strip_prefix("listen:")?.trim();
        let v = v.split('#').next()?.trim().trim_matches(|c| c == '"' || c == '\'');
        Some(v.to_owned())
    });
    match listen {
        None => vec![443],
        Some(v) => v.rsplit(':').next().and_then(|p| p.parse().ok()).into_iter().collect(),
    }
}

#[cfg(test)]
mod tests;
