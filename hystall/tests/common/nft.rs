//! nftables rules for tests (port hopping: a DNAT of a UDP port range).

use std::process::Command;

/// Removes the test's nft table when dropped.
pub struct NftTable(&'static str);

impl NftTable {
    /// DNAT of a UDP port range to one port, for locally generated packets (the
    /// client and server share loopback, so the `output` hook is where it applies).
    pub fn dnat(name: &'static str, range: &str, to: u16) -> anyhow::Result<NftTable> {
        let _ = Command::new("nft").args(["delete", "table", "ip", name]).output();
        let script = format!(
            "table ip {name} {{\n chain out {{\n  type nat hook output priority -100;\n  ip daddr 127.0.0.1 udp dport {range} dnat to 127.0.0.1:{to}\n }}\n}}\n"
        );
        let out =
            Command::new("nft").args(["-f", "-"]).stdin(std::process::Stdio::piped()).spawn().and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().expect("stdin").write_all(script.as_bytes())?;
                c.wait_with_output()
            })?;
        anyhow::ensure!(out.status.success(), "nft failed: {}", String::from_utf8_lossy(&out.stderr));
        Ok(NftTable(name))
    }
}

impl Drop for NftTable {
    fn drop(&mut self) {
        let _ = Command::new("nft").args(["delete", "table", "ip", self.0]).status();
    }
}
