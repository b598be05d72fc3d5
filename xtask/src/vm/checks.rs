//! Judging one run's check outputs (what checks.sh left in OUT): one
//! verdict per check, with a detail line that says what was seen, and the
//! figures for the table (probe path, stall → quic_starved latency).
//!
//! The events are `hystall watch --json` lines (docs/EVENTS.md).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;

/// The checks, in the order they are printed.
pub const NAMES: [&str; 8] = ["version", "doctor", "stall", "fast", "slow", "tcp", "enforce", "singbox"];

pub struct Check {
    pub name: &'static str,
    pub pass: bool,
    pub detail: String,
}

/// What a run showed besides the verdicts: the table's columns.
#[derive(Default)]
pub struct Figures {
    /// How blocked non-blocking writers are seen (`watch_started.send_path`:
    /// tracepoint, fexit, zero_window, none); empty for a binary without it.
    pub send_path: String,
    /// The socket programs attached in the stall lab's watch, `+`-joined.
    pub probes: String,
    /// Socket programs that are not attached (with why, shortened).
    pub missing: Vec<String>,
    /// `TCX` or `clsact`, from doctor.
    pub tc: String,
    /// Stall onset (the first lab target's last progress) → quic_starved, ms.
    pub onset_to_starved_ms: Option<i64>,
    /// watch_started → quic_starved, ms.
    pub start_to_starved_ms: Option<i64>,
}

/// Judges every check of the run in `out`. `broken` says why checks may be
/// missing (the guest did not boot or stopped early).
pub fn judge(out: &Path, broken: Option<&str>) -> (Vec<Check>, Figures) {
    let r = Reader { out, broken };
    let mut fig = Figures::default();
    let doctor_json = r.read("doctor-json", "out");
    fig.tc = tc_mode(doctor_json.as_deref());
    let stall = r.watch("stall");
    if let Some(w) = &stall {
        (fig.probes, fig.missing) = w.probe_path();
        fig.send_path = w.started().and_then(|s| s["send_path"]["path"].as_str()).unwrap_or_default().to_owned();
    }
    let checks = vec![
        version(&r),
        doctor(&r, doctor_json.as_deref()),
        lab_stall(&r, stall.as_ref(), &mut fig),
        lab_quiet(&r, "fast"),
        lab_quiet(&r, "slow"),
        tcp(&r),
        enforce(&r),
        singbox(&r),
    ];
    (checks, fig)
}

struct Reader<'a> {
    out: &'a Path,
    broken: Option<&'a str>,
}

impl Reader<'_> {
    fn read(&self, name: &str, ext: &str) -> Option<String> {
        std::fs::read_to_string(self.out.join(format!("c-{name}.{ext}"))).ok()
    }

    fn rc(&self, name: &str) -> Option<i32> {
        self.read(name, "rc")?.trim().parse().ok()
    }

    /// The check never ran (its exit code is missing): why.
    fn not_run(&self, name: &'static str) -> Check {
        let why = self.broken.unwrap_or("checks.sh left no result");
        fail(name, format!("not run: {why}"))
    }

    fn watch(&self, name: &str) -> Option<Watch> {
        self.rc(name)?;
        let events =
            self.read(name, "out").unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        Some(Watch { events, stderr: self.read(name, "err").unwrap_or_default() })
    }
}

fn pass(name: &'static str, detail: String) -> Check {
    Check { name, pass: true, detail }
}

fn fail(name: &'static str, detail: String) -> Check {
    Check { name, pass: false, detail }
}

/// One `watch --json` run.
struct Watch {
    events: Vec<Value>,
    stderr: String,
}

impl Watch {
    fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.events.iter().filter(move |e| e["event"] == name)
    }

    fn started(&self) -> Option<&Value> {
        self.named("watch_started").next()
    }

    fn t0(&self) -> Option<i64> {
        self.started().and_then(ts_ms)
    }

    /// Seconds after watch_started, for details: `+4.2 s`.
    fn at(&self, e: &Value) -> String {
        match (ts_ms(e), self.t0()) {
            (Some(t), Some(t0)) => format!("+{:.1} s", (t - t0) as f64 / 1000.0),
            _ => "+? s".into(),
        }
    }

    /// The pids watch_started selected (the lab child for `--lab`).
    fn pids(&self) -> BTreeSet<i64> {
        self.started()
            .and_then(|s| s["pids"].as_array())
            .map_or_else(BTreeSet::new, |a| a.iter().filter_map(Value::as_i64).collect())
    }

    /// Attached socket programs (not the TC classifiers), and the missing
    /// ones with the first words of why.
    fn probe_path(&self) -> (String, Vec<String>) {
        let probes = self.started().and_then(|s| s["probes"].as_array().cloned()).unwrap_or_default();
        let mut on = Vec::new();
        let mut off = Vec::new();
        for p in &probes {
            let name = p["name"].as_str().unwrap_or("?");
            if name.starts_with("quic_") {
                continue;
            }
            if p["attached"] == true {
                on.push(name.to_owned());
            } else {
                off.push(format!("{name} ({})", short(p["note"].as_str().unwrap_or("no note"), 90)));
            }
        }
        (on.join("+"), off)
    }

    /// Event counts, the missing programs and the last error line: what a
    /// failure line says it saw.
    fn seen(&self) -> String {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for e in &self.events {
            *counts.entry(e["event"].as_str().unwrap_or("?")).or_default() += 1;
        }
        counts.remove("watch_started");
        let mut s = if counts.is_empty() {
            "no event".to_owned()
        } else {
            counts.iter().map(|(k, v)| format!("{v} {k}")).collect::<Vec<_>>().join(", ")
        };
        if self.started().is_none() {
            s.push_str("; no watch_started");
        }
        let (_, missing) = self.probe_path();
        if !missing.is_empty() {
            s.push_str(&format!("; not attached: {}", missing.join("; ")));
        }
        if let Some(err) =
            self.stderr.lines().rev().find(|l| !l.trim().is_empty() && !l.starts_with("watch_started after"))
        {
            s.push_str(&format!("; stderr: {}", short(err.trim(), 160)));
        }
        s
    }

    /// The first quic_starved of confidence likely or confirmed.
    fn starved(&self) -> Option<&Value> {
        self.named("quic_starved").find(|e| e["confidence"] == "likely" || e["confidence"] == "confirmed")
    }

    fn cookies<'a>(&self, events: impl Iterator<Item = &'a Value>) -> BTreeSet<u64> {
        events.filter_map(|e| e["cookie"].as_u64()).collect()
    }
}

fn short(s: &str, max: usize) -> String {
    if s.chars().count() <= max { s.to_owned() } else { format!("{}…", s.chars().take(max).collect::<String>()) }
}

/// `2026-12-06T15:24:48.702Z` → milliseconds since the epoch.
fn ts_ms(e: &Value) -> Option<i64> {
    parse_ts(e["ts"].as_str()?)
}

fn parse_ts(s: &str) -> Option<i64> {
    s.parse::<jiff::Timestamp>().ok().map(|t| t.as_millisecond())
}

fn tc_mode(doctor_json: Option<&str>) -> String {
    let Some(list) = doctor_json.and_then(|t| serde_json::from_str::<Value>(t).ok()) else { return "?".into() };
    let detail =
        list.as_array().and_then(|a| a.iter().find(|c| c["name"] == "TC attach")).and_then(|c| c["detail"].as_str());
    match detail {
        Some(d) if d.starts_with("TCX") => "TCX".into(),
        Some(d) if d.contains("clsact") => "clsact".into(),
        Some(d) => short(d, 40),
        None => "?".into(),
    }
}

fn version(r: &Reader) -> Check {
    let Some(rc) = r.rc("version") else { return r.not_run("version") };
    let out = r.read("version", "out").unwrap_or_default();
    let line = out.lines().next().unwrap_or("").trim().to_owned();
    if rc == 0 && line.starts_with("hystall ") {
        pass("version", line)
    } else {
        fail(
            "version",
            format!("exit {rc}: {} {}", line, short(r.read("version", "err").unwrap_or_default().trim(), 200)),
        )
    }
}

/// doctor and doctor --json run; the detail lists what doctor does not call ok.
fn doctor(r: &Reader, json: Option<&str>) -> Check {
    let (Some(rc), Some(rc_json)) = (r.rc("doctor"), r.rc("doctor-json")) else { return r.not_run("doctor") };
    let parsed = json.and_then(|t| serde_json::from_str::<Value>(t).ok());
    let Some(list) = parsed.as_ref().and_then(Value::as_array) else {
        let err = r.read("doctor-json", "err").unwrap_or_default();
        return fail("doctor", format!("doctor --json exit {rc_json}, not a JSON list: {}", short(err.trim(), 200)));
    };
    let ok = list.iter().filter(|c| c["status"] == "ok").count();
    let not_ok: Vec<String> = list
        .iter()
        .filter(|c| c["status"] != "ok" && c["name"] != "QUIC servers")
        .map(|c| {
            let status = c["status"].as_str().unwrap_or("?").to_uppercase();
            format!(
                "{status} {} ({})",
                c["name"].as_str().unwrap_or("?"),
                short(c["detail"].as_str().unwrap_or(""), 70)
            )
        })
        .collect();
    let detail = format!(
        "{ok}/{} ok{}",
        list.len(),
        if not_ok.is_empty() { String::new() } else { format!("; {}", not_ok.join("; ")) }
    );
    if rc == 0 && rc_json == 0 {
        pass("doctor", detail)
    } else {
        fail("doctor", format!("exit {rc}/{rc_json}: {detail}"))
    }
}

/// The lab's 4 stalled targets flagged, and its connection starved (likely or
/// confirmed) naming them; the latency for the table.
fn lab_stall(r: &Reader, w: Option<&Watch>, fig: &mut Figures) -> Check {
    let Some(w) = w else { return r.not_run("stall") };
    let pids = w.pids();
    let lab: Vec<&Value> =
        w.named("socket_stalled").filter(|e| e["pid"].as_i64().is_some_and(|p| pids.contains(&p))).collect();
    let cookies = w.cookies(lab.iter().copied());
    let starved = w.starved();
    let named: BTreeSet<u64> = starved
        .and_then(|s| s["stalled"].as_array())
        .map_or_else(BTreeSet::new, |a| a.iter().filter_map(Value::as_u64).collect());
    let onset = lab.iter().filter_map(|e| Some(ts_ms(e)? - e["no_progress_ms"].as_i64()?)).min();
    if let Some(s) = starved.and_then(ts_ms) {
        fig.onset_to_starved_ms = onset.map(|o| s - o);
        fig.start_to_starved_ms = w.t0().map(|t0| s - t0);
    }
    let ok = cookies.len() >= 4 && !named.is_empty() && named.is_subset(&cookies);
    let first_stall = lab.first().map_or(String::new(), |e| format!(" (first {})", w.at(e)));
    match (ok, starved) {
        (true, Some(s)) => pass(
            "stall",
            format!(
                "{} socket_stalled{first_stall}, quic_starved {} naming {}/{} {}; stall onset → quic_starved {}",
                cookies.len(),
                s["confidence"].as_str().unwrap_or("?"),
                named.len(),
                cookies.len(),
                w.at(s),
                fig.onset_to_starved_ms.map_or("?".into(), |ms| format!("{:.1} s", ms as f64 / 1000.0))
            ),
        ),
        (_, Some(s)) => fail(
            "stall",
            format!(
                "{} lab socket_stalled{first_stall}; quic_starved {} names {named:?}, not all the lab's stalled targets; seen: {}",
                cookies.len(),
                s["confidence"],
                w.seen()
            ),
        ),
        (_, None) => {
            fail("stall", format!("{} lab socket_stalled, no likely quic_starved; seen: {}", cookies.len(), w.seen()))
        }
    }
}

/// A lab whose targets read (fast, slow): nothing flagged, the connection seen.
fn lab_quiet(r: &Reader, name: &'static str) -> Check {
    let Some(w) = r.watch(name) else { return r.not_run(name) };
    let stalled = w.named("socket_stalled").count();
    let starved = w.named("quic_starved").count();
    let opened = w.named("quic_conn_opened").count();
    if w.started().is_some() && stalled == 0 && starved == 0 && opened > 0 {
        pass(name, format!("no socket_stalled, no quic_starved ({opened} quic_conn_opened)"))
    } else if opened == 0 && stalled == 0 && starved == 0 {
        fail(name, format!("the lab's connection was never seen (no quic_conn_opened); seen: {}", w.seen()))
    } else {
        fail(name, format!("{stalled} socket_stalled, {starved} quic_starved on a lab that reads; seen: {}", w.seen()))
    }
}

/// `lab tcp`: 2 non-blocking and 2 blocking writers, each flagged.
fn tcp(r: &Reader) -> Check {
    let Some(w) = r.watch("tcp") else { return r.not_run("tcp") };
    let lab = r.read("tcp", "lab").unwrap_or_default();
    let Some(ready) =
        lab.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).find(|e| e["event"] == "lab_ready")
    else {
        return fail("tcp", format!("lab tcp never got ready: {}; watch saw: {}", short(lab.trim(), 200), w.seen()));
    };
    let writers = ready["writers"].as_array().cloned().unwrap_or_default();
    let mut flagged = [0usize; 2]; // [non-blocking, blocking]
    let mut total = [0usize; 2];
    let mut first: Option<String> = None;
    for wr in &writers {
        let kind = usize::from(wr["blocking"] == true);
        total[kind] += 1;
        let hit = w.named("socket_stalled").find(|e| e["local"] == wr["local"]);
        if let Some(e) = hit {
            flagged[kind] += 1;
            first.get_or_insert_with(|| w.at(e));
        }
    }
    let detail = format!(
        "non-blocking {}/{} and blocking {}/{} writers flagged STALLED{}",
        flagged[0],
        total[0],
        flagged[1],
        total[1],
        first.map_or(String::new(), |t| format!(" (first {t})"))
    );
    if total == [2, 2] && flagged == total {
        pass("tcp", detail)
    } else {
        fail("tcp", format!("{detail}; seen: {}", w.seen()))
    }
}

/// `--enforce` on the stall lab (its own process): its stalled targets
/// destroyed, then a new stream through its QUIC connection works again (the
/// lab's own probes, as hystall/tests/enforce_e2e.rs checks it).
fn enforce(r: &Reader) -> Check {
    let Some(w) = r.watch("enforce") else { return r.not_run("enforce") };
    let stalled = w.cookies(w.named("socket_stalled"));
    let enforced: Vec<&Value> = w.named("enforced").collect();
    let done = |e: &&Value| {
        e["action"] == "destroy"
            && e["result"].as_str().is_some_and(|r| r == "destroyed" || r.starts_with("shut down"))
            && e["cookie"].as_u64().is_some_and(|c| stalled.contains(&c))
    };
    let ok = enforced.iter().filter(|e| done(e)).count();
    let lab = r.read("enforce", "lab").unwrap_or_default();
    // checks.sh marks how many lab lines there were when it saw the third
    // target destroyed: probes after that line ran after the enforcement (a
    // loaded TCG guest fails probes now and then before any stall).
    let mark: Option<usize> = r.read("enforce", "mark").and_then(|m| m.trim().parse().ok());
    let probes = |lines: &mut dyn Iterator<Item = &str>| -> Vec<(f64, bool)> {
        lines
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["event"] == "lab_probe")
            .map(|e| (e["t"].as_f64().unwrap_or(f64::NAN), e["stream_ok"] == true))
            .collect()
    };
    let before = probes(&mut lab.lines().take(mark.unwrap_or(usize::MAX)));
    let after = mark.map_or_else(Vec::new, |m| probes(&mut lab.lines().skip(m)));
    let failed_before = before.iter().filter(|(_, ok)| !ok).count();
    let back = after.iter().find(|(_, ok)| *ok);
    let first = enforced.first().map_or_else(|| "—".to_owned(), |e| w.at(e));
    let recovered = w.named("quic_recovered").count();
    match back {
        Some((t, _)) if ok >= 3 => pass(
            "enforce",
            format!(
                "{ok} stalled targets destroyed (first {first}); a new stream through the lab's connection works \
                 again at its t={t:.1} s ({failed_before} of {} probes failed before); {recovered} quic_recovered",
                before.len()
            ),
        ),
        _ => {
            let results: BTreeSet<String> =
                enforced.iter().map(|e| format!("{} {}", e["action"], e["result"])).collect();
            fail(
                "enforce",
                format!(
                    "{ok} destroyed of {} enforced ({}); lab probes after that: {} ({} ok); seen: {}",
                    enforced.len(),
                    results.into_iter().collect::<Vec<_>>().join(", "),
                    after.len(),
                    after.iter().filter(|(_, ok)| *ok).count(),
                    w.seen()
                ),
            )
        }
    }
}

/// A real Hysteria2 server (sing-box) whose 4 uploads go into a target that
/// never reads: the server's targets flagged and the client's connection starved.
fn singbox(r: &Reader) -> Check {
    let Some(w) = r.watch("singbox") else { return r.not_run("singbox") };
    let driver = r.read("singbox", "driver").unwrap_or_default();
    let steps: Vec<Value> = driver.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    if !steps.iter().any(|s| s["event"] == "singbox_ready") {
        let why = if driver.trim().is_empty() { r.read("singbox", "err").unwrap_or_default() } else { driver };
        return fail("singbox", format!("sing-box never carried the uploads: {}", short(why.trim(), 300)));
    }
    let stalled = w.cookies(w.named("socket_stalled").filter(|e| e["comm"] == "sing-box"));
    let starved = w.starved().filter(|s| s["comm"] == "sing-box");
    match starved {
        Some(s) if stalled.len() >= 3 => pass(
            "singbox",
            format!(
                "{} sing-box targets socket_stalled, quic_starved {} {} ({} stalled named)",
                stalled.len(),
                s["confidence"].as_str().unwrap_or("?"),
                w.at(s),
                s["stalled"].as_array().map_or(0, Vec::len)
            ),
        ),
        _ => fail(
            "singbox",
            format!("{} sing-box socket_stalled, starved: {}; seen: {}", stalled.len(), starved.is_some(), w.seen()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_milliseconds_since_the_epoch() {
        assert_eq!(parse_ts("1970-01-01T00:00:00.000Z"), Some(0));
        assert_eq!(parse_ts("2026-12-06T15:24:48.702Z"), Some(1_796_570_688_702));
        assert_eq!(parse_ts("2000-03-01T00:00:01.5Z"), Some(951_868_801_500));
        assert_eq!(parse_ts("garbage"), None);
    }

    fn ev(ts: &str, event: &str, extra: &str) -> String {
        format!(r#"{{"v":1,"ts":"2026-12-06T15:00:{ts}Z","event":"{event}"{extra}}}"#)
    }

    fn write(dir: &Path, name: &str, rc: i32, lines: &[String]) {
        std::fs::write(dir.join(format!("c-{name}.out")), lines.join("\n") + "\n").unwrap();
        std::fs::write(dir.join(format!("c-{name}.rc")), format!("{rc}\n")).unwrap();
        std::fs::write(dir.join(format!("c-{name}.err")), "").unwrap();
    }

    #[test]
    fn the_stall_lab_passes_with_its_four_targets_named_and_fails_saying_what_was_missing() {
        let dir = std::env::temp_dir().join(format!("xtask-vm-judge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let probes = r#","pids":[7],"probes":[{"name":"sock_send_length","attached":false,"note":"unknown BTF type"},{"name":"tcp_probe","attached":true},{"name":"quic_ingress@lo","attached":true}]"#;
        let mut lines = vec![ev("00.000", "watch_started", probes)];
        for c in 1..=4 {
            lines.push(ev("08.000", "socket_stalled", &format!(r#","pid":7,"cookie":{c},"no_progress_ms":3000"#)));
        }
        lines.push(ev("09.500", "quic_starved", r#","confidence":"likely","stalled":[1,2,3,4]"#));
        write(&dir, "stall", 0, &lines);
        let (checks, fig) = judge(&dir, None);
        let stall = checks.iter().find(|c| c.name == "stall").unwrap();
        assert!(stall.pass, "{}", stall.detail);
        assert_eq!((fig.onset_to_starved_ms, fig.start_to_starved_ms), (Some(4500), Some(9500)));
        assert_eq!(fig.probes, "tcp_probe");
        assert!(fig.missing[0].starts_with("sock_send_length (unknown BTF type"), "{:?}", fig.missing);
        // Checks that left nothing say why; a broken guest is named.
        let version = checks.iter().find(|c| c.name == "version").unwrap();
        assert!(!version.pass && version.detail.starts_with("not run"), "{}", version.detail);

        write(&dir, "stall", 0, &lines[..1]);
        let (checks, _) = judge(&dir, Some("the guest never reached stage 2"));
        let stall = checks.iter().find(|c| c.name == "stall").unwrap();
        assert!(!stall.pass);
        assert!(
            stall.detail.contains("0 lab socket_stalled") && stall.detail.contains("not attached: sock_send_length"),
            "{}",
            stall.detail
        );
        let fast = checks.iter().find(|c| c.name == "fast").unwrap();
        assert_eq!(fast.detail, "not run: the guest never reached stage 2");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
