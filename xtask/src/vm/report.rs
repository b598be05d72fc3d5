//! What the matrix prints: one line per check per kernel as it finishes,
//! then a verdict table and the probe path / latency table in markdown (to
//! paste into docs/ARCHITECTURE.md).

use super::Kernel;
use super::checks::{self, Check, Figures};

pub struct Row {
    pub kernel: Kernel,
    /// `uname -r` of the kernel run (empty when it never got that far).
    pub release: String,
    pub checks: Vec<Check>,
    pub figures: Figures,
    /// Wall time of the whole kernel: fetch, boot, checks.
    pub secs: f64,
}

impl Row {
    pub fn new(kernel: Kernel) -> Row {
        Row { kernel, release: String::new(), checks: Vec::new(), figures: Figures::default(), secs: 0.0 }
    }
}

/// `vm 6.1    FAIL stall    0 lab socket_stalled, ...`
fn line(row: &Row, c: &Check) -> String {
    let verdict = if c.pass { "PASS" } else { "FAIL" };
    format!("vm {:<6} {verdict} {:<8} {}", row.kernel.label(), c.name, c.detail)
}

pub fn failure_lines(row: &Row) -> Vec<String> {
    row.checks.iter().filter(|c| !c.pass).map(|c| line(row, c)).collect()
}

pub fn print_row(row: &Row) {
    for c in &row.checks {
        println!("{}", line(row, c));
    }
    let failed = row.checks.iter().filter(|c| !c.pass).count();
    println!(
        "vm {:<6} {} ({}): {} of {} checks passed in {:.0} s",
        row.kernel.label(),
        if failed == 0 { "ok" } else { "FAILED" },
        if row.release.is_empty() { "?" } else { &row.release },
        row.checks.len() - failed,
        row.checks.len(),
        row.secs
    );
}

fn secs(ms: Option<i64>) -> String {
    ms.map_or_else(|| "—".to_owned(), |ms| format!("{:.1} s", ms as f64 / 1000.0))
}

pub fn print_tables(rows: &[Row], total_secs: u64) {
    println!();
    println!("Kernel matrix ({total_secs} s):");
    println!();
    let mut head = "| check |".to_owned();
    let mut rule = "|---|".to_owned();
    for r in rows {
        head.push_str(&format!(" {} |", r.kernel.label()));
        rule.push_str("---|");
    }
    println!("{head}\n{rule}");
    for name in checks::NAMES {
        let mut line = format!("| {name} |");
        for r in rows {
            let cell = match r.checks.iter().find(|c| c.name == name) {
                Some(c) if c.pass => "PASS",
                Some(_) => "FAIL",
                None => "—",
            };
            line.push_str(&format!(" {cell} |"));
        }
        println!("{line}");
    }
    println!();
    println!(
        "| kernel | release | socket probes attached | not attached | TC | stall onset → quic_starved | watch start → quic_starved | run |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in rows {
        let f = &r.figures;
        let missing: Vec<&str> = f.missing.iter().map(|m| m.split(" (").next().unwrap_or(m)).collect();
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.0} s |",
            r.kernel.label(),
            if r.release.is_empty() { "?" } else { &r.release },
            if f.probes.is_empty() { "?" } else { &f.probes },
            if missing.is_empty() { "—".to_owned() } else { missing.join(", ") },
            if f.tc.is_empty() { "?" } else { &f.tc },
            secs(f.onset_to_starved_ms),
            secs(f.start_to_starved_ms),
            r.secs
        );
    }
    println!();
}
