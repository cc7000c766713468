#!/usr/bin/env bash
# Starts a real node of the local environment (issue 46): Debian's containerd and runc with the
# project's config (hack/node/), the CNI bridge plugins, and the kubelet and kube-proxy of
# hack/build-node.sh, registered with the control plane of $KUBECONFIG (tests/localenv's), and
# CoreDNS on the bridge's gateway address (the kubelet's clusterDNS). Images are imported from
# buildah's storage, nothing is pulled:
#   KUBECONFIG=... bash hack/node-up.sh [IMAGE...]
# Settings (environment): NODE_NAME (trainingrun-real-0), NODE_STATE (the node's folder, default
# ${TMPDIR:-/tmp}/trainingrun-node/$NODE_NAME), POD_SUBNET (10.245.0.0/24), SERVICE_CIDR
# (10.0.0.0/24), NODE_BRIDGE (trnode0), NODE_IMAGE_STORE (containerd's root, kept across starts:
# default <cache>/node/containerd), NODE_TAINTS (--register-with-taints; none), FORWARD_PORTS
# (loopback ports that pods reach on the bridge's gateway address through hack/node-forward.py:
# the API server's and S3's).
# The node's address is the bridge's gateway: the kubelet, CoreDNS and the forwarder listen there
# (or on loopback), never on the machine's own interfaces.
# containerd's root (its images) outlives the node, so an image is imported again only when its
# buildah image ID changed; the node's containers are removed at every start and stop.
# The node is labelled trainingrun.dev/real-node=true and has no kwok annotation, so the kwok
# controller (--manage-all-nodes=false) leaves it alone. hack/node-down.sh removes all it made.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${KUBECONFIG:?KUBECONFIG: the control plane the node registers with}"
name=${NODE_NAME:-trainingrun-real-0}
state=${NODE_STATE:-${TMPDIR:-/tmp}/trainingrun-node/$name}
subnet=${POD_SUBNET:-10.245.0.0/24}
# The control plane's --service-cluster-ip-range (kwokctl's default): routed to the host, where
# kube-proxy's rules take a ClusterIP; nothing else leaves the pod subnet (no default route).
service_cidr=${SERVICE_CIDR:-10.0.0.0/24}
bridge=${NODE_BRIDGE:-trnode0}
pause_image=${PAUSE_IMAGE:-localhost/trainingrun/pause:1}
cache=${TRAININGRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trainingrun}
store=${NODE_IMAGE_STORE:-$cache/node/containerd}
bin=$(bash "$here/build-node.sh")
kubectl="$bin/kubectl"
sock="$state/containerd.sock"
ctr=(ctr --address "$sock" --namespace k8s.io)
# The bridge's gateway: the subnet's first address, the node's address (CoreDNS, the kubelet).
dns_ip=$(python3 -c 'import ipaddress, sys; print(next(ipaddress.ip_network(sys.argv[1]).hosts()))' "$subnet")
NODE_IP=$dns_ip

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# fill TEMPLATE OUT: the @NAME@ fields of hack/node's templates.
fill() {
  sed -e "s|@STATE@|$state|g" -e "s|@STORE@|$store|g" -e "s|@PAUSE_IMAGE@|$pause_image|g" -e "s|@BRIDGE@|$bridge|g" \
    -e "s|@POD_SUBNET@|$subnet|g" -e "s|@SERVICE_CIDR@|$service_cidr|g" -e "s|@CGROUP_ROOT@|/$name|g" \
    -e "s|@CLIENT_CA@|$state/ca.crt|g" -e "s|@NODE_IP@|$NODE_IP|g" \
    -e "s|@KUBELET_PORT@|$kubelet_port|g" -e "s|@HEALTHZ_PORT@|$healthz_port|g" \
    -e "s|@DNS_IP@|$dns_ip|g" -e "s|@KUBECONFIG@|$KUBECONFIG|g" "$1" > "$2"
}
# start NAME COMMAND...: in a session of its own, logging to $state/NAME.log, pid in NAME.pid.
start() {
  local what=$1; shift
  setsid "$@" >> "$state/$what.log" 2>&1 < /dev/null &
  echo $! > "$state/$what.pid"
}

# import REF: from buildah's storage into containerd's k8s.io namespace (the CRI's), unless the
# image of that buildah image ID is there already (a marker per reference beside the store).
markers="$(dirname "$store")/imported"
mkdir -p "$markers"
import() {
  local ref=$1 id marker archive="$state/import.tar"
  id=$(buildah images --noheading --no-trunc --format '{{.ID}}' "$ref" | head -1)
  [ -n "$id" ] || { echo "image $ref is not in buildah's storage: make images" >&2; return 1; }
  marker="$markers/$(tr '/:' '__' <<< "$ref")"
  if [ "$(cat "$marker" 2>/dev/null)" = "$id" ] && [ -n "$("${ctr[@]}" images ls -q "name==$ref")" ]; then
    id=${id#sha256:}; echo "image $ref already imported (${id:0:12})" >&2
    return 0
  fi
  local start_s
  start_s=$(date +%s)
  rm -f "$archive" "$marker"
  buildah push --quiet "$ref" "docker-archive:$archive:$ref"
  "${ctr[@]}" images import "$archive" >/dev/null
  rm -f "$archive"
  echo "$id" > "$marker"
  echo "imported $ref in $(( $(date +%s) - start_s ))s" >&2
}

up_already=0
if [ -f "$state/kubelet.pid" ] && kill -0 "$(cat "$state/kubelet.pid")" 2>/dev/null; then
  up_already=1
fi
if [ "$up_already" = 1 ]; then
  # Up already: only the images, each imported again when its buildah image ID changed, and the
  # sandbox image (the kubelet deletes it under disk pressure).
  "${ctr[@]}" images import "$(dirname "$(readlink -f "$bin/pause.tar")")/pause.tar" >/dev/null
  for image in "$@"; do
    import "$image"
  done
  echo "node $name is up already ($state)" >&2
  exit 0
fi
mkdir -p "$state/cni/net.d" "$state/pod-logs" "$state/kubelet"
mkdir -p "$store"
kubelet_port=$(free_port) healthz_port=$(free_port)
fill "$here/node/containerd.toml" "$state/containerd.toml"
fill "$here/node/cni.conflist" "$state/cni/net.d/10-trainingrun.conflist"
fill "$here/node/kubelet.yaml" "$state/kubelet.yaml"
fill "$here/node/Corefile" "$state/Corefile"
# What a pod with dnsPolicy Default gets: no resolver of the machine's.
echo "# the local node's pods: cluster DNS only" > "$state/resolv.conf"
# The cluster CA: the API server's kubelet client certificate is checked against it.
ca=$("$kubectl" config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority}')
if [ -n "$ca" ]; then
  cp "$ca" "$state/ca.crt"
else
  "$kubectl" config view --raw --minify \
    -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d > "$state/ca.crt"
fi

# The kubelet's cgroup root must exist in every hierarchy; a new cgroup v1 cpuset has no CPUs or
# memory nodes until given its parent's.
for hierarchy in /sys/fs/cgroup/*/; do
  [ -f "$hierarchy/cgroup.procs" ] || continue
  mkdir -p "$hierarchy/$name"
  for f in cpuset.cpus cpuset.mems; do
    [ -f "$hierarchy/$f" ] && cat "$hierarchy/$f" > "$hierarchy/$name/$f"
  done
done

start containerd containerd --config "$state/containerd.toml"
# The bridge the CNI bridge plugin would make at the first pod, made now with its gateway address
# so CoreDNS can listen there before any pod runs.
if ! ip link show "$bridge" >/dev/null 2>&1; then
  ip link add "$bridge" type bridge
  ip addr add "$dns_ip/${subnet#*/}" dev "$bridge"
  ip link set "$bridge" up
fi
start coredns "$bin/coredns" -conf "$state/Corefile"
if [ -n "${FORWARD_PORTS:-}" ]; then
  # shellcheck disable=SC2086  # one argument per port
  start forward python3 "$here/node-forward.py" --listen "$dns_ip" --to 127.0.0.1 $FORWARD_PORTS
fi
# The service range goes nowhere but through kube-proxy's rules: without this, a ClusterIP with no
# rule would be forwarded out of the machine's default route.
ip route add blackhole "$service_cidr" 2>/dev/null || true
for _ in $(seq 100); do
  "${ctr[@]}" version >/dev/null 2>&1 && break
  sleep 0.1
done
"${ctr[@]}" version >/dev/null

# What a stopped node left in the kept root (containerd or the machine stopped before
# hack/node-down.sh could run): containers and sandboxes, never images.
for c in $("${ctr[@]}" containers ls -q 2>/dev/null); do
  "${ctr[@]}" containers delete "$c" >/dev/null 2>&1 && echo "removed stale container $c" >&2
done

"${ctr[@]}" images import "$(dirname "$(readlink -f "$bin/pause.tar")")/pause.tar" >/dev/null
for image in "$@"; do
  import "$image"
done

start kubelet "$bin/kubelet" --config "$state/kubelet.yaml" --kubeconfig "$KUBECONFIG" \
  --root-dir "$state/kubelet" --hostname-override "$name" --node-ip "$NODE_IP" \
  --node-labels trainingrun.dev/real-node=true ${NODE_TAINTS:+--register-with-taints "$NODE_TAINTS"} --v 2
# kube-proxy (iptables mode) for ClusterIPs. --masquerade-all: a pod reaching a Service whose
# endpoint is on the same bridge gets the reply through the host; localhost node ports off, so
# route_localnet, a machine-wide setting, stays as it is; conntrack settings left alone.
start kube-proxy "$bin/kube-proxy" --kubeconfig "$KUBECONFIG" --hostname-override "$name" \
  --cluster-cidr "$subnet" --proxy-mode iptables --masquerade-all \
  --iptables-localhost-nodeports=false --nodeport-addresses "$dns_ip/32" \
  --metrics-bind-address "127.0.0.1:$(free_port)" --healthz-bind-address "127.0.0.1:$(free_port)" \
  --conntrack-max-per-core 0 --conntrack-tcp-timeout-established 0 \
  --conntrack-tcp-timeout-close-wait 0 --v 2
# Ready within 2 minutes, or the kubelet's last words.
kubelet_pid=$(cat "$state/kubelet.pid")
for _ in $(seq 240); do
  ready=$("$kubectl" get node "$name" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true)
  [ "$ready" = True ] && break
  if ! kill -0 "$kubelet_pid" 2>/dev/null; then
    grep -E '^[EF][0-9]{4}' "$state/kubelet.log" | tail -5 >&2
    echo "the kubelet exited: $state/kubelet.log" >&2
    exit 1
  fi
  sleep 0.5
done
[ "$ready" = True ] || { echo "node $name not Ready after 2 minutes: $state/kubelet.log" >&2; exit 1; }
echo "node $name Ready: state $state, kubelet log $state/kubelet.log"
