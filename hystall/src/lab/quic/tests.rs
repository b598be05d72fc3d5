//! The lab end to end (no root needed): it must reproduce the failure with stall
//! targets, and must not with one stalled upload or with targets that read.

use super::*;
use clap::Parser;

fn cfg(uploads: usize, target: Behaviour, secs: f64) -> QuicLabConfig {
    QuicLabConfig {
        uploads,
        target,
        duration: Some(Duration::from_secs_f64(secs)),
        probe_every: Duration::from_millis(500),
        probe_timeout: Duration::from_secs(2),
        ..QuicLabConfig::default()
    }
}

async fn collect(cfg: QuicLabConfig) -> Vec<LabEvent> {
    let mut events = Vec::new();
    run_lab(cfg, |ev| events.push(ev)).await.unwrap();
    events
}

fn probes(events: &[LabEvent]) -> Vec<&ProbeRound> {
    events.iter().filter_map(|e| if let LabEvent::LabProbe(p) = e { Some(p) } else { None }).collect()
}

fn done(events: &[LabEvent]) -> &Done {
    match events.last() {
        Some(LabEvent::LabDone(d)) => d,
        other => panic!("the last event is not lab_done: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_stalled_uploads_starve_new_streams_but_not_datagrams() {
    let events = collect(cfg(4, Behaviour::Stall, 8.0)).await;
    let LabEvent::LabReady(ready) = &events[0] else { panic!("{:?}", events[0]) };
    assert_eq!(ready.pid, std::process::id());
    assert_eq!((ready.uploads, ready.target), (4, Behaviour::Stall));
    assert_eq!((ready.stream_receive_window, ready.receive_window), (8 << 20, 20 << 20));
    let stall_sockets = events
        .iter()
        .filter(
            |e| matches!(e, LabEvent::LabTargetConnected(s) if s.target == "stall" && s.remote == ready.target_addr),
        )
        .count();
    assert_eq!(stall_sockets, 4);

    let rounds = probes(&events);
    assert!(rounds.len() >= 3, "{rounds:#?}");
    // Starvation sets in within a second or two on loopback; by the end it holds.
    for p in &rounds[rounds.len() - 2..] {
        assert!(!p.stream_ok, "a new stream still worked: {p:?}");
        assert_eq!(p.stream_error.as_deref(), Some("timeout"), "{p:?}");
        assert!(p.datagram_ok, "datagrams should still echo: {p:?}");
    }
    // The uploads are stuck: the last two rounds saw the same byte counts, and the
    // total is about the connection window plus what the kernel buffers hold.
    let (a, b) = (&rounds[rounds.len() - 2].uploaded, &rounds[rounds.len() - 1].uploaded);
    assert_eq!(a, b);
    let total: u64 = b.iter().sum();
    assert!((20 << 20..200 << 20).contains(&total), "{b:?}");
    let d = done(&events);
    assert_eq!(d.reason, "duration");
    assert_eq!(d.upload_restarts, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stalled_upload_pins_only_its_own_stream_window() {
    let stop = async {
        tokio::time::sleep(Duration::from_secs(4)).await;
        "stopped"
    };
    let mut events = Vec::new();
    let cfg = QuicLabConfig { duration: None, ..cfg(1, Behaviour::Stall, 0.0) };
    run_lab_until(cfg, stop, |ev| events.push(ev)).await.unwrap();
    let rounds = probes(&events);
    assert!(rounds.len() >= 4, "{rounds:#?}");
    assert!(rounds.iter().all(|p| p.stream_ok && p.datagram_ok), "{rounds:#?}");
    // Its own 8 MiB window and the kernel buffers, no more.
    let uploaded = rounds.last().unwrap().uploaded[0];
    assert!((8 << 20..64 << 20).contains(&uploaded), "{uploaded}");
    assert_eq!(done(&events).reason, "stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_fast_uploads_leave_new_streams_working() {
    let keylog = std::env::temp_dir().join(format!("hystall-lab-keylog-{}", std::process::id()));
    let _ = std::fs::remove_file(&keylog);
    let cfg = QuicLabConfig {
        probe_timeout: Duration::from_secs(3),
        keylog: Some(keylog.clone()),
        ..cfg(4, Behaviour::Fast, 4.0)
    };
    let events = collect(cfg).await;
    let rounds = probes(&events);
    // One round a second for 4 s; on a loaded 2-core machine (the other lib
    // tests run beside this one) the last may not fit.
    assert!(rounds.len() >= 3, "{rounds:#?}");
    assert!(rounds.iter().all(|p| p.stream_ok && p.datagram_ok), "{rounds:#?}");
    let d = done(&events);
    // Far past any window: the data really flows.
    assert!(d.uploaded.iter().all(|&b| b > 32 << 20), "{d:?}");
    assert_eq!(d.stream_ok, d.probes);

    let secrets = std::fs::read_to_string(&keylog).unwrap();
    std::fs::remove_file(&keylog).unwrap();
    for label in ["CLIENT_HANDSHAKE_TRAFFIC_SECRET", "SERVER_TRAFFIC_SECRET_0", "CLIENT_TRAFFIC_SECRET_0"] {
        assert!(secrets.lines().any(|l| l.starts_with(label) && l.split(' ').count() == 3), "{secrets}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_answers_a_refused_connect_with_a_status() {
    let identity = tls::Identity::generate().unwrap();
    let (tx, _rx) = mpsc::unbounded_channel();
    let listen = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let proxy = Proxy::start(listen, identity.server_crypto().unwrap(), transport(false), tx).unwrap();
    let client = Client::connect(proxy.addr(), identity.client_crypto(None).unwrap(), transport(true)).await.unwrap();
    // A port nothing listens on: bind one, note it, close it.
    let closed = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap().local_addr().unwrap();
    let (mut send, mut recv) = client.connection().open_bi().await.unwrap();
    send.write_all(&wire::encode_request(closed)).await.unwrap();
    send.finish().unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), recv.read_to_end(16)).await.unwrap().unwrap();
    assert_eq!(answer, [wire::STATUS_CONNECT_FAILED]);
    client.close().await;
}

#[test]
fn the_cli_runs_the_quic_lab_without_a_subcommand() {
    let parse = |args: &str| crate::cli::Cli::try_parse_from(args.split_whitespace());
    let crate::cli::Command::Lab(args) = parse("hystall lab").unwrap().command else { panic!() };
    assert!(args.kind.is_none());
    let c = config_from_args(&args).unwrap();
    assert_eq!((c.uploads, c.target, c.duration), (4, Behaviour::Stall, None));
    assert_eq!((c.probe_every, c.probe_timeout), (Duration::from_secs(1), Duration::from_secs(2)));
    assert_eq!(c.listen, "127.0.0.1:0".parse().unwrap());

    let cli = parse(
        "hystall lab --uploads 2 --target upclose --duration 1.5 --listen 127.0.0.1:4433 --keylog k \
         --probe-every 0.25 --json",
    )
    .unwrap();
    let crate::cli::Command::Lab(args) = cli.command else { panic!() };
    assert!(args.json);
    let c = config_from_args(&args).unwrap();
    assert_eq!((c.uploads, c.target), (2, Behaviour::Upclose));
    assert_eq!((c.duration, c.probe_every), (Some(Duration::from_millis(1500)), Duration::from_millis(250)));
    assert_eq!((c.listen.port(), c.keylog), (4433, Some(PathBuf::from("k"))));

    // `lab tcp` still works, and QUIC lab options do not mix with it.
    let crate::cli::Command::Lab(args) = parse("hystall lab tcp --stall 1").unwrap().command else { panic!() };
    assert!(matches!(args.kind, Some(crate::cli::LabKind::Tcp(_))));
    assert!(parse("hystall lab --uploads 2 tcp --stall 1").is_err());
    let bad = crate::cli::Cli::try_parse_from(["hystall", "lab", "--duration=-1"]).unwrap();
    let crate::cli::Command::Lab(args) = bad.command else { panic!() };
    assert!(config_from_args(&args).is_err());
}

#[test]
fn json_lines_have_the_documented_shape() {
    let round = ProbeRound {
        t: 3.0,
        stream_ok: false,
        stream_ms: 2000,
        stream_error: Some("timeout".into()),
        datagram_ok: true,
        datagram_ms: 1,
        uploaded: vec![1, 2],
    };
    let mut r = Render::new(true);
    assert_eq!(
        r.line(&LabEvent::LabProbe(round)).unwrap(),
        r#"{"event":"lab_probe","t":3.0,"stream_ok":false,"stream_ms":2000,"stream_error":"timeout","datagram_ok":true,"datagram_ms":1,"uploaded":[1,2]}"#
    );
    let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
    let sock = |stream, target| TargetSocket { t: 0.5, stream, target, local: a, remote: b, error: None };
    assert_eq!(
        r.line(&LabEvent::LabTargetConnected(sock(4, "stall"))).unwrap(),
        r#"{"event":"lab_target_connected","t":0.5,"stream":4,"target":"stall","local":"127.0.0.1:1","remote":"127.0.0.1:2"}"#
    );
    // The echo service's sockets (one per probe) are left out of the CLI's output.
    assert_eq!(r.line(&LabEvent::LabTargetConnected(sock(8, "echo"))), None);
}

#[test]
fn text_shows_the_first_uploads_target_sockets_only() {
    let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let sock = |stream| TargetSocket { t: 0.0, stream, target: "upclose", local: a, remote: a, error: None };
    let ready = Ready {
        pid: 1,
        server: a,
        client: a,
        target: Behaviour::Upclose,
        target_addr: a,
        echo_addr: a,
        uploads: 1,
        stream_receive_window: STREAM_RECEIVE_WINDOW,
        receive_window: CONNECTION_RECEIVE_WINDOW,
        probe_every: 1.0,
        probe_timeout: 2.0,
    };
    let mut r = Render::new(false);
    assert!(r.line(&LabEvent::LabReady(ready)).unwrap().contains("1 upload(s) into the upclose target"));
    assert!(r.line(&LabEvent::LabTargetConnected(sock(0))).is_some());
    assert!(r.line(&LabEvent::LabTargetClosed(sock(0))).is_some());
    assert!(r.line(&LabEvent::LabTargetConnected(sock(4))).is_none());
    assert!(r.line(&LabEvent::LabTargetClosed(sock(4))).is_none());
}

#[test]
fn a_wildcard_listen_address_is_reached_on_loopback() {
    assert_eq!(connect_addr("0.0.0.0:443".parse().unwrap()), "127.0.0.1:443".parse().unwrap());
    assert_eq!(connect_addr("[::]:443".parse().unwrap()), "[::1]:443".parse().unwrap());
    assert_eq!(connect_addr("127.0.0.2:9".parse().unwrap()), "127.0.0.2:9".parse().unwrap());
}
