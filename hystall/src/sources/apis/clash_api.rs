//! The Clash API that sing-box (`experimental.clash_api`) and mihomo
//! (`external-controller`) serve: `GET /connections` lists every relayed
//! connection with the inbound that accepted it, the client's address (for a
//! QUIC inbound: the client's UDP address, which names its QUIC connection),
//! the destination, the bytes uploaded and its start. The attribution matches
//! each record to the target socket the server dialled for it: exact links.
//!
//! The API is found from the server's own config when hystall can read it
//! (`-c FILE` / `-C DIR` on its command line), or given with `--clash-api`.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::time::Duration;

use serde::Deserialize;

use crate::core::attribution::api::RelayRecord;
use crate::core::observation::Observation;
use crate::core::time::{Mono, mono_now};

#[derive(Debug, thiserror::Error)]
pub enum ClashError {
    #[error("Clash API {0}: {1}")]
    Http(String, String),
    #[error("Clash API answer is not a connection list: {0}")]
    Decode(String),
}

/// Where the API is and its secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClashApi {
    /// `http://host:port`.
    pub base: String,
    pub secret: Option<String>,
    /// The process that serves it (its records are that process's relays).
    pub pid: Option<u32>,
}

#[derive(Deserialize)]
struct Connections {
    #[serde(default)]
    connections: Option<Vec<Conn>>,
}

#[derive(Deserialize)]
struct Conn {
    #[serde(default)]
    id: String,
    metadata: Metadata,
    #[serde(default)]
    upload: u64,
    #[serde(default)]
    start: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Metadata {
    #[serde(default)]
    network: String,
    /// sing-box: `hysteria2/hy2-in` (type/tag); mihomo: `Hysteria2`.
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default, rename = "sourceIP")]
    source_ip: String,
    #[serde(default)]
    source_port: String,
    #[serde(default, rename = "destinationIP")]
    destination_ip: String,
    #[serde(default)]
    destination_port: String,
}

/// Parses a `/connections` body into the TCP relays it lists; `now` and
/// `now_unix_ns` place the start times on the monotonic clock.
pub fn parse_connections(
    body: &str,
    pid: Option<u32>,
    now: Mono,
    now_unix_ns: i128,
) -> Result<Vec<RelayRecord>, ClashError> {
    let list: Connections = serde_json::from_str(body).map_err(|e| ClashError::Decode(e.to_string()))?;
    Ok(list
        .connections
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.metadata.network.eq_ignore_ascii_case("tcp"))
        .filter_map(|c| {
            let dest_port = c.metadata.destination_port.parse::<u16>().ok()?;
            let source = match (c.metadata.source_ip.parse::<IpAddr>(), c.metadata.source_port.parse::<u16>()) {
                (Ok(ip), Ok(port)) => Some(SocketAddr::new(ip.to_canonical(), port)),
                _ => None,
            };
            let age_ns = c
                .start
                .parse::<jiff::Timestamp>()
                .map(|t| (now_unix_ns - t.as_nanosecond()).max(0) as u64)
                .unwrap_or(0);
            Some(RelayRecord {
                id: c.id,
                inbound: c.metadata.kind,
                source,
                dest_ip: c.metadata.destination_ip.parse::<IpAddr>().ok().map(|ip| ip.to_canonical()),
                dest_port,
                upload: c.upload,
                start: Mono(now.0.saturating_sub(age_ns)),
                pid,
            })
        })
        .collect())
}

/// Fetches the connection list once.
pub fn fetch(agent: &ureq::Agent, api: &ClashApi) -> Result<Vec<RelayRecord>, ClashError> {
    let url = format!("{}/connections", api.base.trim_end_matches('/'));
    let mut req = agent.get(&url).header("Accept", "application/json");
    if let Some(s) = &api.secret {
        req = req.header("Authorization", format!("Bearer {s}"));
    }
    let mut resp = req.call().map_err(|e| ClashError::Http(url.clone(), e.to_string()))?;
    let body = resp
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_to_string()
        .map_err(|e| ClashError::Http(url.clone(), e.to_string()))?;
    let now = mono_now();
    let unix =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i128).unwrap_or(0);
    parse_connections(&body, api.pid, now, unix)
}

/// Polls the API every `every` on a thread of its own and sends what it gets.
pub fn spawn_poller(api: ClashApi, every: Duration, tx: Sender<Observation>) {
    super::api_poll::spawn(every, tx, move |agent| {
        fetch(agent, &api).map(|records| Observation::Relays { at: mono_now(), records })
    });
}

/// The Clash API a watched process serves, from its own config: sing-box
/// (`run -c FILE`, `-C DIR`: `experimental.clash_api.external_controller`
/// and `secret`) or mihomo (`-f FILE`, `-d DIR` → `config.yaml`:
/// `external-controller`, `secret`). None when it has none or it cannot be read.
pub fn discover(pid: u32) -> Option<ClashApi> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> =
        cmdline.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_else(|_| PathBuf::from("/"));
    // The process's view of its files (its root may differ: containers).
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    for file in config_files(&args, &cwd) {
        let inside = root.join(file.strip_prefix("/").unwrap_or(&file));
        let Ok(text) = std::fs::read_to_string(&inside) else { continue };
        if let Some(mut api) = from_config(&text) {
            api.pid = Some(pid);
            return Some(api);
        }
    }
    None
}

/// The config files a command line names (absolute), in the order read.
pub fn config_files(args: &[String], cwd: &Path) -> Vec<PathBuf> {
    let abs = |p: &str| if Path::new(p).is_absolute() { PathBuf::from(p) } else { cwd.join(p) };
    let mut out = Vec::new();
    let mut it = args.iter().skip(1).peekable();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with('-') => (f, Some(v.to_owned())),
            _ => (a.as_str(), None),
        };
        let mut value = || inline.clone().or_else(|| it.next().cloned());
        match flag {
            "-c" | "--config" | "-f" => {
                if let Some(v) = value() {
                    out.push(abs(&v));
                }
            }
            "-C" | "--config-directory" => {
                if let Some(v) = value()
                    && let Ok(dir) = std::fs::read_dir(abs(&v))
                {
                    let mut files: Vec<PathBuf> = dir.flatten().map(|e| e.path()).collect();
                    files.sort();
                    out.extend(files.into_iter().filter(|p| p.extension().is_some_and(|e| e == "json")));
                }
            }
            "-d" => {
                if let Some(v) = value() {
                    out.push(abs(&v).join("config.yaml"));
                }
            }
            _ => {}
        }
    }
    if out.is_empty() && args.first().is_some_and(|a| a.ends_with("sing-box")) {
        // sing-box's default.
        out.push(cwd.join("config.json"));
    }
    out
}

/// The API a config text declares: sing-box JSON or mihomo YAML.
pub fn from_config(text: &str) -> Option<ClashApi> {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(text) {
        let api = &v["experimental"]["clash_api"];
        let addr = api["external_controller"].as_str()?;
        return Some(ClashApi {
            base: base_url(addr),
            secret: api["secret"].as_str().filter(|s| !s.is_empty()).map(str::to_owned),
            pid: None,
        });
    }
    // mihomo's YAML: two top-level keys are all we need.
    let key = |name: &str| {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.trim_start().strip_prefix(':')?;
            let v = rest.split(" #").next().unwrap_or("").trim().trim_matches(|c| c == '"' || c == '\'');
            (!v.is_empty()).then(|| v.to_owned())
        })
    };
    let addr = key("external-controller")?;
    Some(ClashApi { base: base_url(&addr), secret: key("secret"), pid: None })
}

/// `http://` + the controller's address; a wildcard host is reached on loopback.
fn base_url(addr: &str) -> String {
    let addr = addr.trim();
    if addr.starts_with("http://") || addr.starts_with("https://") {
        return addr.trim_end_matches('/').to_owned();
    }
    let addr = match addr.rsplit_once(':') {
        Some(("", port)) | Some(("0.0.0.0", port)) => format!("127.0.0.1:{port}"),
        Some(("[::]", port)) => format!("[::1]:{port}"),
        _ => addr.to_owned(),
    };
    format!("http://{addr}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What sing-box 1.14.4 answered for one relayed upload (checked here).
    const SING_BOX: &str = r#"{"connections":[{"chains":["direct"],"download":0,"id":"e136efd6-233d-415d-a9b0-edd436011c53","metadata":{"destinationIP":"127.0.0.1","destinationPort":"25555","dnsMode":"normal","host":"","network":"tcp","processPath":"","sourceIP":"127.0.0.1","sourcePort":"36444","type":"hysteria2/hy2-in"},"rule":"final","rulePayload":"","start":"2026-12-04T15:39:42.428428443Z","upload":12965},{"chains":["direct"],"download":0,"id":"u","metadata":{"destinationIP":"1.1.1.1","destinationPort":"53","network":"udp","sourceIP":"127.0.0.1","sourcePort":"36444","type":"hysteria2/hy2-in"},"start":"2026-12-04T15:39:42Z","upload":40}],"downloadTotal":0,"memory":4390912,"uploadTotal":12965}"#;

    #[test]
    fn parses_the_connections_of_sing_box() {
        let now_unix = "2026-12-04T15:39:43.428428443Z".parse::<jiff::Timestamp>().unwrap().as_nanosecond();
        let r = parse_connections(SING_BOX, Some(7), Mono(10_000_000_000), now_unix).unwrap();
        assert_eq!(r.len(), 1, "UDP relays are not targets");
        let r = &r[0];
        assert_eq!(r.source, Some("127.0.0.1:36444".parse().unwrap()));
        assert_eq!((r.dest_ip, r.dest_port, r.upload), (Some("127.0.0.1".parse().unwrap()), 25555, 12965));
        assert_eq!(r.start, Mono(9_000_000_000), "one second before the answer");
        assert!(r.quic_inbound());
        assert_eq!(r.pid, Some(7));
    }

    #[test]
    fn a_body_that_is_not_the_list_is_an_error() {
        assert!(parse_connections("<html>", None, Mono(0), 0).is_err());
        assert!(parse_connections(r#"{"connections":null}"#, None, Mono(0), 0).unwrap().is_empty());
    }

    #[test]
    fn finds_the_api_in_sing_box_and_mihomo_configs() {
        let sb = r#"{"experimental":{"clash_api":{"external_controller":"0.0.0.0:9090","secret":"s3"}}}"#;
        assert_eq!(
            from_config(sb),
            Some(ClashApi { base: "http://127.0.0.1:9090".into(), secret: Some("s3".into()), pid: None })
        );
        assert_eq!(from_config(r#"{"inbounds":[]}"#), None);
        let mihomo = "mixed-port: 7890\nexternal-controller: '[::]:9097' # api\nsecret: \"k\"\n";
        assert_eq!(
            from_config(mihomo),
            Some(ClashApi { base: "http://[::1]:9097".into(), secret: Some("k".into()), pid: None })
        );
        assert_eq!(from_config("mode: rule\n"), None);
    }

    #[test]
    fn reads_the_config_files_a_command_line_names() {
        let args = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        let cwd = Path::new("/srv");
        assert_eq!(config_files(&args("sing-box run -c server.json"), cwd), [PathBuf::from("/srv/server.json")]);
        assert_eq!(config_files(&args("sing-box run --config=/etc/sb.json"), cwd), [PathBuf::from("/etc/sb.json")]);
        assert_eq!(config_files(&args("/usr/bin/sing-box run"), cwd), [PathBuf::from("/srv/config.json")]);
        assert_eq!(config_files(&args("mihomo -d /etc/mihomo"), cwd), [PathBuf::from("/etc/mihomo/config.yaml")]);
    }
}
