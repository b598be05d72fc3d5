//! Hysteria's Traffic Stats API (v2.6+): `GET /dump/streams` lists every QUIC
//! stream with its state, byte counts, requested address and last activity.
//! It is exact evidence the kernel cannot give: which streams of which
//! connection are established and frozen, and where they go.

use std::sync::mpsc::Sender;
use std::time::Duration;

use serde::Deserialize;

use crate::core::observation::{Observation, ServerStream};
use crate::core::time::{Mono, mono_now};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("Hysteria API {0}: {1}")]
    Http(String, String),
    #[error("Hysteria API answer is not the stream dump: {0}")]
    Decode(String),
}

/// One entry of `/dump/streams` (apernet/hysteria extras/trafficlogger).
#[derive(Clone, Debug, Deserialize)]
struct DumpEntry {
    state: String,
    connection: u32,
    stream: u64,
    #[serde(default)]
    req_addr: String,
    #[serde(default)]
    hooked_req_addr: String,
    tx: u64,
    rx: u64,
    last_active_at: String,
}

#[derive(Deserialize)]
struct Dump {
    #[serde(default)]
    streams: Option<Vec<DumpEntry>>,
}

/// Parses a `/dump/streams` JSON body; `now`/`now_unix_ns` place the
/// timestamps on the monotonic clock.
pub fn parse_dump(body: &str, now: Mono, now_unix_ns: i128) -> Result<Vec<ServerStream>, ApiError> {
    let dump: Dump = serde_json::from_str(body).map_err(|e| ApiError::Decode(e.to_string()))?;
    Ok(dump
        .streams
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            let idle_ns = e
                .last_active_at
                .parse::<jiff::Timestamp>()
                .map(|t| (now_unix_ns - t.as_nanosecond()).max(0) as u64)
                .unwrap_or(0);
            ServerStream {
                connection: e.connection,
                stream: e.stream,
                state: e.state,
                req_addr: e.req_addr,
                hooked_req_addr: e.hooked_req_addr,
                tx: e.tx,
                rx: e.rx,
                last_active: Mono(now.0.saturating_sub(idle_ns)),
            }
        })
        .collect())
}

/// Fetches the stream dump once.
pub fn fetch(agent: &ureq::Agent, base: &str, secret: Option<&str>) -> Result<Vec<ServerStream>, ApiError> {
    let url = format!("{}/dump/streams", base.trim_end_matches('/'));
    let mut req = agent.get(&url).header("Accept", "application/json");
    if let Some(s) = secret {
        req = req.header("Authorization", s);
    }
    let mut resp = req.call().map_err(|e| ApiError::Http(url.clone(), e.to_string()))?;
    let body = resp.body_mut().read_to_string().map_err(|e| ApiError::Http(url.clone(), e.to_string()))?;
    let now = mono_now();
    let unix =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i128).unwrap_or(0);
    parse_dump(&body, now, unix)
}

/// Polls the API every `every` on a thread of its own and sends what it gets.
pub fn spawn_poller(base: String, secret: Option<String>, every: Duration, tx: Sender<Observation>) {
    super::api_poll::spawn(every, tx, move |agent| {
        fetch(agent, &base, secret.as_deref()).map(|streams| Observation::Streams { at: mono_now(), streams })
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_dump_of_hysteria_2_6() {
        let body = r#"{"streams":[{"state":"estab","auth":"user","connection":3735928559,"stream":4,"req_addr":"example.com:443","hooked_req_addr":"93.184.216.34:443","tx":1024,"rx":8388608,"initial_at":"2026-12-02T13:00:00Z","last_active_at":"2026-12-02T13:00:10Z"}]}"#;
        let now_unix = "2026-12-02T13:00:25Z".parse::<jiff::Timestamp>().unwrap().as_nanosecond();
        let s = parse_dump(body, Mono::from_secs_f64(100.0), now_unix).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].connection, 0xdeadbeef);
        assert_eq!(s[0].hooked_req_addr, "93.184.216.34:443");
        assert_eq!(s[0].last_active, Mono::from_secs_f64(85.0), "15 s idle");
        assert!(parse_dump(r#"{"streams":null}"#, Mono(1), 0).unwrap().is_empty());
        assert!(parse_dump("<html>", Mono(1), 0).is_err());
    }

    #[test]
    fn fetches_over_http_with_the_secret() {
        use std::io::{BufRead, BufReader, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut auth = String::new();
            let mut r = BufReader::new(c.try_clone().unwrap());
            loop {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                if line.to_ascii_lowercase().starts_with("authorization:") {
                    auth = line.split_once(':').unwrap().1.trim().to_owned();
                }
                if line == "\r\n" || line.is_empty() {
                    break;
                }
            }
            let body = r#"{"streams":[]}"#;
            write!(
                c,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            auth
        });
        let agent: ureq::Agent = ureq::Agent::config_builder().build().into();
        let got = fetch(&agent, &format!("http://{addr}"), Some("s3cret")).unwrap();
        assert!(got.is_empty());
        assert_eq!(server.join().unwrap(), "s3cret");
    }
}
