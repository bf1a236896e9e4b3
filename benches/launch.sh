#!/bin/bash
# What a copy's start costs when the remote runs a fastcp that self-deploy cached there:
# a two-byte push and a no-change rerun of a tree, by two builds (each through its own
# cache: the first copy of each uploads it, untimed), beside a copy that names the remote
# program with --remote-path, alternated round by round.
#
# usage: benches/launch.sh ROUNDS LOGIN OLD NEW TREE WORK
#   ROUNDS    timed rounds
#   LOGIN     the account every copy logs in as; its remote PATH must hold no fastcp
#   OLD, NEW  absolute paths of two fastcp binaries (NEW also runs with --remote-path NEW)
#   TREE      the tree for the reruns, e.g. made by `cargo xtask gen tree /dev/shm/inc/tree`
#   WORK      an empty folder the login can write to, for the destinations
# with CFG set to the ssh_config that `cargo xtask sshd` prints. Prints one line a round, in
# seconds of wall clock.
set -eu
R=$1 U=$2 OLD=$3 NEW=$4 TREE=$5 W=$6
: "${CFG:?set CFG to the ssh_config of the benchmark sshd}"
t() {
    local s e
    s=$(date +%s.%N)
    "$@" >/dev/null 2>&1 || echo "FAIL: $*" >&2
    e=$(date +%s.%N)
    printf '%.3f' "$(echo "$e - $s" | bc)"
}
f() {
    local b=$1
    shift
    "$b" -q -F "$CFG" -o "User=$U" "$@"
}
printf 'hi' > "$W/two"
chmod 644 "$W/two"
mkdir -p "$W/remote"
chown "$U" "$W/remote"
# Seed: each build uploads itself, and the tree is copied once; then a second later each
# cached binary is started once more, which stamps it (see src/deploy.rs).
for B in "$OLD" "$NEW"; do f "$B" "$W/two" "fastcp-bench:$W/remote/two"; done
f "$NEW" -r -p "$TREE" "fastcp-bench:$W/remote/tree"
sleep 1.1
for B in "$OLD" "$NEW"; do f "$B" "$W/two" "fastcp-bench:$W/remote/two"; done
rerun() { f "$@" -r -p --skip-unchanged "$TREE/." "fastcp-bench:$W/remote/tree"; }
for r in $(seq "$R"); do
    line="round $r"
    line="$line small-old=$(t f "$OLD" "$W/two" "fastcp-bench:$W/remote/two")"
    line="$line small-new=$(t f "$NEW" "$W/two" "fastcp-bench:$W/remote/two")"
    line="$line small-remote-path=$(t f "$NEW" --remote-path "$NEW" "$W/two" "fastcp-bench:$W/remote/two")"
    line="$line rerun-old=$(t rerun "$OLD")"
    line="$line rerun-new=$(t rerun "$NEW")"
    line="$line rerun-remote-path=$(t rerun "$NEW" --remote-path "$NEW")"
    echo "$line"
done
