//! Root end-to-end test of the Prometheus exporter: `watch --lab --metrics`
//! scraped by a real Prometheus (the Debian package) every second, with the
//! alert rules of deploy/prometheus loaded: the starvation shows in the
//! queried series and its alert fires. Also checks the rules with promtool.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Proc, root_or_skip};
use serde_json::Value;

const PROMETHEUS: &str = "/usr/bin/prometheus";
const PROMTOOL: &str = "/usr/bin/promtool";

fn rules_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus/hystall-alerts.yml")
}

/// A free TCP port on loopback (bound, read, released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// A temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let p = std::env::temp_dir().join(format!("hystall-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A Prometheus server, killed (and waited for) on drop.
struct Prometheus {
    child: Child,
    base: String,
    log: PathBuf,
}

impl Prometheus {
    fn start(dir: &Path, port: u16) -> Prometheus {
        let log = dir.join("prometheus.log");
        let out = std::fs::File::create(&log).expect("log file");
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log fd"))
            .stderr(out)
            .spawn()
            .expect("spawn prometheus");
        Prometheus { child, base: format!("http://127.0.0.1:{port}"), log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn get(&self, path_and_query: &str) -> Option<Value> {
        let mut res = ureq::get(&format!("{}{path_and_query}", self.base)).call().ok()?;
        let body = res.body_mut().read_to_string().ok()?;
        serde_json::from_str(&body).ok()
    }

    /// The value of an instant query's first sample.
    fn query(&self, q: &str) -> Option<f64> {
        let v = self.get(&format!("/api/v1/query?query={}", encode(q)))?;
        v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    }

    /// The state of the alerting rule `name` (inactive, pending, firing) and its health.
    fn rule(&self, name: &str) -> Option<(String, String)> {
        let v = self.get("/api/v1/rules?type=alert")?;
        let rules =
            v["data"]["groups"].as_array()?.iter().flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default());
        rules
            .into_iter()
            .find(|r| r["name"] == name)
            .map(|r| (r["state"].as_str().unwrap_or("").to_owned(), r["health"].as_str().unwrap_or("").to_owned()))
    }

    /// Polls `f` until it is true; panics with Prometheus' log otherwise.
    fn wait(&self, what: &str, within: Duration, mut f: impl FnMut(&Prometheus) -> bool) {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if f(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!("{what}: not within {within:?}; prometheus log:\n{}", self.log());
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Percent-encoding of a PromQL query for a URL query string.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn promtool(args: &[&str]) -> (bool, String) {
    let out = Command::new(PROMTOOL).args(args).output().expect("run promtool");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// Waits up to a few minutes for the prometheus package (it may be installing).
fn have_prometheus() -> bool {
    let deadline = Instant::now() + Duration::from_secs(180);
    while Instant::now() < deadline {
        if Path::new(PROMETHEUS).exists() && Path::new(PROMTOOL).exists() {
            return true;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    false
}

#[test]
fn alert_rules_pass_promtool() {
    if !Path::new(PROMTOOL).exists() {
        eprintln!("alert_rules_pass_promtool: skipped: promtool not installed (Debian package prometheus)");
        return;
    }
    let f = rules_file();
    let (ok, out) = promtool(&["check", "rules", f.to_str().unwrap()]);
    assert!(ok, "promtool check rules: {out}");
    assert!(out.contains("6 rules found"), "{out}");
}

#[test]
fn prometheus_scrapes_a_starved_lab_and_the_alert_fires() {
    let Some(_g) = root_or_skip("prometheus_scrapes_a_starved_lab_and_the_alert_fires") else { return };
    assert!(have_prometheus(), "{PROMETHEUS} is missing: apt-get install prometheus (cargo xtask setup does)");
    let dir = TempDir::new("prom");
    let (exporter_port, prom_port) = (free_port(), free_port());

    // The rules as shipped, with the starvation alert's `for:` shortened.
    let rules = std::fs::read_to_string(rules_file()).expect("rules");
    let quick = rules.replacen("for: 30s", "for: 2s", 1);
    assert_ne!(quick, rules, "the starvation rule has `for: 30s`");
    std::fs::write(dir.0.join("rules.yml"), quick).unwrap();
    std::fs::write(
        dir.0.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - rules.yml\n\
             scrape_configs:\n  - job_name: hystall\n    static_configs:\n      - targets: ['127.0.0.1:{exporter_port}']\n"
        ),
    )
    .unwrap();
    let (ok, out) = promtool(&["check", "config", dir.0.join("prometheus.yml").to_str().unwrap()]);
    assert!(ok, "promtool check config: {out}");

    let addr = format!("127.0.0.1:{exporter_port}");
    let mut w = Proc::spawn(&[
        "watch",
        "--json",
        "--lab",
        "--lab-uploads",
        "4",
        "--stall-timeout",
        "3",
        "--metrics",
        &addr,
        "--duration",
        "120",
    ]);
    w.wait_event("watch_started", Duration::from_secs(30));

    // The exporter itself: the index, and the 0.0.4 text format.
    let mut res = ureq::get(&format!("http://{addr}/metrics")).call().expect("GET /metrics");
    let ct = res.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    let body = res.body_mut().read_to_string().expect("body");
    assert!(body.contains("\nhystall_up 1\n"), "{body}");
    let mut index = ureq::get(&format!("http://{addr}/")).call().expect("GET /");
    assert!(index.body_mut().read_to_string().unwrap().contains("/metrics"));

    let prom = Prometheus::start(&dir.0, prom_port);
    prom.wait("Prometheus ready", Duration::from_secs(60), |p| {
        ureq::get(&format!("{}/-/ready", p.base)).call().is_ok()
    });
    prom.wait("the scrape target up", Duration::from_secs(30), |p| p.query("up{job=\"hystall\"}") == Some(1.0));
    prom.wait("a likely starved connection and 3 stalled targets", Duration::from_secs(60), |p| {
        p.query("hystall_starved_connections{confidence=\"likely\"}").is_some_and(|v| v >= 1.0)
            && p.query("hystall_stalled_targets").is_some_and(|v| v >= 3.0)
    });
    assert!(prom.query("hystall_quic_connections").is_some_and(|v| v >= 1.0));
    assert!(prom.query("hystall_starvation_events_total").is_some_and(|v| v >= 1.0));
    assert!(prom.query("hystall_events_total{event=\"socket_stalled\"}").is_some_and(|v| v >= 3.0));
    assert!(prom.query("hystall_kernel_events_total").is_some_and(|v| v > 0.0));
    assert_eq!(prom.query("hystall_probes_degraded"), Some(0.0));
    assert_eq!(prom.query("count(hystall_starved_connections)"), Some(3.0), "all three confidences present");
    // As root, BPF statistics are on and our programs have run.
    assert_eq!(prom.query("hystall_probe_stats_enabled"), Some(1.0));
    prom.wait("probe run counts", Duration::from_secs(10), |p| {
        p.query("sum(hystall_probe_run_count_total)").is_some_and(|v| v > 0.0)
    });

    prom.wait("HystallStarvation firing", Duration::from_secs(30), |p| {
        p.rule("HystallStarvation").is_some_and(|(state, _)| state == "firing")
    });
    // The lab's QUIC port is watched: the no-server alert stays quiet.
    assert!(prom.query("hystall_quic_server_ports").is_some_and(|v| v >= 1.0));
    for name in [
        "HystallEnforcementAction",
        "HystallKernelEventsLost",
        "HystallProbesDegraded",
        "HystallNoQuicServer",
        "HystallDown",
    ] {
        let (state, health) = prom.rule(name).unwrap_or_else(|| panic!("rule {name} not loaded"));
        assert_eq!(health, "ok", "{name}");
        assert_eq!(state, "inactive", "{name}");
    }

    assert_eq!(w.stop(), Some(0), "watch exits cleanly on SIGTERM");
    // Gone: the scrape fails, and the port is free again.
    prom.wait("up == 0 after hystall stopped", Duration::from_secs(15), |p| {
        p.query("up{job=\"hystall\"}") == Some(0.0)
    });
    assert!(TcpListener::bind(&addr).is_ok(), "the exporter's port is released");
}

#[test]
fn a_taken_metrics_port_is_a_one_line_error() {
    let Some(_g) = root_or_skip("a_taken_metrics_port_is_a_one_line_error") else { return };
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().unwrap().to_string();
    let out = Command::new(common::bin())
        .args(["watch", "--json", "--metrics", &addr, "--duration", "5"])
        .stdin(Stdio::null())
        .output()
        .expect("run hystall");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--metrics") && err.contains(&addr), "{err}");
    assert!(out.stdout.is_empty(), "nothing started: {}", String::from_utf8_lossy(&out.stdout));
}
