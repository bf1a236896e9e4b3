#!/bin/bash
# No-change reruns and full copies of a tree, fastcp beside rsync, alternated round by round.
#
# usage: benches/rerun.sh ROUNDS LOGIN FASTCP TREE WORK
#   ROUNDS  rounds; the first seeds the destinations, so its reruns are full copies
#   LOGIN   the account every tool logs in as (the benchmark sshd takes its key for any)
#   FASTCP  absolute path of the fastcp binary (also the remote's, through --remote-path)
#   TREE    the source tree, e.g. made by `cargo xtask gen tree /dev/shm/inc/tree`
#   WORK    an empty folder for the destinations (about eight copies of TREE)
# with CFG set to the ssh_config that `cargo xtask sshd` prints. Prints one line a round,
# in seconds of wall clock: `ssh true`, rsync's reruns, fastcp's full copies over TCP, and
# fastcp's reruns over TCP and SSH, push and pull.
set -eu
R=$1 U=$2 B=$3 TREE=$4 W=$5
: "${CFG:?set CFG to the ssh_config of the benchmark sshd}"
R_DIR=$W/remote L_DIR=$W/local
mkdir -p "$R_DIR"/{dr-p,dp-t,dp-s} "$L_DIR"/{dr-l,dl-t,dl-s}
chown -R "$U" "$R_DIR"
S="ssh -F $CFG -l $U"
t() {
    local s e
    s=$(date +%s.%N)
    "$@" >/dev/null 2>&1 || echo "FAIL: $*" >&2
    e=$(date +%s.%N)
    printf '%.3f' "$(echo "$e - $s" | bc)"
}
f() { t "$B" -q -r -p -F "$CFG" -o "User=$U" --remote-path "$B" "$@"; }
for r in $(seq "$R"); do
    line="round $r sshtrue=$(t $S fastcp-bench true)"
    line="$line rsync-push=$(t rsync -a -e "$S" "$TREE" "fastcp-bench:$R_DIR/dr-p/")"
    line="$line rsync-pull=$(t rsync -a -e "$S" "fastcp-bench:$TREE" "$L_DIR/dr-l/")"
    line="$line full-push-tcp=$(f --transport tcp "$TREE" "fastcp-bench:$R_DIR/full/")"
    $S fastcp-bench rm -rf "$R_DIR/full"
    line="$line full-pull-tcp=$(f --transport tcp "fastcp-bench:$TREE" "$L_DIR/full/")"
    rm -rf "$L_DIR/full"
    for tr in tcp ssh; do
        line="$line push-$tr=$(f --skip-unchanged --transport $tr "$TREE" "fastcp-bench:$R_DIR/dp-${tr:0:1}/")"
        line="$line pull-$tr=$(f --skip-unchanged --transport $tr "fastcp-bench:$TREE" "$L_DIR/dl-${tr:0:1}/")"
    done
    echo "$line"
done
