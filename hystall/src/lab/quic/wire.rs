//! The lab's tiny proxy protocol (a simplified Hysteria2 TCP request).
//!
//! A bidirectional stream starts with a request: the target address as a u16
//! big-endian length and that many bytes of UTF-8 (`127.0.0.1:PORT`). The proxy
//! connects and answers with one status byte ([`STATUS_OK`] or
//! [`STATUS_CONNECT_FAILED`]), then copies both ways. A datagram is echoed as is;
//! the probe's datagram is [`PROBE_DATAGRAM_LEN`] bytes: a magic byte and a
//! sequence number.

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncReadExt};

pub const STATUS_OK: u8 = 0;
pub const STATUS_CONNECT_FAILED: u8 = 1;

/// Application error codes for RESET_STREAM / STOP_SENDING / CONNECTION_CLOSE.
pub const CODE_TARGET_GONE: u32 = 0x101;
pub const CODE_BAD_REQUEST: u32 = 0x102;
pub const CODE_PROBE_ABANDONED: u32 = 0x103;
pub const CODE_LAB_DONE: u32 = 0x100;

/// Longest address a request may carry (plenty for any "ip:port").
const MAX_ADDR_LEN: usize = 256;

pub fn encode_request(target: SocketAddr) -> Vec<u8> {
    let addr = target.to_string();
    let len = u16::try_from(addr.len()).expect("a socket address is short");
    let mut out = Vec::with_capacity(2 + addr.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(addr.as_bytes());
    out
}

/// Reads one request from the start of a stream.
pub async fn read_request<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<SocketAddr> {
    let mut len = [0u8; 2];
    r.read_exact(&mut len).await?;
    let len = usize::from(u16::from_be_bytes(len));
    if len == 0 || len > MAX_ADDR_LEN {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("request address of {len} bytes")));
    }
    let mut addr = vec![0u8; len];
    r.read_exact(&mut addr).await?;
    std::str::from_utf8(&addr)
        .ok()
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "request address is not ip:port"))
}

const PROBE_MAGIC: u8 = b'P';
pub const PROBE_DATAGRAM_LEN: usize = 16;

pub fn probe_datagram(seq: u64) -> [u8; PROBE_DATAGRAM_LEN] {
    let mut d = [0u8; PROBE_DATAGRAM_LEN];
    d[0] = PROBE_MAGIC;
    d[1..9].copy_from_slice(&seq.to_be_bytes());
    d
}

/// The sequence number of a probe datagram, if `d` is one.
pub fn parse_probe_datagram(d: &[u8]) -> Option<u64> {
    if d.len() != PROBE_DATAGRAM_LEN || d[0] != PROBE_MAGIC {
        return None;
    }
    Some(u64::from_be_bytes(d[1..9].try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn request_round_trip() {
        let addr: SocketAddr = "127.0.0.1:4567".parse().unwrap();
        let bytes = encode_request(addr);
        assert_eq!(&bytes[..2], &[0, 14]);
        let mut r: &[u8] = &bytes;
        assert_eq!(read_request(&mut r).await.unwrap(), addr);
        let v6: SocketAddr = "[::1]:80".parse().unwrap();
        assert_eq!(read_request(&mut &encode_request(v6)[..]).await.unwrap(), v6);
    }

    #[tokio::test]
    async fn bad_requests_are_rejected() {
        for bad in [&[0u8, 0][..], &[0, 3, b'a', b'b', b'c'], &[1, 0], &[0, 5, b'1']] {
            assert!(read_request(&mut &bad[..]).await.is_err(), "{bad:?}");
        }
    }

    #[test]
    fn probe_datagrams() {
        let d = probe_datagram(0x0102_0304_0506_0708);
        assert_eq!(parse_probe_datagram(&d), Some(0x0102_0304_0506_0708));
        assert_eq!(parse_probe_datagram(&d[..15]), None);
        let mut other = d;
        other[0] = b'X';
        assert_eq!(parse_probe_datagram(&other), None);
    }
}
