use super::*;

/// `nft -j list table` of: a DNAT of a range, a redirect of a set, a DNAT with
/// `th dport` (shown as udp), a TCP DNAT (ignored) and a filter rule (ignored).
const RULESET: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
 {"table": {"family": "ip", "name": "t", "handle": 3}},
 {"rule": {"family": "ip", "table": "t", "chain": "out", "handle": 2, "expr": [
   {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "127.0.0.1"}},
   {"match": {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}}, "right": {"range": [20001, 20010]}}},
   {"dnat": {"addr": "127.0.0.1", "port": 20000}}]}},
 {"rule": {"family": "ip", "table": "t", "chain": "out", "handle": 4, "expr": [
   {"match": {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}}, "right": {"set": [{"range": [30001, 30003]}, 30007]}}},
   {"redirect": {"port": 30000}}]}},
 {"rule": {"family": "ip", "table": "t", "chain": "out", "handle": 5, "expr": [
   {"match": {"op": "==", "left": {"payload": {"protocol": "th", "field": "dport"}}, "right": {"range": [40001, 40005]}}},
   {"dnat": {"port": 40000}}]}},
 {"rule": {"family": "ip", "table": "t", "chain": "out", "handle": 6, "expr": [
   {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 8080}},
   {"dnat": {"port": 80}}]}},
 {"rule": {"family": "inet", "table": "f", "chain": "in", "handle": 7, "expr": [
   {"match": {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}}, "right": 53}},
   {"accept": null}]}}
]}"#;

#[test]
fn dnat_and_redirect_of_udp_ranges_and_sets_are_read() {
    let r = parse(RULESET).unwrap();
    assert_eq!(
        r,
        [
            Redirect { lo: 20001, hi: 20010, to: 20000 },
            Redirect { lo: 30001, hi: 30003, to: 30000 },
            Redirect { lo: 30007, hi: 30007, to: 30000 },
            Redirect { lo: 40001, hi: 40005, to: 40000 },
        ]
    );
}

#[test]
fn an_empty_ruleset_has_none_and_garbage_is_an_error() {
    assert!(parse(r#"{"nftables": [{"metainfo": {}}]}"#).unwrap().is_empty());
    assert!(parse("not json").is_err());
    assert!(parse("{}").is_err());
}
