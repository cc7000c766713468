#!/usr/bin/env bash
# Removes a real node of the local environment (hack/node-up.sh) and everything it made:
#   bash hack/node-down.sh             # NODE_NAME, NODE_STATE, NODE_BRIDGE as for node-up.sh
# In this order, each step whatever the previous one found:
#   1. while the API server and the kubelet answer: the node's pods, force-deleted, so the kubelet
#      stops them through the CRI and the CNI plugins undo their network (up to 30 s); then the
#      Node object
#   2. the kubelet, kube-proxy, CoreDNS and the forwarder; then each container task left in
#      containerd's k8s.io namespace (SIGKILL) and every container and sandbox (their snapshots
#      with them; the images stay in the kept root, NODE_IMAGE_STORE); then containerd, its runc
#      shims (by their -address), any process left in the node's cgroups
#   3. the mounts under the state folder: the kubelet's root, pod volumes (tmpfs), sandbox
#      /dev/shm, network namespaces (netns_mounts_under_state_dir), overlay roots
#   4. the node's cgroups (/NAME in every hierarchy: the kubelet's cgroupRoot), deepest first
#   5. kube-proxy's rules (kube-proxy --cleanup) and the service range's blackhole route;
#      iptables (v4 and v6): the portmap rules of the node's CNI network (by their comment) and
#      their CNI-DN-* chains; the shared CNI-HOSTPORT-* chains once empty; the kubelet's chains
#      (KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT) once no kubelet runs
#   6. the CNI bridge, the CNI result cache entries of the node's network, the state folder
# Prints what it removed; exits 0 when nothing of the node is left.
# No -e: every step runs whatever the one before found. No pipefail either: `grep -q` ends a
# pipe early, and the writer's SIGPIPE would read as a failure.
set -u
name=${NODE_NAME:-trainingrun-real-0}
state=${NODE_STATE:-${TMPDIR:-/tmp}/trainingrun-node/$name}
bridge=${NODE_BRIDGE:-trnode0}
cache=${TRAININGRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trainingrun}
store=${NODE_IMAGE_STORE:-$cache/node/containerd}
sock="$state/containerd.sock"
ctr=(ctr --address "$sock" --namespace k8s.io)
said() { echo "removed: $*"; }

# stop_pid PID GRACE_S: SIGTERM, then SIGKILL after GRACE_S seconds.
stop_pid() {
  local pid=$1 grace=$2
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq $(( grace * 10 ))); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null
  sleep 0.2
}

kubectl=("$cache/bin/kubectl" --request-timeout=10s)
api=0
[ -n "${KUBECONFIG:-}" ] && [ -x "$cache/bin/kubectl" ] && "${kubectl[@]}" get node "$name" >/dev/null 2>&1 && api=1
if [ "$api" = 1 ] && [ -f "$state/kubelet.pid" ] && kill -0 "$(cat "$state/kubelet.pid")" 2>/dev/null; then
  pods=$("${kubectl[@]}" get pods -A --field-selector "spec.nodeName=$name" --no-headers 2>/dev/null | wc -l)
  if [ "$pods" -gt 0 ]; then
    "${kubectl[@]}" delete pods -A --field-selector "spec.nodeName=$name" --grace-period=0 --force \
      --wait=false >/dev/null 2>&1
    for _ in $(seq 60); do
      "${ctr[@]}" tasks ls 2>/dev/null | awk 'NR > 1 && $3 == "RUNNING" {found = 1} END {exit !found}' ||
        break
      sleep 0.5
    done
    said "$pods pods of node $name, stopped by its kubelet"
  fi
fi
if [ "$api" = 1 ] && "${kubectl[@]}" delete node "$name" --ignore-not-found 2>/dev/null | grep deleted >/dev/null; then
  said "node/$name"
fi

if [ -f "$state/kubelet.pid" ]; then
  pid=$(cat "$state/kubelet.pid")
  kill -0 "$pid" 2>/dev/null && { stop_pid "$pid" 10; said "kubelet (pid $pid)"; }
fi
if [ -f "$state/kube-proxy.pid" ]; then
  pid=$(cat "$state/kube-proxy.pid")
  kill -0 "$pid" 2>/dev/null && { stop_pid "$pid" 5; said "kube-proxy (pid $pid)"; }
fi
if [ -f "$state/coredns.pid" ]; then
  pid=$(cat "$state/coredns.pid")
  kill -0 "$pid" 2>/dev/null && { stop_pid "$pid" 5; said "coredns (pid $pid)"; }
fi
if [ -f "$state/forward.pid" ]; then
  pid=$(cat "$state/forward.pid")
  kill -0 "$pid" 2>/dev/null && { stop_pid "$pid" 5; said "forwarder (pid $pid)"; }
fi
if [ -S "$sock" ] && "${ctr[@]}" version >/dev/null 2>&1; then
  for task in $("${ctr[@]}" tasks ls -q 2>/dev/null); do
    "${ctr[@]}" tasks kill --signal SIGKILL "$task" >/dev/null 2>&1
  done
  sleep 0.5
  for task in $("${ctr[@]}" tasks ls -q 2>/dev/null); do
    "${ctr[@]}" tasks delete --force "$task" >/dev/null 2>&1 && said "container task $task"
  done
  # The root outlives the node: its containers (the sandboxes among them) and their snapshots go.
  n=0
  for c in $("${ctr[@]}" containers ls -q 2>/dev/null); do
    "${ctr[@]}" containers delete "$c" >/dev/null 2>&1 && n=$(( n + 1 ))
  done
  [ "$n" -gt 0 ] && said "$n containers (and sandboxes) with their snapshots"
fi
if [ -f "$state/containerd.pid" ]; then
  pid=$(cat "$state/containerd.pid")
  kill -0 "$pid" 2>/dev/null && { stop_pid "$pid" 10; said "containerd (pid $pid)"; }
fi
# The shims outlive containerd by design; each names the socket of the containerd it serves.
for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $sock( |$)"); do
  stop_pid "$pid" 2
  said "containerd-shim-runc-v2 (pid $pid)"
done
cgroup_dirs() {
  for hierarchy in /sys/fs/cgroup/*/; do
    [ -d "$hierarchy/$name" ] && find "$hierarchy/$name" -depth -type d
  done
}
for dir in $(cgroup_dirs); do
  while read -r pid; do
    kill -KILL "$pid" 2>/dev/null && said "process $pid ($(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-60))"
  done < "$dir/cgroup.procs"
done

# Deepest first, so a mount inside another one goes before it.
for target in $(findmnt -rn -o TARGET | grep -F "$state/" | sort -r); do
  umount "$target" 2>/dev/null || umount -l "$target"
  said "mount $target"
done

had=$(cgroup_dirs | wc -l)
for dir in $(cgroup_dirs); do
  rmdir "$dir" 2>/dev/null || echo "left: cgroup $dir (busy)" >&2
done
[ "$had" -gt 0 ] && [ -z "$(cgroup_dirs)" ] && said "$had cgroups under /$name"

# kube-proxy's own rules (KUBE-SERVICES, KUBE-NODEPORTS, KUBE-POSTROUTING, ...), by kube-proxy.
if [ -x "$cache/bin/kube-proxy" ] && ! pgrep -x kube-proxy >/dev/null &&
  iptables-save 2>/dev/null | grep -- "-j KUBE-SERVICES" >/dev/null; then
  "$cache/bin/kube-proxy" --cleanup >/dev/null 2>&1 && said "kube-proxy's iptables rules (kube-proxy --cleanup)"
fi
service_cidr=${SERVICE_CIDR:-10.0.0.0/24}
if ip route show type blackhole | grep "^blackhole $service_cidr" >/dev/null; then
  ip route del blackhole "$service_cidr" && said "route blackhole $service_cidr"
fi
# ipt CMD ARGS...: iptables or ip6tables, waiting for the lock.
ipt() { "$1" -w "${@:2}"; }
for cmd in iptables ip6tables; do
  command -v "$cmd" >/dev/null || continue
  # The portmap plugin's rules of this network: one per pod with host ports, in CNI-HOSTPORT-DNAT,
  # each jumping to a CNI-DN-* chain of its own. A pod stopped through the CRI has none left.
  while read -r rule; do
    chain=$(sed -n 's/.* -j \(CNI-DN-[0-9a-f]*\).*/\1/p' <<< "$rule")
    eval "ipt $cmd -t nat -D ${rule#-A }" && said "$cmd -t nat portmap rule to $chain"
    if [ -n "$chain" ]; then
      ipt "$cmd" -t nat -F "$chain" && ipt "$cmd" -t nat -X "$chain" && said "$cmd -t nat $chain"
    fi
  done < <("$cmd-save" -t nat 2>/dev/null | grep -F -- "name: \\\"trainingrun-node\\\" id:")
  # The portmap plugin's own chains, shared by every CNI network on the machine: once unused.
  if ipt "$cmd" -t nat -S CNI-HOSTPORT-DNAT 2>/dev/null | grep -- "^-A" >/dev/null; then
    :
  elif ipt "$cmd" -t nat -S CNI-HOSTPORT-DNAT >/dev/null 2>&1; then
    for jump in "PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT" \
      "OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT" \
      "POSTROUTING -m comment --comment \"CNI portfwd requiring masquerade\" -j CNI-HOSTPORT-MASQ"; do
      eval "ipt $cmd -t nat -D $jump" 2>/dev/null
    done
    for chain in CNI-HOSTPORT-DNAT CNI-HOSTPORT-MASQ CNI-HOSTPORT-SETMARK; do
      ipt "$cmd" -t nat -F "$chain" 2>/dev/null && ipt "$cmd" -t nat -X "$chain" && said "$cmd -t nat $chain"
    done
  fi
  # The kubelet's chains are the machine's, shared by every kubelet on it: the last one's goes.
  pgrep -x kubelet >/dev/null && continue
  for jump in "INPUT -j KUBE-FIREWALL" "OUTPUT -j KUBE-FIREWALL"; do
    while eval "ipt $cmd -t filter -D $jump" 2>/dev/null; do :; done
  done
  for table in mangle nat filter; do
    for chain in KUBE-FIREWALL KUBE-IPTABLES-HINT KUBE-KUBELET-CANARY; do
      if ipt "$cmd" -t "$table" -S "$chain" >/dev/null 2>&1; then
        ipt "$cmd" -t "$table" -F "$chain" && ipt "$cmd" -t "$table" -X "$chain" && said "$cmd -t $table $chain"
      fi
    done
  done
done

if ip link show "$bridge" >/dev/null 2>&1; then
  ip link delete "$bridge" && said "bridge $bridge"
fi
# libcni's cache of ADD results (containerd 1.6 keeps it in /var/lib/cni): our network's entries,
# and the loopback network's (containerd's own "cni-loopback") of our pods' sandboxes.
for f in /var/lib/cni/results/trainingrun-node-*; do
  [ -e "$f" ] && rm -f "$f" && said "$f"
done
for dir in "$store"/io.containerd.grpc.v1.cri/sandboxes/*/ "$state"/containerd/state/io.containerd.grpc.v1.cri/sandboxes/*/; do
  [ -d "$dir" ] || continue
  f="/var/lib/cni/results/cni-loopback-$(basename "$dir")-lo"
  [ -e "$f" ] && rm -f "$f" && said "$f"
done
rmdir /var/lib/cni/results /var/lib/cni 2>/dev/null && said "/var/lib/cni (empty)"
# The CRI plugin's files of each container and sandbox in the kept root (hosts, resolv.conf).
for dir in "$store"/io.containerd.grpc.v1.cri/{containers,sandboxes}/*/; do
  [ -d "$dir" ] && rm -rf "$dir"
done
# containerd 1.6 puts every shim's socket in /run/containerd/s, whatever its state folder says.
rmdir /run/containerd/s /run/containerd 2>/dev/null && said "/run/containerd (empty)"
if [ -d "$state" ]; then
  rm -rf "$state" && said "$state"
fi
rmdir "$(dirname "$state")" 2>/dev/null   # the nodes' parent folder, once empty
left=0
[ -n "$(cgroup_dirs)" ] && left=1
findmnt -rn -o TARGET | grep -F "$state/" >/dev/null && left=1
pgrep -f -- "$state" >/dev/null && left=1
exit $left
