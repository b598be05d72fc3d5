//! The live source: kernel probes + sock_diag + /proc, turned into observations.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use aya::maps::{MapData, RingBuf};
use hystall_common::{
    AF_INET, AF_INET6, FlowSample, MARK_FLOW, Mark, SOCK_HAS_TUPLE, SOCK_OUTBOUND, SockEvent, SockEventKind, SockStats,
    Tuple,
};
use netlink_packet_sock_diag::inet::StateFlags;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::discovery::server_ports::ServerPorts;
use super::discovery::udp_rescan::UdpRescan;
use super::kernel::flow_map::FlowMap;
use super::kernel::probes::tc::Iface;
use super::kernel::probes::upkeep::MapFill;
use super::kernel::probes::{ProbeConfig, ProbeError, Probes};
use super::kernel::quic;
use super::processes::blocking::BlockingWriters;
use super::processes::procs::{self, Mode};
use super::processes::seed;
use super::processes::sockdiag::SockDiag;
use crate::core::event::{ProbeStatus, QuicPortsInfo};
use crate::core::flows::FlowId;
use crate::core::observation::{ByteMark, InflightSample, Observation, SendCount, SockChange, SockSample};
use crate::core::time::Mono;

/// A send syscall in flight this long is worth resolving to its socket.
const INFLIGHT_AFTER: Duration = Duration::from_millis(300);
/// How often the process selection is re-read (new processes of a --comm;
/// those the kernel reports starting are taken at once: `follow_execs`).
const RESCAN_EVERY: Duration = Duration::from_secs(1);
/// How long after a selected process started its UDP sockets are dumped at
/// every tick (`UdpRescan::hurry`): the ports its config does not name, and
/// those it does for as long as they wait for it to bind them.
const STARTED_HURRY: Duration = super::discovery::server_ports::STARTING_GRACE;
/// Execs looked at per drain of the events ring (a build farm's burst is
/// cut; the next second's rescan finds what it hid).
const MAX_EXECS: usize = 256;
/// How often the flow map is read (it can hold tens of thousands of flows):
/// the flows named as moved since the last read (`probes::moved`), and the
/// whole map every `WHOLE_FLOWS_EVERY` (the LRU map drops quiet flows
/// without a packet to name them), on the first read and after names were
/// lost to a full ring.
const FLOWS_EVERY: Duration = Duration::from_millis(500);
const WHOLE_FLOWS_EVERY: Duration = Duration::from_secs(10);
/// Flows of ports that are not (or not yet) QUIC server ports are deleted
/// from the kernel map after this long without a packet: nothing reads them,
/// and a busy proxy's own client sockets would otherwise fill the map. (A
/// candidate promoted later counts a flow again from its next packet.)
const CANDIDATE_FLOW_IDLE: Duration = Duration::from_secs(10);
/// How often the firewall's port-hopping rules are re-read (`nft -j list
/// ruleset`: not every rescan, rulesets can be large).
const NFT_EVERY: Duration = Duration::from_secs(5);
/// How often the kernel maps are counted and the socket map's keys compared
/// with the user-side table (a walk of up to 131 072 keys: not every tick).
pub const UPKEEP_EVERY: Duration = Duration::from_secs(10);

/// What to watch on the QUIC side.
#[derive(Clone, Debug, Default)]
pub struct QuicOptions {
    /// Ports given on the command line (besides the discovered ones).
    pub ports: HashSet<u16>,
    /// Interfaces given on the command line (empty: every interface that is up).
    pub ifaces: Vec<String>,
}

pub struct Live {
    probes: Probes,
    events: AsyncFd<RingBuf<MapData>>,
    marks: AsyncFd<RingBuf<MapData>>,
    samples: Option<AsyncFd<RingBuf<MapData>>>,
    quic: QuicOptions,
    /// Which UDP ports are QUIC server ports (explicit, fixed, or shown by a
    /// client's Initial), and the candidates.
    servers: ServerPorts,
    /// Ports marked in the kernel now (servers and candidates).
    ports: HashSet<u16>,
    /// Discovered server ports → the process serving on them.
    owners: HashMap<u16, u32>,
    last_flows: Mono,
    /// When the firewall's rules were last read (ZERO: never).
    last_nft: Mono,
    /// QUIC ports each watched process's config names (read once per process).
    configs: HashMap<u32, super::discovery::proxy_config::Served>,
    /// The watched processes whose configs say they answer each request (as last sent).
    answering: Vec<u32>,
    diag: Option<SockDiag>,
    pub mode: Mode,
    pub pids: HashSet<u32>,
    last_scan: Mono,
    /// Socket inode → cookie, from the last sock_diag dump.
    inodes: HashMap<u32, u64>,
    last_dump: Mono,
    /// Cookies already seeded (never twice).
    seeded: HashSet<u64>,
    /// When the UDP sockets are dumped (`udp_rescan.rs`), and the unconnected
    /// sockets' inodes at the last dump (only those are worth a walk of the fds).
    udp_rescan: UdpRescan,
    udp_inodes: Option<HashSet<u32>>,
    /// Observations made outside `poll` (start-up), handed out by the next poll.
    pending: Vec<Observation>,
    procs: procs::ProcCache,
    /// The kernel's flow map as last read: keys (to delete closed flows) and
    /// what moved since.
    flow_keys: FlowMap,
    /// Flows the kernel's LRU map dropped to make room (gone between two
    /// reads without our deleting them): the map is too small for the node.
    flows_evicted: u64,
    /// The names of the flows that moved (taken with the samples' ring).
    moved: Option<super::kernel::probes::moved::Moved>,
    /// The last whole read of the flow map (ZERO: none yet).
    last_whole: Mono,
    /// Names lost to a full ring, and the server ports, as of the last whole
    /// read (a port that became a server's has quiet flows to read too).
    moved_lost: u64,
    whole_servers: usize,
    /// Socket inodes → the watched process holding them (fds read only for
    /// new sockets; one walk serves the UDP candidates and the start-up
    /// blocking TCP check).
    fd_owners: super::processes::fd_owners::FdOwners,
    /// The watched processes that hold blocking TCP sockets (their threads
    /// are read for writers parked inside a send).
    blocking: BlockingWriters,
    /// Whether it held none at the last look (the first one re-seeds).
    blocking_was_empty: bool,
    parked: super::processes::parked::ParkedWriters,
    send_calls: Option<hystall_common::SendSyscalls>,
    last_upkeep: Mono,
    /// Kernel map occupancy as of the last upkeep.
    pub map_fill: Vec<MapFill>,
    /// Entries in the flow map at its last whole read (for `map_fill`).
    flows_counted: Option<u64>,
    /// Send bytes of each target socket at its last read (only changes are
    /// reported).
    sends: HashMap<u64, u64>,
    /// `--decrypt`: secrets from the servers, frames of suspect connections.
    decrypt: Option<super::decrypt::LiveDecrypt>,
    /// Set when what `--decrypt` probes changed (for `decrypt_changed`).
    decrypt_changed: bool,
    /// Processes the kernel saw exec since the last look: (pid, new name).
    execs: Vec<(u32, String)>,
}

impl Live {
    pub fn start(
        mode: Mode,
        quic: QuicOptions,
        decrypt: Option<&super::decrypt::DecryptOptions>,
        now: Mono,
    ) -> Result<Live, ProbeError> {
        let mut probes = Probes::load(&ProbeConfig { filter_pids: mode.filters(), decrypt: decrypt.is_some() })?;
        let pids = mode.resolve();
        probes.set_pids(&pids)?;
        // Only the execs the selection can take wake us (`follow_execs`).
        if let Some((comms, exec_pids)) = mode.exec_selection()
            && let Err(e) = probes.filter_execs(&comms, &exec_pids)
        {
            tracing::info!("exec filter: {e}; every exec is looked at");
        }
        let mut decrypt = match decrypt {
            Some(opts) => Some(super::decrypt::LiveDecrypt::start(&mut probes, opts)?),
            None => None,
        };
        // Only selected processes (or the detected proxies) are probed.
        if let Some(d) = decrypt.as_mut()
            && mode.filters()
        {
            d.sync(&mut probes, &pids);
        }
        let ring = probes.take_events()?;
        // SAFETY: the fd belongs to the RingBuf, which the AsyncFd owns; it stays
        // open for as long as it is registered. Must run inside a tokio runtime.
        let events = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| ProbeError::Map("EVENTS", e.to_string()))?;
        let ring = probes.take_marks()?;
        // SAFETY: as above.
        let marks = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| ProbeError::Map("MARKS", e.to_string()))?;
        let diag = SockDiag::open().ok();
        let servers = ServerPorts::new(quic.ports.clone(), quic::ephemeral_range(), mode.filters());
        let mut live = Live {
            probes,
            events,
            marks,
            samples: None,
            quic,
            servers,
            ports: HashSet::new(),
            owners: HashMap::new(),
            last_flows: Mono::ZERO,
            moved: None,
            last_whole: Mono::ZERO,
            moved_lost: 0,
            whole_servers: 0,
            last_nft: Mono::ZERO,
            configs: HashMap::new(),
            answering: Vec::new(),
            diag,
            mode,
            pids,
            last_scan: now,
            inodes: HashMap::new(),
            last_dump: Mono::ZERO,
            seeded: HashSet::new(),
            // A little under the rescan period: a due dump runs at the rescan.
            udp_rescan: UdpRescan::new(RESCAN_EVERY.saturating_sub(Duration::from_millis(100))),
            udp_inodes: None,
            pending: Vec::new(),
            procs: Default::default(),
            flow_keys: Default::default(),
            flows_evicted: 0,
            fd_owners: Default::default(),
            blocking: BlockingWriters::default(),
            blocking_was_empty: true,
            parked: Default::default(),
            send_calls: super::kernel::probes::syscalls::send_syscalls(),
            last_upkeep: Mono::ZERO,
            map_fill: Vec::new(),
            flows_counted: None,
            sends: HashMap::new(),
            decrypt,
            decrypt_changed: false,
            execs: Vec::new(),
        };
        live.refresh_ports()?;
        // What is found at the start goes in `watch_started`, not in a change.
        live.servers.take_change();
        live.blocking_writers(now);
        Ok(live)
    }

    /// Which watched processes hold blocking TCP sockets (only their writers
    /// can park inside a send, and only their threads are read for it): the
    /// kernel flags the sockets it tracks (`BlockingWriters`); the sockets
    /// from before are looked for once per selection. When the first appears,
    /// looks again for sockets that got stuck before (a writer parked since
    /// before we attached).
    fn blocking_writers(&mut self, now: Mono) {
        // With no selection: the kernel's flags are all there is (nothing was
        // tracked before the start).
        if self.mode.filters() && self.blocking.scan_due(&self.pids) {
            let found = match self.diag.as_mut() {
                Some(d) => seed::has_blocking_tcp(d, &self.pids, &mut self.fd_owners),
                None => HashSet::new(),
            };
            self.blocking.scanned(&self.pids, found);
        }
        let was_empty = std::mem::replace(&mut self.blocking_was_empty, self.blocking.is_empty());
        if was_empty && !self.blocking.is_empty() {
            self.seeded.clear();
            let mut out = Vec::new();
            self.seed(now, &mut out);
            self.pending.extend(out);
        }
    }

    /// Re-reads the watched processes' UDP sockets (new candidates, servers
    /// gone), then marks the kernel's ports; attaches the QUIC classifier the
    /// first time there is a port to watch.
    fn refresh_ports(&mut self) -> Result<(), ProbeError> {
        if self.mode.filters()
            && self.udp_rescan.due(&self.pids)
            && let Some(diag) = self.diag.as_mut()
        {
            let (pids, owners, previous) = (&self.pids, &mut self.fd_owners, &mut self.udp_inodes);
            let socks = self.udp_rescan.run(pids, || quic::unconnected_udp(diag, pids, owners, previous));
            // Configs are read once per process (a restart is a new pid).
            self.configs.retain(|pid, _| self.pids.contains(pid));
            for &pid in &self.pids {
                self.configs.entry(pid).or_insert_with(|| super::discovery::proxy_config::served_by(pid));
            }
            self.servers.set_configured(self.configs.values().flat_map(|s| s.ports.iter().cloned()).collect());
            self.servers.update(&socks);
        }
        // Which of them answer each request, by their configs.
        let mut answering: Vec<u32> = self.configs.iter().filter(|(_, s)| s.answers).map(|(p, _)| *p).collect();
        answering.sort_unstable();
        if answering != self.answering {
            self.answering = answering.clone();
            self.pending.push(Observation::Answering { at: crate::core::time::mono_now(), pids: answering });
        }
        // Port-hopping ranges point at server ports: none to read before one exists.
        let now = crate::core::time::mono_now();
        if self.servers.counts().0 > 0 && (self.last_nft == Mono::ZERO || now.since(self.last_nft) >= NFT_EVERY) {
            self.last_nft = now;
            match super::discovery::nft::read() {
                Ok(r) => self.servers.set_redirects(r),
                Err(super::discovery::nft::NftError::NotInstalled) => {}
                Err(e) => tracing::debug!("port-hopping rules not read: {e}"),
            }
        }
        let mut owners = self.servers.owners();
        // Ports named on the command line belong to the one selected process,
        // when there is exactly one.
        if self.pids.len() == 1 {
            let pid = *self.pids.iter().next().expect("one");
            for p in &self.quic.ports {
                owners.entry(*p).or_insert(pid);
            }
        }
        if owners != self.owners {
            self.pending.push(Observation::Owners {
                at: crate::core::time::mono_now(),
                ports: owners.iter().map(|(p, o)| (*p, *o)).collect(),
            });
            self.owners = owners;
        }
        let ports = self.servers.kernel_ports();
        if ports == self.ports {
            return Ok(());
        }
        if self.samples.is_none() && !ports.is_empty() {
            let ifaces: Vec<Iface> = if self.quic.ifaces.is_empty() {
                Iface::all_up()
            } else {
                self.quic
                    .ifaces
                    .iter()
                    .map(|n| Iface::by_name(n).ok_or_else(|| ProbeError::Load(format!("no interface named {n}"))))
                    .collect::<Result<_, _>>()?
            };
            self.probes.attach_quic(&ifaces, &ports)?;
            let ring = self.probes.take_samples()?;
            // SAFETY: as for the events ring buffer.
            let fd = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
                .map_err(|e| ProbeError::Map("FLOW_SAMPLES", e.to_string()))?;
            self.samples = Some(fd);
            self.moved = Some(self.probes.take_moved()?);
        } else {
            self.probes.set_ports(&ports)?;
        }
        self.ports = ports;
        Ok(())
    }

    /// Finds sockets of the selected processes that were stuck before we
    /// attached (see `seed`), tracks them in the kernel, and reports them.
    pub fn seed(&mut self, now: Mono, out: &mut Vec<Observation>) {
        let Some(diag) = self.diag.as_mut() else { return };
        let filter = self.mode.filters().then_some(&self.pids);
        for stuck in seed::find_stuck(diag, filter, now) {
            let cookie = stuck.diag.cookie;
            if !self.seeded.insert(cookie) || self.probes.track(cookie, &stuck.stats).is_err() {
                continue;
            }
            // Already tracked (it sent while we watched) but never refused a
            // send: a blocking writer parked before the syscall probes attached.
            let _ = self.probes.mark_blocked(cookie, now.0);
            let sample =
                self.probes.sock(cookie).map_or_else(|| to_sample(cookie, &stuck.stats), |st| to_sample(cookie, &st));
            out.push(Observation::Sock { at: now, change: SockChange::Poll, sample });
            out.push(Observation::Diag { at: now, sample: stuck.diag });
        }
    }

    /// The QUIC server ports now, the candidates, and the note when none is
    /// watched; `reason` says what changed.
    pub fn quic_ports(&self, reason: &str) -> QuicPortsInfo {
        self.servers.info(reason.to_owned())
    }

    /// (QUIC server ports, candidate ports) now.
    pub fn quic_port_counts(&self) -> (usize, usize) {
        self.servers.counts()
    }

    /// What changed in the QUIC server ports since the last call.
    pub fn take_ports_change(&mut self) -> Option<QuicPortsInfo> {
        let why = self.servers.take_change()?;
        Some(self.servers.info(why))
    }

    pub fn probe_status(&self) -> &[ProbeStatus] {
        &self.probes.status
    }

    /// How blocked writers of non-blocking sockets are seen here.
    pub fn send_path_info(&self) -> crate::core::event::SendPathInfo {
        super::kernel::probes::send_path::info(self.probes.send_path)
    }

    /// Run time and run count of each loaded program (for metrics).
    pub fn prog_stats(&self) -> Vec<super::kernel::probes::stats::ProgStats> {
        self.probes.prog_stats()
    }

    /// One read of the flow map: the flows named as moved, or the whole map
    /// (see `FLOWS_EVERY`). Candidates' flows (and those of ports no longer
    /// watched) never reach the model; the idle ones go from the kernel map
    /// at the whole reads.
    fn read_flows(&mut self, now: Mono) -> super::kernel::flow_map::Read {
        let lost = self.probes.counter(hystall_common::counter::MOVED_LOST);
        let names = match self.moved.as_mut().map(|m| m.next_epoch(&mut self.probes)) {
            Some(Ok(names)) => Some(names),
            Some(Err(e)) => {
                tracing::debug!("moved flows: {e}");
                None
            }
            None => None,
        };
        let servers_now = self.servers.counts().0;
        let whole = self.last_whole == Mono::ZERO
            || now.since(self.last_whole) >= WHOLE_FLOWS_EVERY
            || lost != self.moved_lost
            || servers_now != self.whole_servers;
        let servers = &self.servers;
        match names {
            Some(names) if !whole => {
                let looked = self.probes.lookup_flows(names.into_iter().filter(|k| servers.is_server(k.server_port)));
                self.flow_keys.read_moved(looked.found, &looked.missing)
            }
            _ => {
                self.last_whole = now;
                self.moved_lost = lost;
                self.whole_servers = servers_now;
                let mut idle = Vec::new();
                let mut whole = self.flow_keys.whole();
                let mut n = 0;
                self.probes.each_flow(|k, st| {
                    n += 1;
                    if servers.is_server(k.server_port) {
                        whole.entry(k, &st);
                    } else if now.since(Mono(super::kernel::flow_map::last_packet(&st))) >= CANDIDATE_FLOW_IDLE {
                        idle.push(k);
                    }
                });
                let read = whole.end();
                self.flows_counted = Some(n);
                // The gauge follows each whole read, not only the next
                // upkeep: both come every 10 s, and an upkeep just ahead of
                // a whole read would show a count 10-20 s old (the soak
                // test once saw the start-up count, 15, at 20 s).
                if let Some(f) = self.map_fill.iter_mut().find(|f| f.map == "flows") {
                    f.entries = n.min(f.capacity);
                }
                for k in &idle {
                    self.probes.forget_flow(k);
                }
                read
            }
        }
    }

    pub fn counters(&self) -> [u64; hystall_common::counter::LEN as usize] {
        self.probes.counters()
    }

    /// `--decrypt`: what is probed and read (None without it).
    pub fn decrypt_info(&self) -> Option<super::decrypt::DecryptInfo> {
        let mut info = self.decrypt.as_ref()?.info();
        if !self.mode.filters() && info.processes.is_empty() {
            info.note = Some(
                "--decrypt probes only selected processes (--pid, --comm, --cgroup, --unit) or the detected proxies"
                    .into(),
            );
        }
        Some(info)
    }

    /// What `--decrypt` probes, when that changed since the last call.
    pub fn take_decrypt_change(&mut self) -> Option<super::decrypt::DecryptInfo> {
        if !std::mem::take(&mut self.decrypt_changed) {
            return None;
        }
        self.decrypt_info()
    }

    /// `--decrypt`: passes the packets of exactly these connections.
    pub fn select_suspects(&mut self, suspects: &[crate::core::suspects::Suspect]) {
        if let Some(d) = self.decrypt.as_mut() {
            d.select(&mut self.probes, suspects, &self.flow_keys);
        }
    }

    pub fn decrypting(&self) -> bool {
        self.decrypt.is_some()
    }

    /// Flows the kernel's flow map evicted (LRU, full) since the start.
    pub fn flows_evicted(&self) -> u64 {
        self.flows_evicted
    }

    /// Waits until a ring buffer has data, then moves it into `out`.
    pub async fn recv(&mut self, out: &mut Vec<Observation>) -> std::io::Result<()> {
        let first = out.len();
        let (events, marks, samples_fd, servers) =
            (&mut self.events, &mut self.marks, &mut self.samples, &mut self.servers);
        let samples = async {
            match samples_fd.as_mut() {
                Some(s) => s.readable_mut().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = events.readable_mut() => {
                let mut g = r?;
                drain_events(g.get_inner_mut(), &mut self.blocking, &mut self.execs, out);
                g.clear_ready();
            }
            r = marks.readable_mut() => {
                let mut g = r?;
                drain_marks(g.get_inner_mut(), servers, out);
                g.clear_ready();
            }
            r = samples => {
                let mut g = r?;
                drain_samples(g.get_inner_mut(), servers, out);
                g.clear_ready();
            }
        }
        for o in &mut out[first..] {
            if let Observation::Sock { at, sample, .. } = o {
                self.describe(*at, sample);
            }
        }
        self.follow_execs();
        out.append(&mut self.pending);
        Ok(())
    }

    /// Moves whatever the rings hold into `out` without waiting: the kernel
    /// wakes `recv` only once a ring holds a batch, so each tick drains the
    /// rest (a quiet ring's records wait at most a tick).
    pub fn drain(&mut self, out: &mut Vec<Observation>) {
        if let Some(d) = self.decrypt.as_mut() {
            d.drain(crate::core::time::mono_now(), out);
        }
        let first = out.len();
        drain_events(self.events.get_mut(), &mut self.blocking, &mut self.execs, out);
        drain_marks(self.marks.get_mut(), &self.servers, out);
        if let Some(s) = self.samples.as_mut() {
            drain_samples(s.get_mut(), &mut self.servers, out);
        }
        for o in &mut out[first..] {
            if let Observation::Sock { at, sample, .. } = o {
                self.describe(*at, sample);
            }
        }
        self.follow_execs();
    }

    /// Fills in what the kernel sample lacks: the process name and, for a
    /// socket whose connect() we did not see, whether it was accepted.
    fn describe(&mut self, now: Mono, sample: &mut SockSample) {
        let diag = &mut self.diag;
        let (comm, ports) =
            self.procs.get(sample.pid, now, || diag.as_mut().map(seed::listening_ports).unwrap_or_default());
        if !comm.is_empty() && sample.comm != comm {
            // Into the kernel's name's buffer: one allocation an event, not two.
            sample.comm.clear();
            sample.comm.push_str(comm);
        }
        if !sample.outbound
            && let Some(local) = sample.local
        {
            sample.outbound = !ports.contains(&local.port());
        }
    }

    /// Periodic work: re-read the sockets the model wants, in-flight sends, the
    /// process selection; with each flow poll, the send counts of `targets`.
    pub fn poll(
        &mut self,
        now: Mono,
        wanted: &[(u64, Option<SocketAddr>, Option<SocketAddr>)],
        targets: &[u64],
        out: &mut Vec<Observation>,
    ) {
        out.append(&mut self.pending);
        if now.since(self.last_scan) >= RESCAN_EVERY {
            // Every mode: with no selection every process's sockets are seen,
            // and pids churn on a busy host.
            self.procs.expire(now);
        }
        if now.since(self.last_scan) >= RESCAN_EVERY && self.mode.filters() {
            self.last_scan = now;
            let pids = self.mode.resolve();
            self.select(now, pids, out);
            if let Err(e) = self.refresh_ports() {
                tracing::warn!("QUIC probe: {e}");
            }
        } else if self.udp_rescan.hurrying() {
            // A selected process started: its sockets are looked for at every tick.
            if let Err(e) = self.refresh_ports() {
                tracing::warn!("QUIC probe: {e}");
            }
        }
        self.blocking_writers(now);
        if self.samples.is_some() && now.since(self.last_flows) >= FLOWS_EVERY {
            self.last_flows = now;
            let read = self.read_flows(now);
            tracing::debug!(
                whole = self.last_whole == now,
                flows = self.flow_keys.len(),
                moved = read.moved.len(),
                evicted = read.gone.len(),
                "flow map read"
            );
            self.flows_evicted += read.gone.len() as u64;
            // The header samples written since this tick's drain go first: a
            // flow that began in between (a port hop's new path) must meet
            // its first sample, which ties it to its connection by the DCID,
            // before its counts, which alone would open a new connection.
            if let Some(s) = self.samples.as_mut() {
                drain_samples(s.get_mut(), &mut self.servers, out);
            }
            out.push(Observation::FlowMoves { at: now, flows: read.moved });
            if !read.gone.is_empty() {
                out.push(Observation::FlowsForgotten { at: now, flows: read.gone });
            }
            self.read_sends(now, targets, out);
        }
        for &(cookie, local, remote) in wanted {
            if let Some(st) = self.probes.sock(cookie) {
                let mut sample = to_sample(cookie, &st);
                self.describe(now, &mut sample);
                out.push(Observation::Sock { at: now, change: SockChange::Poll, sample });
            }
            if let (Some(l), Some(r), Some(diag)) = (local, remote, self.diag.as_mut())
                && let Ok(Some(d)) = diag.query(cookie, l, r)
            {
                out.push(Observation::Diag { at: now, sample: d });
            }
        }
        let sends = self.inflight(now);
        out.push(Observation::Inflight { at: now, sends });
    }

    /// Watches `pids` from now on (the kernel's filter, `--decrypt`'s
    /// probes); the sockets of processes new to it that were stuck before
    /// are reported.
    fn select(&mut self, now: Mono, pids: HashSet<u32>, out: &mut Vec<Observation>) {
        if pids == self.pids {
            return;
        }
        let _ = self.probes.set_pids(&pids);
        let added = pids.difference(&self.pids).count() > 0;
        if let Some(d) = self.decrypt.as_mut() {
            self.decrypt_changed |= d.sync(&mut self.probes, &pids);
        }
        self.pids = pids;
        if added {
            self.seed(now, out);
        }
    }

    /// The processes the kernel saw exec (`proc_exec.rs`): one the selection
    /// takes is watched now, not at the next rescan — its sockets tracked
    /// from their connect, the QUIC ports its config names counted from its
    /// first client's first packet (a proxy restarted under load has clients
    /// back within milliseconds), and its UDP sockets looked for at every
    /// tick for a while (a port its config does not name).
    fn follow_execs(&mut self) {
        if self.execs.is_empty() {
            return;
        }
        let execs = std::mem::take(&mut self.execs);
        if !self.mode.filters() {
            return;
        }
        let started: Vec<u32> =
            execs.into_iter().filter(|(pid, comm)| self.mode.selects(*pid, comm)).map(|(pid, _)| pid).collect();
        if started.is_empty() {
            return;
        }
        let now = crate::core::time::mono_now();
        // It is among them: by its name, its cgroup or its explicit pid.
        let pids = self.mode.resolve();
        for &pid in &started {
            // Its config now (a pid that exec'd runs another program).
            let served = super::discovery::proxy_config::served_by(pid);
            self.servers.started(pid, &served.ports, |p| std::path::Path::new(&format!("/proc/{p}")).exists());
            self.configs.insert(pid, served);
        }
        let mut out = Vec::new();
        self.select(now, pids, &mut out);
        self.pending.extend(out);
        self.udp_rescan.hurry(STARTED_HURRY);
        if let Err(e) = self.refresh_ports() {
            tracing::warn!("QUIC probe: {e}");
        }
        tracing::debug!(?started, ports = ?self.ports, "selected processes started");
    }

    /// The send counts of the target sockets that moved since the last read,
    /// taken at the same instant as the flow counters.
    fn read_sends(&mut self, now: Mono, targets: &[u64], out: &mut Vec<Observation>) {
        let mut sends = Vec::new();
        let mut seen = HashMap::with_capacity(targets.len());
        for &cookie in targets {
            let Some(st) = self.probes.sock(cookie) else { continue };
            seen.insert(cookie, st.send_bytes);
            if self.sends.get(&cookie) != Some(&st.send_bytes) {
                sends.push(SendCount { cookie, bytes: st.send_bytes, last_send: Mono::nonzero(st.last_send_ns) });
            }
        }
        self.sends = seen;
        if !sends.is_empty() {
            out.push(Observation::Sends { at: now, sends });
        }
    }

    /// Every [`UPKEEP_EVERY`]: counts the kernel maps (`map_fill`) and returns
    /// the cookies the socket map holds, for the socket table to forget the
    /// sockets whose destroy event was lost. None between upkeeps.
    pub fn upkeep(&mut self, now: Mono) -> Option<HashSet<u64>> {
        if now.since(self.last_upkeep) < UPKEEP_EVERY && self.last_upkeep != Mono::ZERO {
            return None;
        }
        self.last_upkeep = now;
        self.map_fill = self.probes.map_fill(self.flows_counted);
        let cookies = self.probes.sock_cookies()?;
        // Seeded once means never again, but only while the kernel knows it.
        self.seeded.retain(|c| cookies.contains(c));
        self.blocking.retain(&cookies);
        Some(cookies)
    }

    /// Deletes the kernel entries of flows whose connection closed; returns
    /// the flows no longer in the map (deleted now, or dropped by the kernel
    /// before: their last read did not have them), whose figures the model
    /// need not remember.
    pub fn forget_flows(&mut self, flows: &[FlowId]) -> Vec<FlowId> {
        if let Some(d) = self.decrypt.as_mut() {
            d.closed(flows);
        }
        let probes = &mut self.probes;
        let keys = &mut self.flow_keys;
        flows.iter().filter(|f| keys.remove(f).is_none_or(|k| probes.forget_flow(&k))).copied().collect()
    }

    fn inflight(&mut self, now: Mono) -> Vec<InflightSample> {
        let mut out = Vec::new();
        let mut unresolved = false;
        let Some(calls) = self.send_calls else { return out };
        if self.blocking.is_empty() {
            return out;
        }
        for w in self.parked.read(&self.blocking.pids(), &calls, now) {
            if now.since(w.since) < INFLIGHT_AFTER {
                continue;
            }
            let cookie = procs::fd_socket_inode(w.pid, w.fd).and_then(|ino| {
                let c = self.inodes.get(&ino).copied();
                unresolved |= c.is_none();
                c
            });
            out.push(InflightSample { pid: w.pid, tid: w.tid, fd: w.fd, since: w.since, cookie });
        }
        // Blocked writers are few and long-lived: refresh the inode map at most
        // once a second, and only when one of them is not resolved yet.
        if unresolved && now.since(self.last_dump) >= Duration::from_secs(1) {
            self.last_dump = now;
            if let Some(diag) = self.diag.as_mut()
                && let Ok(all) = diag.dump_tcp(StateFlags::all())
            {
                self.inodes = all.iter().map(|d| (d.inode, d.cookie)).collect();
                for s in &mut out {
                    if s.cookie.is_none() {
                        s.cookie = procs::fd_socket_inode(s.pid, s.fd).and_then(|i| self.inodes.get(&i).copied());
                    }
                }
            }
        }
        out
    }
}

fn drain_events(
    ring: &mut RingBuf<MapData>,
    blocking: &mut BlockingWriters,
    execs: &mut Vec<(u32, String)>,
    out: &mut Vec<Observation>,
) {
    while let Some(item) = ring.next() {
        if item.len() >= std::mem::size_of::<SockEvent>() {
            // SAFETY: the kernel wrote a SockEvent (repr(C), Pod) of this size.
            let ev: SockEvent = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const SockEvent) };
            match ev.kind() {
                Some(SockEventKind::Blocking) => blocking.tracked(ev.cookie, ev.stats.tgid),
                Some(SockEventKind::Destroyed) => blocking.destroyed(ev.cookie),
                Some(SockEventKind::Exec) => {
                    // Bounded: a burst of execs is looked at once per drain.
                    if execs.len() < MAX_EXECS {
                        execs.push((ev.stats.tgid, procs::comm_str(&ev.stats.comm)));
                    }
                    continue;
                }
                _ => {}
            }
            out.extend(event_to_obs(&ev));
        }
    }
}

/// Header samples; those of candidate ports wait in `servers` until the port
/// is shown to be a QUIC server (then they all go to the model) or not.
fn drain_samples(ring: &mut RingBuf<MapData>, servers: &mut ServerPorts, out: &mut Vec<Observation>) {
    let mut handed = Vec::new();
    while let Some(item) = ring.next() {
        if item.len() >= std::mem::size_of::<FlowSample>() {
            // SAFETY: the kernel wrote a FlowSample (repr(C), Pod) of this size.
            let s: FlowSample = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const FlowSample) };
            servers.take_sample(s, quic::flow_id(&s.key), &mut handed);
            for s in handed.drain(..) {
                out.push(Observation::Header { at: Mono(s.ts_ns), sample: quic::header_sample(&s) });
            }
        }
    }
}

/// Byte marks; those of flows on ports not (yet) shown to serve QUIC are
/// dropped, as their flows are.
fn drain_marks(ring: &mut RingBuf<MapData>, servers: &ServerPorts, out: &mut Vec<Observation>) {
    let mut marks = Vec::new();
    while let Some(item) = ring.next() {
        if item.len() >= std::mem::size_of::<Mark>() {
            // SAFETY: the kernel wrote a Mark (repr(C), Pod) of this size.
            let m: Mark = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const Mark) };
            if m.kind == MARK_FLOW && !servers.is_server(m.flow.server_port) {
                continue;
            }
            let at = Mono(m.ts_ns);
            marks.push(match m.kind {
                MARK_FLOW => ByteMark::Flow { flow: quic::flow_id(&m.flow), cpu: m.cpu, at, bytes: m.bytes },
                _ => ByteMark::Send { cookie: m.cookie, at, bytes: m.bytes },
            });
        }
    }
    if let Some(at) = marks.iter().map(ByteMark::at).max() {
        out.push(Observation::Marks { at, marks });
    }
}

fn event_to_obs(ev: &SockEvent) -> Option<Observation> {
    let change = match ev.kind()? {
        SockEventKind::Blocked => SockChange::Blocked,
        SockEventKind::Unblocked => SockChange::Unblocked,
        SockEventKind::State => SockChange::State { old: (ev.arg >> 8) as u8, new: ev.arg as u8 },
        SockEventKind::Destroyed => SockChange::Destroyed,
        SockEventKind::Window => SockChange::Window,
        // Only the source's business (`BlockingWriters`, `follow_execs`).
        SockEventKind::Blocking | SockEventKind::Exec => return None,
    };
    Some(Observation::Sock { at: Mono(ev.ts_ns), change, sample: to_sample(ev.cookie, &ev.stats) })
}

pub fn to_sample(cookie: u64, st: &SockStats) -> SockSample {
    let (local, remote) = if st.flags & SOCK_HAS_TUPLE != 0 { tuple_addrs(&st.tuple) } else { (None, None) };
    SockSample {
        cookie,
        pid: st.tgid,
        comm: procs::comm_str(&st.comm),
        local,
        remote,
        outbound: st.flags & SOCK_OUTBOUND != 0,
        state: st.state as u8,
        send_calls: st.send_calls,
        send_bytes: st.send_bytes,
        send_eagain: st.send_eagain,
        send_errors: st.send_errors,
        short_sends: st.short_sends,
        last_send: Mono::nonzero(st.last_send_ns),
        blocked_since: Mono::nonzero(st.blocked_since_ns),
        last_ack: Mono::nonzero(st.last_ack_ns),
        acked_bytes: st.acked_bytes,
        acks: st.acks,
        peer_window: st.snd_wnd,
        first_seen: Mono::nonzero(st.first_seen_ns),
    }
}

fn tuple_addrs(t: &Tuple) -> (Option<SocketAddr>, Option<SocketAddr>) {
    let ip = |a: &[u8; 16]| -> Option<IpAddr> {
        match t.family {
            AF_INET => Some(IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))),
            AF_INET6 => {
                let v6 = Ipv6Addr::from(*a);
                Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
            }
            _ => None,
        }
    };
    let local = ip(&t.saddr).filter(|_| t.sport != 0).map(|i| SocketAddr::new(i, t.sport));
    let remote = ip(&t.daddr).filter(|_| t.dport != 0).map(|i| SocketAddr::new(i, t.dport));
    (local, remote)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuples_become_addresses_and_v4_mapped_is_shown_as_v4() {
        let mut t = Tuple { family: AF_INET, sport: 40000, dport: 443, ..Default::default() };
        t.saddr[..4].copy_from_slice(&[127, 0, 0, 1]);
        t.daddr[..4].copy_from_slice(&[10, 1, 2, 3]);
        let (l, r) = tuple_addrs(&t);
        assert_eq!(l.unwrap().to_string(), "127.0.0.1:40000");
        assert_eq!(r.unwrap().to_string(), "10.1.2.3:443");

        let mut t6 = Tuple { family: AF_INET6, sport: 1, dport: 2, ..Default::default() };
        t6.saddr = Ipv4Addr::new(127, 0, 0, 1).to_ipv6_mapped().octets();
        t6.daddr = Ipv6Addr::LOCALHOST.octets();
        let (l, r) = tuple_addrs(&t6);
        assert_eq!(l.unwrap().to_string(), "127.0.0.1:1");
        assert_eq!(r.unwrap().to_string(), "[::1]:2");
    }

    #[test]
    fn unknown_family_and_zero_ports_give_no_address() {
        let t = Tuple::default();
        assert_eq!(tuple_addrs(&t), (None, None));
    }
}
