#!/bin/bash
# One huge copy as a Slurm job array: `sbatch --array=0-7 slurm-array.sh` runs 8 tasks, each
# copying its share (--shard I/N, I = the task's id, N = the array's size).
#SBATCH --job-name=fastcp-shards
#SBATCH --array=0-7
#SBATCH --cpus-per-task=2
#SBATCH --time=24:00:00
set -euo pipefail
SRC=${SRC:-/data/src}
DEST=${DEST:-backup@nas.example:/backup/}
exec fastcp -r -p --shard "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT" "$SRC" "$DEST"
