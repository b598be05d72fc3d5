//! Reading hystall's Prometheus endpoint (`--metrics`): shared by the root
//! tests and, through `#[path]`, the node-scale benchmark.

use std::collections::HashMap;

/// Every sample of a scrape of `127.0.0.1:port`, by series as printed
/// (`name{labels}`); empty when the endpoint does not answer.
pub fn scrape(port: u16) -> HashMap<String, f64> {
    let Ok(mut res) = ureq::get(&format!("http://127.0.0.1:{port}/metrics")).call() else { return HashMap::new() };
    let body = res.body_mut().read_to_string().unwrap_or_default();
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            Some((series.to_owned(), v.parse().ok()?))
        })
        .collect()
}
