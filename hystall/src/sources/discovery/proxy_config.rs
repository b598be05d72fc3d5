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

/// (port, config file) for each QUIC server port `pid`'s config names.
pub fn ports_of(pid: u32) -> Vec<(u16, String)> {
    let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return Vec::new() };
    let args: Vec<String> =
        cmd.split(|b| *b == 0).filter_map(|a| std::str::from_utf8(a).ok()).map(str::to_owned).collect();
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_else(|_| PathBuf::from("/"));
    let comm = crate::sources::processes::procs::comm_of(pid).unwrap_or_default();
    let mut out = Vec::new();
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
            let ports = if comm.starts_with("hysteria") { hysteria_ports(&text) } else { sing_box_ports(&text) };
            out.extend(ports.into_iter().map(|p| (p, display(&f))));
        }
    }
    out.sort_unstable();
    out.dedup();
    out
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
