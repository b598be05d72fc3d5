#!/bin/bash
# CPU hystall spends on a host that execs a lot: 5000 execs of /bin/true
# while `watch --comm NAME` (no such process) runs; hystall's CPU ticks before/after.
BIN=${1:-target/release/hystall}
N=5000
loop() { local t0=$(date +%s.%N); for ((i=0;i<N;i++)); do /bin/true; done; echo "$(date +%s.%N) - $t0" | bc; }
echo "without hystall: $(loop) s for $N execs"
$BIN watch --json --comm no-such-proxy > /tmp/execcost.out 2>&1 &
W=$!
sleep 3
ticks() { awk '{print $14+$15}' /proc/$W/stat; }
a=$(ticks)
t=$(loop)
b=$(ticks)
echo "with hystall:    $t s for $N execs; hystall CPU $(( (b-a) * 10 )) ms ($(echo "scale=1; ($b-$a)*10000/$N" | bc) us per exec)"
a=$(ticks); sleep 5; b=$(ticks)
echo "idle 5 s: hystall CPU $(( (b-a) * 10 )) ms"
kill -INT $W; wait $W 2>/dev/null
