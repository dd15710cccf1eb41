#!/bin/bash
# Slurm batch script of one megatron-bridge run, written by scripts/performance/launch.py from
# src/megatron_bridge/launcher/sbatch_template.sh (docs/training/multi-node.md, "Slurm", explains every part).
{{SBATCH_LINES}}

set -uo pipefail
RUN_DIR={{RUN_DIR}}
CHECKPOINT_DIR={{CHECKPOINT_DIR}}
TRAIN_ITERS={{TRAIN_ITERS}}
MAX_RETRIES={{MAX_RETRIES}}
RETRIES_USED=${MB_SLURM_RETRIES_USED:-0}
MASTER_ADDR={{MASTER_ADDR}}
{{EXPORTS}}
say() { echo "[slurm job $SLURM_JOB_ID] $*"; }

checkpoint_step() {  # the step of the last complete checkpoint of this run (0: none yet)
    local step
    step=$(cat "$CHECKPOINT_DIR/latest_checkpointed_iteration.txt" 2>/dev/null) || step=0
    [[ "$step" =~ ^[0-9]+$ ]] || step=0
    echo "$step"
}

clear_stale_lock() {  # a lock an earlier job of this run left behind (its rank 0 killed, maybe on another host)
    local lock="$CHECKPOINT_DIR/run.lock" holder
    [[ -f "$lock" ]] || return 0
    holder=$(grep -o '"slurm_job_id": *"[0-9]*"' "$lock" | sed 's/.*"\([0-9]*\)"$/\1/')
    if [[ -n "$holder" && "$holder" != "$SLURM_JOB_ID" ]] && grep -qx "$holder" "$RUN_DIR/{{JOBS_FILE}}" 2>/dev/null; then
        rm -f "$lock" && say "removed the checkpoint lock of job $holder, which has ended"
    fi
}

# Node 0's address: the first node's NodeAddr from Slurm (node names need not resolve), unless given (--master_addr).
if [[ -z "$MASTER_ADDR" ]]; then
    FIRST_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
    MASTER_ADDR=$(scontrol -o show node "$FIRST_NODE" | tr ' ' '\n' | sed -n 's/^NodeAddr=//p')
    MASTER_ADDR=${MASTER_ADDR:-$FIRST_NODE}
fi
# The rendezvous port: this job's own (from the job id, so two jobs on one host differ; below Linux's ephemeral
# ports, 32768+, which outgoing connections take), skipping ports in use. This shell runs on the first node, where
# node 0's store listens.
MASTER_PORT=$((20000 + SLURM_JOB_ID % 12000))
while timeout 2 bash -c "exec 3<>/dev/tcp/$MASTER_ADDR/$MASTER_PORT" 2>/dev/null; do
    MASTER_PORT=$((MASTER_PORT >= 31999 ? 20000 : MASTER_PORT + 1))
done
export MASTER_ADDR MASTER_PORT

clear_stale_lock  # the jobs of this run run one after another (afterany): an earlier one's lock is stale
STEP_BEFORE=$(checkpoint_step)
say "$SLURM_JOB_NUM_NODES node(s) x {{NPROC_PER_NODE}} process(es), node 0 at $MASTER_ADDR:$MASTER_PORT," \
    "checkpoint step $STEP_BEFORE of $TRAIN_ITERS, retries used $RETRIES_USED of $MAX_RETRIES"

# One task per node: torch's launcher with this node's rank (node 0 holds global rank 0). Slurm sends the
# pre-time-limit signal ({{SIGNAL}}) to every process of the step: the workers save a checkpoint and exit on it, the
# launcher survives it (it starts with the signal ignored, and torch's agent does not turn SIGTERM into a stop).
srun --nodes={{NODES}} --ntasks-per-node=1 --kill-on-bad-exit=1 {{SRUN_ARGS}} \
    bash -c 'trap "" {{SIGNAL}}; exec "$0" -m megatron_bridge.launcher.torchrun --node_rank="$SLURM_NODEID" "$@"' \
    {{PYTHON}} --nnodes={{NODES}} --nproc_per_node={{NPROC_PER_NODE}} --max_restarts={{MAX_RESTARTS}} \
    --signals_to_handle=SIGINT,SIGHUP,SIGQUIT \
    --master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" \
    {{COMMAND}}
RC=$?
STEP_AFTER=$(checkpoint_step)

if (( (RC == 0 || RC == {{EXIT_PREEMPTED}}) && STEP_AFTER >= TRAIN_ITERS )); then
    say "finished: checkpoint step $STEP_AFTER of $TRAIN_ITERS"
    exit 0
fi
if (( RC == {{EXIT_USER_ERROR}} )); then
    say "stopped by an error a retry would repeat (exit $RC): not retried"
    exit "$RC"
fi
if (( (RC == 0 || RC == {{EXIT_PREEMPTED}}) && STEP_AFTER > STEP_BEFORE )); then
    REASON="stopped at step $STEP_AFTER of $TRAIN_ITERS (exit $RC, the pre-time-limit signal)"
    NEXT_RETRIES=$RETRIES_USED
elif (( RETRIES_USED < MAX_RETRIES )); then
    REASON="failed (exit $RC): retry $((RETRIES_USED + 1)) of $MAX_RETRIES"
    NEXT_RETRIES=$((RETRIES_USED + 1))
else
    say "failed (exit $RC) with all $MAX_RETRIES retries used"
    exit $(( RC == 0 ? 1 : RC ))
fi
# The next job of this run starts when this one has ended and resumes from the last checkpoint.
NEXT=$(sbatch --parsable --dependency="afterany:$SLURM_JOB_ID" --export="ALL,MB_SLURM_RETRIES_USED=$NEXT_RETRIES" \
    "$RUN_DIR/{{SCRIPT_NAME}}") || { say "$REASON; resubmitting failed"; exit 1; }
NEXT=${NEXT%%;*}
echo "$NEXT" >> "$RUN_DIR/{{JOBS_FILE}}"
say "$REASON; job $NEXT resumes from checkpoint step $STEP_AFTER"
exit "$RC"
