#!/bin/busybox sh
# SPDX-License-Identifier: Apache-2.0
# /init of the throw-away test VM (`cargo xtask vm`): PID 1 in a busybox initramfs.
# It mounts the host's / read-only over 9p with a tmpfs overlay on top (the guest may write
# anywhere, nothing reaches the host), the read-write results share at its host path, and
# what the agent and the scenario runner expect of a node (cgroup2, bpffs, /tmp, lo up);
# then it switch_roots into the host root and runs the command script as root.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs dev /dev
for m in $(cat /mods/order); do insmod "$m"; done
for a in $(cat /proc/cmdline); do
  case $a in
    kpevm.out=*) OUT=${a#*=} ;;
    kpevm.cwd=*) CWD=${a#*=} ;;
    kpevm.token=*) TOKEN=${a#*=} ;;
  esac
done
mkdir -p /lower /rw
mount -t tmpfs rw /rw
mkdir -p /rw/upper /rw/work
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /lower
R=/newroot
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work,xino=off overlay $R
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount -t devtmpfs dev $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts
mount -t tmpfs tmpfs $R/dev/shm
mount -t tmpfs tmpfs $R/run
mount -t tmpfs -o mode=1777 tmpfs $R/tmp
# The agent and the scenario runner find cgroup v2 and bpffs through /proc/mounts.
mount -t cgroup2 cgroup2 $R/sys/fs/cgroup
mount -t bpf bpf $R/sys/fs/bpf
mkdir -p $R$OUT
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out $R$OUT
hostname kpe-vm
# IPVS refuses real servers (EINVAL) while there is no local routing table at all.
ip link set lo up
cat > $R/run/kpevm-pid1.sh <<EOS
# A working directory the guest cannot see is an error (the host checks first), never a
# silent run in / where every relative path would be missing.
if cd '$CWD'; then
  bash '$OUT/.kpevm-$TOKEN.sh' </dev/null
  echo \$? > '$OUT/.kpevm-$TOKEN.rc'
else
  echo "kpevm: the working directory $CWD is not visible in the guest" >&2
  echo 125 > '$OUT/.kpevm-$TOKEN.rc'
fi
sync
# The power-off is asynchronous and takes the 9p root away: PID 1 must neither exit
# (a kernel panic) nor exec anything until it is done, so it waits with a builtin read
# on the console, which gets no input.
exec 2>/dev/null
echo o > /proc/sysrq-trigger
while :; do read -r -t 30 _ </dev/console; done
EOS
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb
export KPE_VM_GUEST=1
# Everything runs 10-20x slower under TCG: the scenario runner stretches its own waits.
export SCENARIO_TIME_SCALE=10
# switch_root, not chroot: the kernel's module autoloading (request_module runs
# /sbin/modprobe in PID 1's root) must see the host's /lib/modules.
exec switch_root $R /bin/bash /run/kpevm-pid1.sh
