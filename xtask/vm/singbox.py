#!/usr/bin/env python3
"""The sing-box check's driver (`cargo xtask vm`): a real Hysteria2 server
and client (sing-box), and uploads through the client's SOCKS port into a TCP
target that never reads, so that the server's target sockets fill up and the
client's QUIC connection starves. Prints one JSON line per step on stdout.

The configs are those of hystall/tests/common/singbox.rs: a hysteria2
inbound with a self-signed certificate, a "direct" outbound, and a client
with a "mixed" (SOCKS5) inbound that pins the certificate."""
import argparse, json, os, signal, socket, struct, subprocess, sys, threading, time

NAME = "hystall.lab"
PASSWORD = "hystall-vm"


def say(**kw):
    print(json.dumps(kw), flush=True)


def keypair(sb, d):
    text = subprocess.run([sb, "generate", "tls-keypair", NAME], check=True, capture_output=True, text=True).stdout
    def block(kind):
        a = text.index(f"-----BEGIN {kind}-----")
        end = f"-----END {kind}-----"
        return text[a:text.index(end, a) + len(end)] + "\n"
    key, cert = os.path.join(d, "key.pem"), os.path.join(d, "cert.pem")
    open(key, "w").write(block("PRIVATE KEY"))
    open(cert, "w").write(block("CERTIFICATE"))
    return key, cert


def free_tcp_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(sb, d, name, config):
    path = os.path.join(d, name + ".json")
    json.dump(config, open(path, "w"), indent=1)
    log = open(os.path.join(d, name + ".log"), "w")
    return subprocess.Popen([sb, "run", "-c", path, "--disable-color"], stdin=subprocess.DEVNULL, stdout=log, stderr=log)


def socks_connect(socks_port, target, deadline):
    s = socket.create_connection(("127.0.0.1", socks_port), timeout=max(0.1, deadline - time.time()))
    s.sendall(b"\x05\x01\x00")
    if s.recv(2) != b"\x05\x00":
        raise OSError("SOCKS greeting refused")
    ip, port = target
    s.sendall(b"\x05\x01\x00\x01" + socket.inet_aton(ip) + struct.pack(">H", port))
    reply = s.recv(10)
    if len(reply) < 2 or reply[1] != 0:
        raise OSError(f"SOCKS connect refused: {reply!r}")
    s.settimeout(None)
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sing-box", required=True)
    ap.add_argument("--port", type=int, required=True, help="the server's UDP port")
    ap.add_argument("--secs", type=float, default=18, help="seconds of uploads at most")
    ap.add_argument("--stop-file", help="stop the uploads as soon as this file exists")
    ap.add_argument("--uploads", type=int, default=4)
    ap.add_argument("--dir", required=True)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    key, cert = keypair(a.sing_box, a.dir)
    socks_port = free_tcp_port()
    tls = {"enabled": True, "server_name": NAME}
    server = start(a.sing_box, a.dir, "server", {
        "log": {"level": "info", "timestamp": True},
        "inbounds": [{"type": "hysteria2", "tag": "hy2-in", "listen": "127.0.0.1", "listen_port": a.port,
                      "users": [{"name": "lab", "password": PASSWORD}],
                      "tls": dict(tls, certificate_path=cert, key_path=key)}],
        "outbounds": [{"type": "direct", "tag": "direct"}],
    })
    client = start(a.sing_box, a.dir, "client", {
        "log": {"level": "info", "timestamp": True},
        "inbounds": [{"type": "mixed", "tag": "mixed-in", "listen": "127.0.0.1", "listen_port": socks_port}],
        "outbounds": [{"type": "hysteria2", "tag": "hy2-out", "server": "127.0.0.1", "server_port": a.port,
                       "password": PASSWORD, "tls": dict(tls, certificate_path=cert)}],
    })
    stop = threading.Event()
    # The target: accepts, never reads, never closes.
    target = socket.socket()
    target.bind(("127.0.0.1", 0))
    target.listen(64)
    held = []
    def accept():
        while not stop.is_set():
            try:
                held.append(target.accept()[0])
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    try:
        # sing-box (Go) starting and its first QUIC handshake take tens of
        # seconds in a TCG guest on a busy machine.
        deadline = time.time() + 90
        conns = []
        while len(conns) < a.uploads:
            try:
                conns.append(socks_connect(socks_port, target.getsockname(), deadline))
            except OSError as e:
                if time.time() > deadline or server.poll() is not None or client.poll() is not None:
                    say(event="singbox_failed", error=str(e), server_alive=server.poll() is None,
                        client_alive=client.poll() is None)
                    return 1
                time.sleep(0.3)
        say(event="singbox_ready", server_pid=server.pid, client_pid=client.pid, port=a.port,
            target="%s:%d" % target.getsockname(), uploads=len(conns))
        written = [0] * len(conns)
        def upload(i, s):
            chunk = b"\0" * 65536
            try:
                while not stop.is_set():
                    written[i] += s.send(chunk)
            except OSError:
                pass
        for i, s in enumerate(conns):
            threading.Thread(target=upload, args=(i, s), daemon=True).start()
        end = time.time() + a.secs
        while time.time() < end and not (a.stop_file and os.path.exists(a.stop_file)):
            time.sleep(0.2)
        say(event="singbox_done", written=written, target_accepted=len(held),
            server_alive=server.poll() is None, client_alive=client.poll() is None)
        return 0
    finally:
        stop.set()
        for p in (client, server):
            p.send_signal(signal.SIGTERM)
        for p in (client, server):
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    sys.exit(main())
