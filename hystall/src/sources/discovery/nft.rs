//! Port-hopping ranges from the firewall: nftables DNAT and redirect rules
//! that send a range of UDP ports to one port (Hysteria's port hopping is
//! configured this way on servers). Read with `nft -j list ruleset`.
//!
//! Matches of `udp dport` (or `th dport`, which nft shows as udp) against a
//! port, a range, or an anonymous set of those, followed by `dnat` or
//! `redirect` to one port. Named sets (`@name`) and iptables-legacy rules are
//! not read.

use std::process::Command;

use serde_json::Value;

/// UDP ports `lo..=hi` sent to port `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Redirect {
    pub lo: u16,
    pub hi: u16,
    pub to: u16,
}

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("nft is not installed")]
    NotInstalled,
    #[error("nft -j list ruleset failed: {0}")]
    Failed(String),
    #[error("nft printed JSON that is not a ruleset: {0}")]
    Json(String),
}

/// The redirects of the running ruleset.
pub fn read() -> Result<Vec<Redirect>, NftError> {
    let out = Command::new("nft").args(["-j", "list", "ruleset"]).output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound { NftError::NotInstalled } else { NftError::Failed(e.to_string()) }
    })?;
    if !out.status.success() {
        return Err(NftError::Failed(String::from_utf8_lossy(&out.stderr).trim().to_owned()));
    }
    parse(&String::from_utf8_lossy(&out.stdout))
}

/// The redirects in `nft -j` output.
pub fn parse(json: &str) -> Result<Vec<Redirect>, NftError> {
    let v: Value = serde_json::from_str(json).map_err(|e| NftError::Json(e.to_string()))?;
    let items = v["nftables"].as_array().ok_or_else(|| NftError::Json("no \"nftables\" array".into()))?;
    let mut out = Vec::new();
    for rule in items.iter().filter_map(|i| i.get("rule")) {
        let Some(exprs) = rule["expr"].as_array() else { continue };
        let mut ranges = Vec::new();
        let mut to = None;
        for e in exprs {
            if let Some(m) = e.get("match")
                && is_udp_dport(&m["left"])
                && matches!(m["op"].as_str(), Some("==" | "in"))
            {
                ports(&m["right"], &mut ranges);
            }
            for stmt in ["dnat", "redirect"] {
                if let Some(p) = e.get(stmt).and_then(|s| s["port"].as_u64()).and_then(|p| u16::try_from(p).ok()) {
                    to = Some(p);
                }
            }
        }
        if let Some(to) = to {
            out.extend(ranges.into_iter().filter(|&(lo, hi)| !(lo == to && hi == to)).map(|(lo, hi)| Redirect {
                lo,
                hi,
                to,
            }));
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

fn is_udp_dport(left: &Value) -> bool {
    let p = &left["payload"];
    matches!(p["protocol"].as_str(), Some("udp" | "th")) && p["field"] == "dport"
}

/// A port, `{"range": [lo, hi]}`, or `{"set": [...]}` of those.
fn ports(v: &Value, out: &mut Vec<(u16, u16)>) {
    let port = |v: &Value| v.as_u64().and_then(|p| u16::try_from(p).ok());
    if let Some(p) = port(v) {
        out.push((p, p));
    } else if let Some([lo, hi]) = v.get("range").and_then(Value::as_array).map(Vec::as_slice)
        && let (Some(lo), Some(hi)) = (port(lo), port(hi))
    {
        out.push((lo.min(hi), lo.max(hi)));
    } else if let Some(set) = v.get("set").and_then(Value::as_array) {
        for item in set {
            ports(item, out);
        }
    }
}

#[cfg(test)]
mod tests;
