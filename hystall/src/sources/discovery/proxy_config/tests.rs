use super::*;

#[test]
fn sing_box_quic_inbounds_give_their_ports() {
    let json = r#"{"inbounds": [
        {"type": "hysteria2", "listen": "::", "listen_port": 40000},
        {"type": "tuic", "listen_port": 8443},
        {"type": "mixed", "listen_port": 1080},
        {"type": "hysteria2"}
    ]}"#;
    assert_eq!(sing_box_ports(json), [40000, 8443]);
    assert!(sing_box_ports("not json").is_empty());
    assert!(sing_box_ports("{}").is_empty());
}

#[test]
fn hysteria_listen_gives_its_port_and_443_by_default() {
    assert_eq!(hysteria_ports("listen: :40443\nauth:\n  type: password\n"), [40443]);
    assert_eq!(hysteria_ports("listen: \"0.0.0.0:8443\" # public\n"), [8443]);
    assert_eq!(hysteria_ports("listen: '[::]:9443'\n"), [9443]);
    assert_eq!(hysteria_ports("auth:\n  type: password\n"), [443]);
}

#[test]
fn config_options_are_read_in_both_spellings() {
    let args: Vec<String> =
        ["sing-box", "run", "-c", "a.json", "--config=b.json", "-C", "conf.d"].map(String::from).to_vec();
    assert_eq!(config_args(&args), [("-c", "a.json"), ("--config", "b.json"), ("-C", "conf.d")]);
}

#[test]
fn hysteria2_inbounds_answer_requests_and_tuic_and_v1_do_not() {
    let h2 = r#"{"inbounds": [{"type": "hysteria2", "listen_port": 1}, {"type": "mixed", "listen_port": 2}]}"#;
    assert_eq!(sing_box_answers(h2), Some(true));
    let v1 = r#"{"inbounds": [{"type": "hysteria", "listen_port": 1}]}"#;
    assert_eq!(sing_box_answers(v1), Some(false), "sing-box's Hysteria v1 showed no answer after a dial");
    // One inbound that does not answer: the rule cannot be assumed for the process.
    let mixed = r#"{"inbounds": [{"type": "hysteria2", "listen_port": 1}, {"type": "tuic", "listen_port": 2}]}"#;
    assert_eq!(sing_box_answers(mixed), Some(false));
    assert_eq!(sing_box_answers(r#"{"inbounds": [{"type": "mixed"}]}"#), None);
    assert_eq!(sing_box_answers("not json"), None);
}
