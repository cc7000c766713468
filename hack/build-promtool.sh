#!/usr/bin/env bash
# Builds promtool, Prometheus' rule and metrics checker, from the Go module proxy into the cache
# (tests/unit/test_monitoring.py runs `promtool check rules` on the chart's PrometheusRule and
# `promtool check metrics` on the operator's exposition). Prints the binary's path as its last
# line; progress goes to stderr. A warm run returns at once.
#
# Prometheus publishes its Go module as v0.MNN.P for release vM.NN.P: v0.316.0 is Prometheus
# 3.16.0, the newest the proxy gave on 2026-11-20. PROMETHEUS_MODULE_VERSION builds another one
# beside it. The release is stamped into the binary (go-install-cached.sh's GO_LDFLAGS), so
# `promtool --version` names it.
set -euo pipefail
module=github.com/prometheus/prometheus
version=${PROMETHEUS_MODULE_VERSION:-v0.316.0}
# go-install-cached.sh returns the cached binary at once when it is there; Go is needed only
# to build it.
cache=${TRAININGRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trainingrun}
[ -x "$cache/promtool-$version/promtool" ] || command -v go >/dev/null || { echo "Go >= 1.26 is needed to build promtool" >&2; exit 1; }

# v0.316.0 -> 3.16.0
[[ $version =~ ^v0\.([0-9])([0-9]{2})\.([0-9]+)$ ]] || {
  echo "PROMETHEUS_MODULE_VERSION=$version is not of the form v0.MNN.P" >&2; exit 1; }
release="${BASH_REMATCH[1]}.$((10#${BASH_REMATCH[2]})).${BASH_REMATCH[3]}"
pv=github.com/prometheus/common/version
ldflags="-s -w -X $pv.Version=$release -X $pv.Branch=release-$release"
ldflags+=" -X $pv.BuildUser=trainingrun -X $pv.BuildDate=19700101-00:00:00"

GO_LDFLAGS="$ldflags" exec bash "$(dirname "$0")/go-install-cached.sh" promtool \
  "$module/cmd/promtool" "$version"
