#!/bin/bash
# Tree copies, fastcp beside `tar | ssh` and its own local copy, alternated round by round.
#
# usage: benches/tree.sh ROUNDS FASTCP TREE WORK
#   ROUNDS  rounds
#   FASTCP  absolute path of the fastcp binary (also the remote's, through --remote-path)
#   TREE    the source tree, e.g. made by `cargo xtask gen tree /dev/shm/inc/tree`
#   WORK    a folder for the destinations (each is removed after its run)
# with CFG set to the ssh_config that `cargo xtask sshd` prints, and LOGIN, if set, the
# account every remote command logs in as (its login shell's startup files run before each
# tool; the default is the ssh_config's User). Prints one line a round,
# in seconds of wall clock: fastcp's local copy, TCP push and pull, SSH push and pull, then
# `tar -cf - | ssh host tar -xf -` both ways.
set -eu
R=$1 B=$2 TREE=$3 W=$4
: "${CFG:?set CFG to the ssh_config of the benchmark sshd}"
S="ssh -F $CFG" U=()
if [ -n "${LOGIN:-}" ]; then
    S="$S -l $LOGIN" U=(-o "User=$LOGIN")
fi
PARENT=$(dirname "$TREE") NAME=$(basename "$TREE")
# A folder the login can write in.
mk() { mkdir -p "$1" && { [ -z "${LOGIN:-}" ] || chown "$LOGIN" "$1"; }; }
mk "$W"
t() {
    local s e
    s=$(date +%s.%N)
    "$@" >/dev/null 2>&1 || echo "FAIL: $*" >&2
    e=$(date +%s.%N)
    printf '%.3f' "$(echo "$e - $s" | bc)"
}
f() { t "$B" -q -r -F "$CFG" ${U[@]+"${U[@]}"} --remote-path "$B" "$@"; }
for r in $(seq "$R"); do
    line="round $r local=$(t "$B" -q -r "$TREE" "$W/loc")"
    rm -rf "$W/loc"
    for tr in tcp ssh; do
        line="$line $tr-push=$(f --transport $tr "$TREE" "fastcp-bench:$W/push")"
        rm -rf "$W/push"
        line="$line $tr-pull=$(f --transport $tr "fastcp-bench:$TREE" "$W/pull")"
        rm -rf "$W/pull"
    done
    mk "$W/tar"
    line="$line tar-push=$(t bash -c "tar -C '$PARENT' -cf - '$NAME' | $S fastcp-bench tar -C '$W/tar' -xf -")"
    rm -rf "$W/tar" && mk "$W/tar"
    line="$line tar-pull=$(t bash -c "$S fastcp-bench tar -C '$PARENT' -cf - '$NAME' | tar -C '$W/tar' -xf -")"
    rm -rf "$W/tar"
    echo "$line"
done
