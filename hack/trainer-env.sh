#!/usr/bin/env bash
# Builds (or reuses) the cached virtualenv of a trainer stack outside the clone:
#   bash hack/trainer-env.sh NAME     # requirements/NAME.txt: lightning, composer, mindformers
# The folder is venvs/NAME-<first 12 hex of the sha256 of requirements/NAME.txt> under
# ${TRAININGRUN_CACHE:-${XDG_CACHE_HOME:-~/.cache}/trainingrun} (as hack/build-tools.sh), so a
# changed requirements file gets a new one and a warm run returns at once. A stamp file is
# written last: a build cut short is thrown away and redone. Concurrent calls for the same stack
# wait for each other (flock). The project itself is not installed: the examples import
# trainingrun with PYTHONPATH=<clone>/operator.
# Prints the virtualenv's path on its last stdout line; progress goes to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
name=${1:?usage: trainer-env.sh NAME (a requirements/NAME.txt)}
reqs="$root/requirements/$name.txt"
[ -f "$reqs" ] || { echo "no such stack: $reqs" >&2; exit 2; }
cache=${TRAININGRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trainingrun}
key=$(sha256sum "$reqs" | cut -c1-12)
venv="$cache/venvs/$name-$key"
stamp="$venv/.installed"

mkdir -p "$cache/venvs"
exec 9>"$venv.lock"
flock 9
if [ ! -f "$stamp" ]; then
  start=$(date +%s)
  echo "building the $name virtualenv in $venv (GBs of wheels: about a minute at 40 MB/s)" >&2
  rm -rf "$venv"
  "${PYTHON:-python3}" -m venv "$venv"
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -r "$reqs"
  cp "$reqs" "$stamp"   # last: only a complete environment has it
  echo "  built the $name virtualenv in $(( $(date +%s) - start ))s" >&2
fi
echo "$venv"
