// The local pause program (hack/build-node.sh): the standard library only.
module trainingrun.local/hack/pause

go 1.24.0
