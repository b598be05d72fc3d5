//! `hystall pcap --svg FILE`: the timeline as a picture. Per QUIC connection
//! two strips (client→server above, server→client below) of bytes per time
//! bucket, stream data (decrypted, or full-size packets without keys) in one
//! colour and everything else in another, and the moment stream data stopped
//! marked in red. Plain SVG, written by hand: a few rectangles and lines.

use std::fmt::Write as _;

use super::report::{ConnReport, Report};

const W: f64 = 1000.0;
const LEFT: f64 = 70.0;
const STRIP: f64 = 70.0;
const GAP: f64 = 60.0;
const STREAM: &str = "#2b6cb0";
const OTHER: &str = "#a0aec0";
const STALL: &str = "#e53e3e";

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

pub fn render(r: &Report) -> String {
    let conns: Vec<&ConnReport> = r.conns.iter().collect();
    let h = 50.0 + conns.len().max(1) as f64 * (2.0 * STRIP + GAP) + 30.0;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let dur = r.end.since(r.start).as_secs_f64().max(r.bucket_secs);
    let _ = writeln!(o, r#"<text x="10" y="20" font-size="14" font-weight="bold">{}</text>"#, esc(&r.file));
    let _ = writeln!(
        o,
        r#"<text x="10" y="38"><tspan fill="{STREAM}">■ stream data</tspan>  <tspan fill="{OTHER}">■ other packets (ACK, DATAGRAM, control)</tspan>  <tspan fill="{STALL}">| client stream data stopped (starved)</tspan></text>"#
    );
    if conns.is_empty() {
        let _ = writeln!(o, r#"<text x="10" y="70">no QUIC connection in this capture</text>"#);
    }
    let x_of = |t: f64| LEFT + (t / dur) * (W - LEFT - 20.0);
    for (i, c) in conns.iter().enumerate() {
        let top = 50.0 + i as f64 * (2.0 * STRIP + GAP);
        let verdict = c
            .verdict
            .as_ref()
            .map(|v| format!(" — STARVED ({}) from +{:.2}s", v.confidence, v.since.since(r.start).as_secs_f64()))
            .unwrap_or_else(|| " — not starved".into());
        let _ = writeln!(
            o,
            r#"<text x="10" y="{}" font-weight="bold">connection {} {} → {}{}</text>"#,
            top + 12.0,
            c.conn,
            esc(&c.client),
            esc(&c.server),
            esc(&verdict)
        );
        for dir in 0..2 {
            let y0 = top + 20.0 + dir as f64 * STRIP;
            let label = if dir == 0 { "up" } else { "down" };
            let _ = writeln!(o, r#"<text x="10" y="{}">{label}</text>"#, y0 + STRIP / 2.0);
            let _ = writeln!(
                o,
                r##"<rect x="{LEFT}" y="{y0}" width="{}" height="{}" fill="none" stroke="#e2e8f0"/>"##,
                W - LEFT - 20.0,
                STRIP - 4.0
            );
            let max = c.series.iter().map(|(b, _)| total(c, b, dir)).max().unwrap_or(0).max(1) as f64;
            let bw = ((W - LEFT - 20.0) * r.bucket_secs / dur).max(0.5);
            for (b, _) in c.series.iter() {
                let (stream, other) = split(c, b, dir);
                if stream + other == 0 {
                    continue;
                }
                let x = x_of(b as f64 * r.bucket_secs);
                let hs = (stream as f64 / max) * (STRIP - 6.0);
                let ho = (other as f64 / max) * (STRIP - 6.0);
                let base = y0 + STRIP - 4.0;
                if hs > 0.0 {
                    let _ = writeln!(
                        o,
                        r#"<rect x="{x:.1}" y="{:.1}" width="{bw:.1}" height="{hs:.1}" fill="{STREAM}"/>"#,
                        base - hs
                    );
                }
                if ho > 0.0 {
                    let _ = writeln!(
                        o,
                        r#"<rect x="{x:.1}" y="{:.1}" width="{bw:.1}" height="{:.1}" fill="{OTHER}"/>"#,
                        base - hs - ho.max(1.0),
                        ho.max(1.0)
                    );
                }
            }
        }
        if let Some(v) = &c.verdict {
            let x = x_of(v.since.since(r.start).as_secs_f64());
            let end = v.recovered.as_ref().map_or(W - 20.0, |(t, _)| x_of(t.since(r.start).as_secs_f64()));
            let (y0, y1) = (top + 20.0, top + 20.0 + 2.0 * STRIP - 4.0);
            let _ = writeln!(
                o,
                r#"<rect x="{x:.1}" y="{y0}" width="{:.1}" height="{}" fill="{STALL}" fill-opacity="0.08"/>"#,
                (end - x).max(0.0),
                y1 - y0
            );
            let _ =
                writeln!(o, r#"<line x1="{x:.1}" y1="{y0}" x2="{x:.1}" y2="{y1}" stroke="{STALL}" stroke-width="2"/>"#);
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{}" fill="{STALL}">stream data stopped +{:.2}s</text>"#,
                x + 4.0,
                y0 + 12.0,
                v.since.since(r.start).as_secs_f64()
            );
        }
        // Time axis.
        let y = top + 20.0 + 2.0 * STRIP + 12.0;
        let step = nice_step(dur);
        let mut t = 0.0;
        while t <= dur + 1e-9 {
            let _ =
                writeln!(o, r##"<text x="{:.1}" y="{y}" text-anchor="middle" fill="#4a5568">{t:.0}s</text>"##, x_of(t));
            t += step;
        }
    }
    o.push_str("</svg>\n");
    o
}

/// (stream, other) bytes of bucket `b` in direction `dir`.
fn split(c: &ConnReport, b: usize, dir: usize) -> (u64, u64) {
    let s = c.series.get(b).map(u64::from);
    let all = s[dir * 2] + s[dir * 2 + 1];
    match &c.stream_series {
        Some(ss) => {
            let stream = u64::from(ss.get(b)[dir]).min(all);
            (stream, all - stream)
        }
        None => (s[dir * 2], s[dir * 2 + 1]),
    }
}

fn total(c: &ConnReport, b: usize, dir: usize) -> u64 {
    let (a, b) = split(c, b, dir);
    a + b
}

fn nice_step(dur: f64) -> f64 {
    [1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0]
        .into_iter()
        .find(|s| dur / s <= 12.0)
        .unwrap_or(7200.0)
}
