#!/bin/busybox sh
# Stage 1 of a `cargo xtask vm` guest: /init of the initramfs (static busybox
# and the modules that mounting a 9p root needs, listed in /mods/order). It
# mounts the host's root read-only and the run's output folder read-write,
# then hands over to stage2.sh on that root.
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
echo "HV-STAGE1 uptime=$(cut -d' ' -f1 /proc/uptime)"
for m in $(cat /mods/order); do insmod /mods/$m || echo "HV-STAGE1 insmod $m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostroot /newroot \
  || { echo "HV-STAGE1 cannot mount hostroot"; poweroff -f; }
mount -t tmpfs -o mode=755 tmpfs /newroot/run
mkdir -p /newroot/run/hv-out
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 hvout /newroot/run/hv-out \
  || { echo "HV-STAGE1 cannot mount hvout"; poweroff -f; }
umount /proc /sys /dev
exec switch_root /newroot /bin/bash /run/hv-out/stage2.sh
