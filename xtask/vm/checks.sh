#!/bin/bash
# checks.sh OUT — the check set of `cargo xtask vm`, run as root inside a
# guest (by stage2.sh) or on the host (the control). It only runs commands:
# each check NAME leaves OUT/c-NAME.out (stdout: JSON events), .err, .rc and
# .secs, and xtask judges them (xtask/src/vm/checks.rs).
#
# Checks that cannot disturb each other run at the same time, in three waves,
# to keep a TCG guest (no KVM here) at two or three minutes: each watch
# loads every eBPF program, which takes 10 to 40 s of guest CPU under TCG.
# The fast lab keeps the CPUs busy: it runs beside doctor only, not beside
# the stall detections, whose latency is measured, nor beside the slow lab,
# whose target (16 KiB every 100 ms) must keep moving on a starved guest CPU;
# the slow lab runs alone, last.
#
# Every watch runs until what its check waits for has shown (then one second
# more), or at most MAX seconds after its own `watch_started` line, then gets
# SIGINT: under TCG attaching the probes takes from 10 to 70 s, and a lab's
# connection starves only once its client has pushed the whole QUIC window
# (20 MiB) and the targets' socket buffers (about 4 MiB each) through an
# emulated CPU: 15 to 40 s after the targets stall, where a real machine
# takes 3. A fixed --duration would either cut a slow kernel short or make
# every run wait for the slowest; the bounds are for a kernel that fails.
set -u
O=$1
H=${HYSTALL:?HYSTALL names the binary under test} SB=${HYSTALL_SING_BOX:-}
# The binaries run from a local copy: in a guest OUT is a 9p mount without a
# cache (so that the host sees the results at once), through which every
# exec would page the binary in again over an emulated transport (tens of
# seconds for sing-box's 40 MB under TCG). Named sing-box for --comm.
BINS=$(mktemp -d /tmp/hv-bin.XXXXXX)
trap 'rm -rf "$BINS"' EXIT
cp "$H" "$BINS/hystall" && H=$BINS/hystall
if [[ -n $SB && -x $SB ]]; then cp "$SB" "$BINS/sing-box" && SB=$BINS/sing-box; fi
export O H SB
now() { date +%s.%N; }
secs_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f\n", b - a }'; }

# wait_line PATTERN FILE SECS: true once FILE has a line matching PATTERN.
wait_line() {
  local i
  for ((i = 0; i < $3 * 2; i++)); do
    grep -q "$1" "$2" 2>/dev/null && return 0
    sleep 0.5
  done
  return 1
}

# watch_for NAME MAX UNTIL -- WATCH_ARGS...: hystall watch --json into
# c-NAME.out until the shell function UNTIL succeeds (then one second more)
# or MAX seconds after the watch started; its exit code into c-NAME.rc.
watch_for() {
  local name=$1 max=$2 until=$3 t0 end; shift 4
  t0=$(now)
  "$H" watch --json "$@" > "$O/c-$name.out" 2> "$O/c-$name.err" < /dev/null &
  local w=$!
  if wait_line '"watch_started"' "$O/c-$name.out" 120; then
    echo "watch_started after $(secs_since "$t0") s" >> "$O/c-$name.err"
    end=$((SECONDS + max))
    while (( SECONDS < end )) && kill -0 $w 2>/dev/null; do
      if $until; then
        sleep 1
        break
      fi
      sleep 0.5
    done
  fi
  kill -INT $w 2>/dev/null
  wait $w
  echo $? > "$O/c-$name.rc"
  secs_since "$t0" > "$O/c-$name.secs"
}

# seen NAME PATTERN COUNT: COUNT lines of c-NAME.out match PATTERN (ERE).
seen() { (( $(grep -cE "$2" "$O/c-$1.out") >= $3 )); }
STALLED='"event":"socket_stalled"'
STARVED='"event":"quic_starved".*"confidence":"(likely|confirmed)"'

# What each check waits for.
stall_seen() { seen stall "$STALLED" 4 && seen stall "$STARVED" 1; }
tcp_seen() { seen tcp "$STALLED" 4; }
singbox_seen() { seen singbox "$STALLED" 4 && seen singbox "$STARVED" 1; }
# enforce: once 3 targets were destroyed, the number of lab lines then is
# marked (c-enforce.mark); done when a later lab probe (a new stream) worked.
lab_freed() {
  if [[ ! -e $O/c-enforce.mark ]]; then
    seen enforce '"event":"enforced".*"result":"(destroyed|shut down)' 3 || return 1
    wc -l < "$O/c-enforce.lab" > "$O/c-enforce.mark"
  fi
  tail -n +$(($(cat "$O/c-enforce.mark") + 1)) "$O/c-enforce.lab" | grep -q '"lab_probe".*"stream_ok":true'
}
never() { false; }

# A UDP port nobody uses, below the ephemeral range (where a client's socket
# may take any port at any time).
free_udp_port() {
  local p
  while :; do
    p=$((25000 + RANDOM % 7000))
    [[ -z $(ss -Hun "sport = :$p" 2>/dev/null) ]] && { echo $p; return; }
  done
}

# plain NAME COMMAND: one command, output into c-NAME.*.
plain() {
  local name=$1 t0; t0=$(now)
  timeout -k 5 120 bash -c "$2" > "$O/c-$name.out" 2> "$O/c-$name.err" < /dev/null
  echo $? > "$O/c-$name.rc"
  secs_since "$t0" > "$O/c-$name.secs"
}

# tcp: `lab tcp` with 2 non-blocking and 2 blocking writers into never-reading
# targets, under `watch --pid`. The writers must start after the watch is
# attached (a non-blocking writer that already got EAGAIN sends nothing more
# a late probe could see), so the lab's pid is made first by a subshell that
# waits for a go file and then execs the lab (exec keeps the pid).
tcp_check() {
  rm -f "$O/tcp.go"
  ( while [ ! -e "$O/tcp.go" ]; do sleep 0.3; done
    exec "$H" lab tcp --stall 2 --stall-blocking 2 --duration 60 ) > "$O/c-tcp.lab" 2>&1 < /dev/null &
  local lab=$!
  ( wait_line '"watch_started"' "$O/c-tcp.out" 120 && touch "$O/tcp.go" ) &
  watch_for tcp 60 tcp_seen -- --pid $lab --stall-timeout 3
  touch "$O/tcp.go"
  kill $lab 2>/dev/null
  wait
}

# enforce: the lab (its own process, as the host test enforce_e2e.rs runs it)
# under `watch --pid --port --enforce`: its stalled targets destroyed, then
# a new stream through its QUIC connection works again (its lab_probe lines).
# Started after the watch is attached, as the tcp lab.
enforce_check() {
  local port; port=$(free_udp_port)
  rm -f "$O/enforce.go" "$O/c-enforce.mark"
  ( while [ ! -e "$O/enforce.go" ]; do sleep 0.3; done
    exec "$H" lab --json --uploads 4 --target stall --listen 127.0.0.1:$port ) > "$O/c-enforce.lab" 2>&1 < /dev/null &
  local lab=$!
  ( wait_line '"watch_started"' "$O/c-enforce.out" 120 && touch "$O/enforce.go" ) &
  watch_for enforce 120 lab_freed -- --pid $lab --port $port --stall-timeout 3 --enforce
  touch "$O/enforce.go"
  kill $lab 2>/dev/null
  wait
}

# singbox: a real Hysteria2 server and client (sing-box), 4 uploads through
# the client's SOCKS port into a never-reading target (singbox.py), under
# `watch --comm sing-box --port P`. The server's windows are 2 and 4 MiB, not
# Hysteria's 8 and 20, so that the connection starves sooner under TCG.
singbox_check() {
  if [[ -z $SB || ! -x $SB ]]; then
    echo "no sing-box binary (HYSTALL_SING_BOX='$SB')" > "$O/c-singbox.err"
    echo 127 > "$O/c-singbox.rc"; : > "$O/c-singbox.out"; echo 0 > "$O/c-singbox.secs"
    return
  fi
  local port; port=$(free_udp_port)
  ( wait_line '"watch_started"' "$O/c-singbox.out" 120 \
      && python3 "$O/singbox.py" --sing-box "$SB" --port $port --secs 180 --stop-file "$O/singbox.stop" \
           --stream-window 2 --conn-window 4 \
           --dir "$O/singbox" > "$O/c-singbox.driver" 2>&1 ) &
  watch_for singbox 150 singbox_seen -- --comm sing-box --port $port --stall-timeout 3 \
    --stream-window 2 --conn-window 4
  touch "$O/singbox.stop"
  wait
}

wave() { echo "HV-WAVE $* at $(cut -d' ' -f1 /proc/uptime)"; }

wave 1 version doctor fast
plain version '"$H" --version' &
plain doctor '"$H" doctor' &
plain doctor-json '"$H" doctor --json' &
watch_for fast 12 never -- --lab --lab-uploads 4 --lab-target fast --stall-timeout 3 &
wait

wave 2 stall enforce tcp singbox
watch_for stall 120 stall_seen -- --lab --lab-uploads 4 --lab-target stall --stall-timeout 3 &
enforce_check &
tcp_check &
singbox_check &
wait

wave 3 slow
watch_for slow 12 never -- --lab --lab-uploads 4 --lab-target slow --stall-timeout 3
wave done
