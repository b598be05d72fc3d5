#!/bin/bash
# checks.sh OUT — the check set of `cargo xtask vm`, run as root inside a
# guest (by stage2.sh) or on the host (the control). It only runs commands:
# each check NAME leaves OUT/c-NAME.out (stdout: JSON events), .err, .rc and
# .secs, and xtask judges them (xtask/src/vm/checks.rs).
#
# Checks that cannot disturb each other run at the same time, in three waves,
# to keep a TCG guest (no KVM here) at about two minutes. The fast lab keeps
# the CPUs busy: it does not run next to the stall detections, whose latency
# is measured, nor next to the slow lab, whose target (16 KiB every 100 ms)
# must keep moving on a starved guest CPU.
#
# Every watch runs until what its check waits for has shown (then one second
# more), or at most MAX seconds after its own `watch_started` line, then gets
# SIGINT: under TCG attaching the probes takes from 10 to 35 s, and the
# lab's sockets fill slowly, so a fixed --duration would either cut a slow
# kernel short or make every run wait for the slowest.
set -u
O=$1
export O H=${HYSTALL:?HYSTALL names the binary under test} SB=${HYSTALL_SING_BOX:-}
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

# What the checks wait for (extended regexps on the JSON lines).
STARVED='"event":"quic_starved".*"confidence":"(likely|confirmed)"'
RECOVERED='"event":"quic_recovered"'
STALLED='"event":"socket_stalled"'

# watch_for NAME MAX [PATTERN COUNT]... -- WATCH_ARGS...: hystall watch
# --json into c-NAME.out until, for each pair, COUNT lines match PATTERN, or
# MAX seconds after it started; its exit code into c-NAME.rc.
watch_for() {
  local name=$1 max=$2 t0 i; shift 2
  local -a want=()
  while [[ $1 != -- ]]; do want+=("$1" "$2"); shift 2; done
  shift
  t0=$(now)
  "$H" watch --json "$@" > "$O/c-$name.out" 2> "$O/c-$name.err" < /dev/null &
  local w=$!
  if wait_line '"watch_started"' "$O/c-$name.out" 120; then
    echo "watch_started after $(secs_since "$t0") s" >> "$O/c-$name.err"
    for ((i = 0; i < max * 2; i++)); do
      if seen_all "$O/c-$name.out" "${want[@]}"; then
        sleep 1
        break
      fi
      kill -0 $w 2>/dev/null || break
      sleep 0.5
    done
  fi
  kill -INT $w 2>/dev/null
  wait $w
  echo $? > "$O/c-$name.rc"
  secs_since "$t0" > "$O/c-$name.secs"
}

# seen_all FILE [PATTERN COUNT]...: each PATTERN matches COUNT lines of FILE
# (no pair: never, for the checks that must see nothing).
seen_all() {
  local f=$1; shift
  (( $# )) || return 1
  while (( $# )); do
    (( $(grep -cE "$1" "$f") >= $2 )) || return 1
    shift 2
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
  ( wait_line '"watch_started"' "$O/c-tcp.out" 90 && touch "$O/tcp.go" ) &
  watch_for tcp 30 "$STALLED" 4 -- --pid $lab --stall-timeout 3
  touch "$O/tcp.go"
  kill $lab 2>/dev/null
  wait
}

# singbox: a real Hysteria2 server and client (sing-box), 4 uploads through
# the client's SOCKS port into a never-reading target (singbox.py), under
# `watch --comm sing-box --port P`.
singbox_check() {
  if [[ -z $SB || ! -x $SB ]]; then
    echo "no sing-box binary (HYSTALL_SING_BOX='$SB')" > "$O/c-singbox.err"
    echo 127 > "$O/c-singbox.rc"; : > "$O/c-singbox.out"; echo 0 > "$O/c-singbox.secs"
    return
  fi
  local port=$((30000 + RANDOM % 20000))
  ( wait_line '"watch_started"' "$O/c-singbox.out" 120 \
      && python3 "$O/singbox.py" --sing-box "$SB" --port $port --secs 120 --stop-file "$O/singbox.stop" \
           --dir "$O/singbox" > "$O/c-singbox.driver" 2>&1 ) &
  watch_for singbox 60 "$STALLED" 4 "$STARVED" 1 -- --comm sing-box --port $port --stall-timeout 3
  touch "$O/singbox.stop"
  wait
}

wave() { echo "HV-WAVE $* at $(cut -d' ' -f1 /proc/uptime)"; }

wave 1 version doctor slow
plain version '"$H" --version' &
plain doctor '"$H" doctor' &
plain doctor-json '"$H" doctor --json' &
watch_for slow 15 -- --lab --lab-uploads 4 --lab-target slow --stall-timeout 3 &
wait

wave 2 stall enforce tcp
watch_for stall 45 "$STALLED" 4 "$STARVED" 1 -- --lab --lab-uploads 4 --lab-target stall --stall-timeout 3 &
watch_for enforce 45 "$RECOVERED" 1 -- --lab --lab-uploads 4 --lab-target stall --stall-timeout 3 --enforce &
tcp_check &
wait

wave 3 fast singbox
watch_for fast 12 -- --lab --lab-uploads 4 --lab-target fast --stall-timeout 3 &
singbox_check &
wait
wave done
