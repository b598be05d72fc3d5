//! Clients whose uploads start in the same instant: no evidence says which
//! stalled target is whose, but every split the bytes allow gives a starved
//! connection enough of them. It is flagged, its targets listed as shared,
//! never as its own; a healthy one beside it is not.

use super::*;

const MIB: u64 = 1 << 20;

/// Target `cookie`, dialled at `at`, took `mib` MiB evenly until `until`,
/// then blocked for good.
fn filled_target(n: &mut Node, cookie: u64, at: f64, until: f64, mib: f64) {
    let total = (mib * MIB as f64) as u64;
    let step = hystall_common::MARK_BYTES;
    let marks: Vec<ByteMark> = (1..=total / step)
        .map(|k| {
            let frac = (k * step) as f64 / total as f64;
            ByteMark::Send { cookie, at: s(at + (until - at) * frac), bytes: k * step }
        })
        .collect();
    n.links.marks(&marks, &n.conns);
    let k = SockSample {
        cookie,
        pid: PID,
        comm: "sing-box".into(),
        local: Some(format!("10.0.0.1:{}", 40000 + cookie).parse().unwrap()),
        remote: Some("93.184.216.34:443".parse().unwrap()),
        outbound: true,
        state: 1,
        last_send: Some(s(until)),
        blocked_since: Some(s(until)),
        first_seen: Some(s(at)),
        ..Default::default()
    };
    n.socks.apply(Observation::Sock { at: s(until), change: SockChange::Blocked, sample: k });
}

/// Two clients connected at 1.5 s, active at 2 s, and the server dialling
/// `targets` at 2.05 s, while both were.
fn two_clients_dialling(targets: &[u64]) -> Node {
    let mut n = Node::new();
    n.tick(0.0);
    n.connect(1000, 1.5);
    n.connect(1001, 1.5);
    n.second(1000, 2.0, false);
    n.second(1001, 2.0, false);
    n.tick(2.0);
    for &c in targets {
        n.links.connect(c, PID, s(2.05));
    }
    n
}

/// Two clients connect at 1.5 s and upload from 2 s for `secs[i]` seconds
/// (9.6 MB/s); every target is dialled at 2.05 s, while both were active,
/// and takes 3.75 MiB (a socket buffer's worth) until 6 s; `targets[i]` are
/// client i's in truth. Returns every starvation event until 26 s.
fn together(secs: [u64; 2], targets: [&[u64]; 2]) -> (Node, Vec<Stamped>) {
    let all: Vec<u64> = targets.iter().flat_map(|t| t.iter().copied()).collect();
    let mut n = two_clients_dialling(&all);
    let mut events = Vec::new();
    for t in 3..=26u64 {
        n.second(1000, t as f64, t <= 2 + secs[0]);
        n.second(1001, t as f64, t <= 2 + secs[1]);
        if t == 6 {
            for &c in &all {
                filled_target(&mut n, c, 2.05, 6.0, 3.75);
            }
        }
        events.extend(n.tick(t as f64));
    }
    (n, events)
}

#[test]
fn two_starved_clients_that_start_together_are_both_flagged_with_shared_targets() {
    // Each carried 4 × 3.75 MiB into its targets and 20 MiB into its window:
    // with fewer than four of the eight, its bytes stay unexplained.
    let (n, events) = together([4, 4], [&[1, 2, 3, 4], &[5, 6, 7, 8]]);
    let mut flagged = starved(&events);
    flagged.sort();
    assert_eq!(flagged, vec![(1, "likely", 0), (2, "likely", 0)], "{flagged:?}");
    for conn in [1, 2] {
        let st = n.det.get(conn).unwrap();
        assert!(st.targets.is_empty(), "none is its own: {:?}", st.targets);
        let sh = st.shared.as_ref().expect("shared");
        assert_eq!((sh.at_least, sh.targets.len(), sh.with.clone()), (4, 8, vec![3 - conn]));
    }
    let Some(Event::QuicStarved(info)) = events.iter().map(|e| &e.event).find(|e| matches!(e, Event::QuicStarved(_)))
    else {
        panic!()
    };
    let sh = info.evidence.shared_targets.as_ref().expect("in the event");
    assert_eq!((sh.at_least, sh.targets.len()), (4, 8));
    assert!(info.stalled.is_empty(), "shared targets are not listed as its own");
}

#[test]
fn of_a_four_and_a_two_stalled_client_starting_together_only_the_four_is_flagged() {
    // The 2-stalled client carried less than 2 × 3.75 MiB and its two
    // streams' 16 MiB (2 s of upload); the starved one 4 × 3.75 + 20 MiB.
    let (n, events) = together([4, 2], [&[1, 2, 3, 4], &[5, 6]]);
    let flagged = starved(&events);
    assert!(flagged.iter().all(|(c, _, _)| *c == 1), "the healthy client is flagged: {flagged:?}");
    assert_eq!(flagged.first().map(|f| (f.0, f.1)), Some((1, "likely")), "{flagged:?}");
    assert!(n.det.get(2).is_none());
}

/// The same bytes from both (2 s of upload, 18.3 MiB), 4 and 2 stalled
/// targets that took 3.75 MiB each: the byte rules let either hold two to
/// four. Then, at `request` s, the 2-stalled client's user tries
/// a new request, which reaches the server (a target dialled, tied by its
/// connect): it had credit after its stream data stopped.
fn four_and_two_alike(request: Option<f64>) -> (Node, Vec<Stamped>) {
    let mut n = two_clients_dialling(&[1, 2, 3, 4, 5, 6]);
    let mut events = Vec::new();
    for t in 3..=26u64 {
        let at = t as f64;
        if let Some(r) = request.filter(|r| *r > at - 1.0 && *r < at) {
            // Only the 2-stalled client sent anything just before the dial
            // (the other's last packet was at the second before).
            n.second(1001, r - 0.05, false);
            n.links.connect(9, PID, s(r));
            n.links.polled(s(r + 0.01));
            events.extend(n.tick(r + 0.01));
        }
        n.second(1000, at, t <= 4);
        n.second(1001, at, t <= 4);
        if t == 6 {
            for c in 1..=6 {
                filled_target(&mut n, c, 2.05, 6.0, 3.75);
            }
        }
        events.extend(n.tick(at));
    }
    (n, events)
}

#[test]
fn a_request_that_reaches_the_server_after_the_stop_caps_what_its_connection_holds() {
    // Without the request nothing tells the two apart: neither is flagged
    // (each may hold four of the six).
    let (_, events) = four_and_two_alike(None);
    assert_eq!(starved(&events), vec![], "no evidence, no flag");
    // The 2-stalled client's request reached the server at 10 s, after its
    // last bulk (6 s): it cannot hold three of the stalled targets (it
    // would have had no credit), so the other holds at least four.
    let (n, events) = four_and_two_alike(Some(9.5));
    assert_eq!(n.links.link(9).map(|l| l.conn), Some(2), "the request's target is tied to it");
    let flagged = starved(&events);
    assert_eq!(flagged.first().map(|f| (f.0, f.1)), Some((1, "likely")), "{flagged:?}");
    assert!(flagged.iter().all(|(c, _, _)| *c == 1), "the client whose request worked is flagged: {flagged:?}");
    let sh = n.det.get(1).unwrap().shared.as_ref().expect("shared").clone();
    assert!(sh.at_least >= 4 && sh.with == vec![2], "{sh:?}");
}
