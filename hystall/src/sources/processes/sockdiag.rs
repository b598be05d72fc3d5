//! NETLINK_SOCK_DIAG: what `ss -tni` shows, per TCP socket (queues, tcp_info),
//! and the socket inode and cookie that tie it to /proc and to the probes.

use std::net::{IpAddr, SocketAddr};

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, NetlinkBuffer, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, Parseable as _,
};
use netlink_packet_sock_diag::{
    SOCK_DIAG_BY_FAMILY, SockDiagDestroy, SockDiagMessage,
    constants::{AF_INET, AF_INET6, IPPROTO_TCP, IPPROTO_UDP},
    inet::{ExtensionFlags, InetRequest, InetResponse, InetResponseHeader, SocketId, StateFlags, nlas::Nla},
};
use netlink_sys::{Socket, SocketAddr as NlAddr, protocols::NETLINK_SOCK_DIAG};

use crate::core::observation::DiagSample;

#[derive(Debug, thiserror::Error)]
pub enum DiagError {
    #[error("sock_diag netlink socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("sock_diag answered with error {0}")]
    Kernel(i32),
    #[error("sock_diag message could not be decoded: {0}")]
    Decode(String),
}

pub struct SockDiag {
    sock: Socket,
    buf: Vec<u8>,
    seq: u32,
}

impl SockDiag {
    pub fn open() -> Result<SockDiag, DiagError> {
        let mut sock = Socket::new(NETLINK_SOCK_DIAG)?;
        sock.bind_auto()?;
        sock.connect(&NlAddr::new(0, 0))?;
        Ok(SockDiag { sock, buf: vec![0; 1 << 16], seq: 0 })
    }

    /// Every TCP socket (IPv4 and IPv6) in the given states, with tcp_info.
    pub fn dump_tcp(&mut self, states: StateFlags) -> Result<Vec<DiagSample>, DiagError> {
        let mut out = Vec::new();
        for (family, id) in [(AF_INET, SocketId::new_v4()), (AF_INET6, SocketId::new_v6())] {
            let req = InetRequest {
                family,
                protocol: IPPROTO_TCP,
                extensions: ExtensionFlags::INFO,
                states: states.clone(),
                socket_id: id,
            };
            self.request(req, NLM_F_REQUEST | NLM_F_DUMP, &mut out)?;
        }
        Ok(out)
    }

    /// Every unconnected UDP socket (IPv4 and IPv6): the kernel keeps only
    /// those (state TCP_CLOSE for UDP), and each one's header goes to `f`
    /// with no attribute parsed and nothing collected. A node's proxy can
    /// hold tens of thousands of UDP sockets, dumped every second or two.
    pub fn each_unconnected_udp(&mut self, mut f: impl FnMut(&InetResponseHeader)) -> Result<(), DiagError> {
        for (family, id) in [(AF_INET, SocketId::new_v4()), (AF_INET6, SocketId::new_v6())] {
            let req = InetRequest {
                family,
                protocol: IPPROTO_UDP,
                extensions: ExtensionFlags::empty(),
                states: StateFlags::CLOSE,
                socket_id: id,
            };
            self.send(SockDiagMessage::InetRequest(req), NLM_F_REQUEST | NLM_F_DUMP)?;
            self.each_header(&mut f)?;
        }
        Ok(())
    }

    /// The headers of a dump's answers, until its end.
    fn each_header(&mut self, f: &mut dyn FnMut(&InetResponseHeader)) -> Result<(), DiagError> {
        let bad = |e: netlink_packet_core::DecodeError| DiagError::Decode(e.to_string());
        loop {
            let n = self.sock.recv(&mut &mut self.buf[..], 0)?;
            let mut off = 0;
            while off < n {
                let msg = NetlinkBuffer::new_checked(&self.buf[off..n]).map_err(bad)?;
                let len = msg.length() as usize;
                match msg.message_type() {
                    SOCK_DIAG_BY_FAMILY => f(&InetResponseHeader::parse(msg.payload()).map_err(bad)?),
                    NLMSG_DONE => return Ok(()),
                    NLMSG_ERROR => {
                        let whole = <NetlinkMessage<SockDiagMessage>>::deserialize(&self.buf[off..n])
                            .map_err(|e| DiagError::Decode(e.to_string()))?;
                        if let NetlinkPayload::Error(e) = whole.payload
                            && let Some(code) = e.code
                        {
                            return Err(DiagError::Kernel(code.get()));
                        }
                        return Ok(());
                    }
                    _ => {}
                }
                if len == 0 {
                    break;
                }
                off += (len + 3) & !3;
            }
        }
    }

    /// One socket by its 4-tuple and cookie (what `ss` does for a single socket).
    pub fn query(
        &mut self,
        cookie: u64,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> Result<Option<DiagSample>, DiagError> {
        let req = exact_request(cookie, local, remote, ExtensionFlags::INFO);
        let mut out = Vec::new();
        match self.request(req, NLM_F_REQUEST, &mut out) {
            // ENOENT: the socket is gone.
            Err(DiagError::Kernel(e)) if e == -libc::ENOENT || e == libc::ENOENT => Ok(None),
            Err(e) => Err(e),
            Ok(()) => Ok(out.into_iter().find(|d| d.cookie == cookie)),
        }
    }

    fn request(&mut self, req: InetRequest, flags: u16, out: &mut Vec<DiagSample>) -> Result<(), DiagError> {
        self.send(SockDiagMessage::InetRequest(req), flags)?;
        self.collect(flags & NLM_F_DUMP != 0, out)
    }

    fn collect(&mut self, dump: bool, out: &mut Vec<DiagSample>) -> Result<(), DiagError> {
        loop {
            let n = self.sock.recv(&mut &mut self.buf[..], 0)?;
            let mut off = 0;
            while off < n {
                let msg = <NetlinkMessage<SockDiagMessage>>::deserialize(&self.buf[off..n])
                    .map_err(|e| DiagError::Decode(e.to_string()))?;
                let len = msg.header.length as usize;
                match msg.payload {
                    NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                        out.push(to_sample(&r));
                        if !dump {
                            return Ok(());
                        }
                    }
                    NetlinkPayload::Done(_) => return Ok(()),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(()),
                            Some(code) => Err(DiagError::Kernel(code.get())),
                        };
                    }
                    _ => {}
                }
                if len == 0 {
                    break;
                }
                off += (len + 3) & !3;
            }
        }
    }

    /// Destroys one socket (SOCK_DESTROY, as `ss -K` does), addressed by its
    /// 4-tuple and cookie so that exactly that socket is hit. The kernel needs
    /// CONFIG_INET_DIAG_DESTROY and CAP_NET_ADMIN.
    pub fn destroy(&mut self, cookie: u64, local: SocketAddr, remote: SocketAddr) -> Result<(), DiagError> {
        let req = exact_request(cookie, local, remote, ExtensionFlags::empty());
        self.send_msg(SockDiagDestroy::new(SockDiagMessage::InetRequest(req)), NLM_F_REQUEST | NLM_F_ACK)?;
        let mut none = Vec::new();
        // The answer is an ack (an error message with code 0) or an errno.
        self.collect(false, &mut none)
    }

    /// Sends a request.
    pub fn send(&mut self, msg: SockDiagMessage, flags: u16) -> Result<(), DiagError> {
        self.send_msg(msg, flags)
    }

    fn send_msg<T>(&mut self, msg: T, flags: u16) -> Result<(), DiagError>
    where
        T: netlink_packet_core::NetlinkSerializable + std::fmt::Debug,
    {
        self.seq = self.seq.wrapping_add(1);
        let mut hdr = NetlinkHeader::default();
        hdr.flags = flags;
        hdr.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(hdr, NetlinkPayload::InnerMessage(msg));
        packet.finalize();
        let mut buf = vec![0; packet.buffer_len()];
        packet.serialize(&mut buf[..]);
        self.sock.send(&buf, 0)?;
        Ok(())
    }
}

/// A request naming exactly one socket: 4-tuple plus cookie.
pub fn exact_request(cookie: u64, local: SocketAddr, remote: SocketAddr, ext: ExtensionFlags) -> InetRequest {
    let family = if local.is_ipv4() { AF_INET } else { AF_INET6 };
    let mut id = if local.is_ipv4() { SocketId::new_v4() } else { SocketId::new_v6() };
    id.source_port = local.port();
    id.destination_port = remote.port();
    id.source_address = local.ip();
    id.destination_address = remote.ip();
    id.cookie = cookie.to_ne_bytes();
    InetRequest { family, protocol: IPPROTO_TCP, extensions: ext, states: StateFlags::all(), socket_id: id }
}

fn unspecified_to_none(ip: IpAddr, port: u16) -> Option<SocketAddr> {
    (!(ip.is_unspecified() && port == 0)).then_some(SocketAddr::new(ip, port))
}

fn to_sample(r: &InetResponse) -> DiagSample {
    let h = &r.header;
    let id = &h.socket_id;
    let mut d = DiagSample {
        cookie: u64::from_ne_bytes(id.cookie),
        local: unspecified_to_none(id.source_address, id.source_port),
        remote: unspecified_to_none(id.destination_address, id.destination_port),
        state: h.state,
        inode: h.inode,
        send_q: h.send_queue,
        ..Default::default()
    };
    for nla in &r.nlas {
        if let Nla::TcpInfo(ti) = nla {
            d.notsent = ti.notsent_bytes;
            d.bytes_acked = ti.bytes_acked;
            d.backoff = ti.backoff;
            d.probes = ti.probes;
            d.snd_wnd = ti.snd_wnd;
            d.rwnd_limited_us = ti.rwnd_limited;
            d.busy_us = ti.busy_time;
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;

    use super::*;

    /// The dump finds the unconnected sockets of both families, and only those
    /// (one dump per family: the kernel has no inet_diag handler for AF_UNSPEC).
    #[test]
    fn the_udp_dump_holds_both_families_unconnected_sockets_and_no_connected_one() {
        let v4 = UdpSocket::bind("127.0.0.1:0").expect("bind v4");
        let v6 = UdpSocket::bind("[::1]:0").ok();
        let connected = UdpSocket::bind("127.0.0.1:0").expect("bind");
        connected.connect(v4.local_addr().unwrap()).expect("connect");
        let mut diag = SockDiag::open().expect("sock_diag");
        let mut found: Vec<(u8, u16)> = Vec::new();
        diag.each_unconnected_udp(|h| found.push((h.family, h.socket_id.source_port))).expect("dump");
        assert!(found.contains(&(AF_INET, v4.local_addr().unwrap().port())), "{found:?}");
        match &v6 {
            Some(s) => assert!(found.contains(&(AF_INET6, s.local_addr().unwrap().port())), "{found:?}"),
            None => println!("no IPv6 on lo: the IPv6 half not checked"),
        }
        assert!(!found.iter().any(|&(_, p)| p == connected.local_addr().unwrap().port()), "{found:?}");
    }
}
