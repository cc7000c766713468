# Sourced by hack/build-tools.sh and hack/build-node.sh (which set $cache and the Go variables).
#
# build MODULE_DIR LDFLAGS NAME=PACKAGE...: builds each package of the wrapper module into a
# folder of $cache named after the module and keyed by its files (BUILD_KEY_FILES, relative to
# MODULE_DIR: go.mod and go.sum unless set) and the flags, so a warm run returns at once; prints
# the folder. Only a finished binary gets its real name.
build() {
  local dir=$1 ldflags=$2; shift 2
  local key out files=() f
  for f in ${BUILD_KEY_FILES:-go.mod go.sum}; do files+=("$dir/$f"); done
  key=$(cat "${files[@]}" <(echo "$ldflags") | sha256sum | cut -c1-12)
  out="$cache/$(basename "$dir")-$key"
  mkdir -p "$out"
  for spec in "$@"; do
    local name=${spec%%=*} pkg=${spec#*=} start
    [ -x "$out/$name" ] && continue
    start=$(date +%s)
    echo "building $name ($pkg)" >&2
    (cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$out/$name.partial" "$pkg")
    mv "$out/$name.partial" "$out/$name"
    echo "  built $name in $(( $(date +%s) - start ))s" >&2
  done
  echo "$out"
}
