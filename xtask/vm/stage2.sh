#!/bin/bash
# Stage 2 of a `cargo xtask vm` guest: PID 1 on the host's root (9p,
# read-only). Mounts what a normal system has, loads the kernel's own
# modules, runs checks.sh, and powers off. /run/hv-out is the run's output
# folder on the host (read-write); env.sh there says which kernel this is.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TERM=dumb LANG=C.UTF-8
O=/run/hv-out
. $O/env.sh
: > $O/stage2-started
log() { echo "HV: $*"; }
mount -t proc proc /proc
log "stage2 uptime=$(cut -d' ' -f1 /proc/uptime)"
# The kernel's module tree is bound under /run/hv-modroot before /root and
# /tmp are covered with tmpfs (the cache lives under ~/.cache), and modprobe
# is wrapped to look there, for the checks and for the kernel's autoloader.
mkdir -p /run/hv-modroot/lib/modules/$HV_KVER /run/hv-bin
mount --bind "$HV_MODDIR" /run/hv-modroot/lib/modules/$HV_KVER || log "cannot bind $HV_MODDIR"
printf '#!/bin/sh\nexec /sbin/modprobe -d /run/hv-modroot "$@"\n' > /run/hv-bin/modprobe
chmod +x /run/hv-bin/modprobe
export PATH=/run/hv-bin:$PATH
echo /run/hv-bin/modprobe > /proc/sys/kernel/modprobe
if [[ -d /usr/lib/modules ]]; then
  mount -t tmpfs tmpfs /usr/lib/modules && mkdir -p /usr/lib/modules/$HV_KVER \
    && mount --bind "$HV_MODDIR" /usr/lib/modules/$HV_KVER || log "cannot set up /usr/lib/modules"
fi
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
for d in /tmp /var/tmp /root /var/log /var/lib /var/cache /mnt /media; do
  mount -t tmpfs -o mode=1777 tmpfs $d 2>/dev/null || log "tmpfs on $d failed"
done
chmod 700 /root
mount -t bpf bpf /sys/fs/bpf || log "bpffs mount failed"
mount -t tracefs tracefs /sys/kernel/tracing || log "tracefs mount failed"
mount -t debugfs debugfs /sys/kernel/debug || log "debugfs mount failed"
mount -t cgroup2 cgroup2 /sys/fs/cgroup || log "cgroup2 mount failed"
mount -t securityfs securityfs /sys/kernel/security 2>/dev/null
hostname hvguest
ip link set lo up || log "ip link set lo up failed"
{
  echo "uname: $(uname -a)"
  echo "btf: $(ls -la /sys/kernel/btf/vmlinux 2>&1)"
  echo "nproc: $(nproc)  mem: $(grep MemTotal /proc/meminfo)"
} > $O/guest-env.txt
# Preloaded so that a check never races the autoloader (which works here).
for m in sch_ingress cls_bpf act_bpf inet_diag tcp_diag udp_diag; do
  out=$(modprobe "$m" 2>&1) || log "modprobe $m FAILED: $out"
done
# Without TCX (before 6.6) each hystall adds the clsact qdisc on lo when it is
# missing and deletes it when it exits, under the feet of the concurrent
# checks still running: one added here first belongs to none of them.
case $(uname -r) in
  [1-5].*|6.[0-5].*) tc qdisc add dev lo clsact || log "tc qdisc add dev lo clsact failed";;
esac

log "checks start uptime=$(cut -d' ' -f1 /proc/uptime)"
bash $O/checks.sh $O
log "checks done uptime=$(cut -d' ' -f1 /proc/uptime)"
dmesg > $O/dmesg.txt 2>&1
: > $O/done
sync
umount $O 2>/dev/null
busybox poweroff -f || echo o > /proc/sysrq-trigger
sleep 5
