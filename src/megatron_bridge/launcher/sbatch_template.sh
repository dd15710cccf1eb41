#!/bin/bash
# Slurm batch script of one megatron-bridge run, written by scripts/performance/launch.py from
# src/megatron_bridge/launcher/sbatch_template.sh (docs/training/multi-node.md, "Slurm", explains every part).
{{SBATCH_LINES}}

set -uo pipefail
RUN_DIR={{RUN_DIR}}
CHECKPOINT_DIR={{CHECKPOINT_DIR}}
TRAIN_ITERS={{TRAIN_ITERS}}
MAX_RETRIES={{MAX_RETRIES}}
REQUEUES=${SLURM_RESTART_COUNT:-0}  # Slurm ran this job again after a node failure (#SBATCH --requeue)
RETRIES_USED=$(( ${MB_SLURM_RETRIES_USED:-0} + REQUEUES ))
NODE_TIMEOUT={{NODE_TIMEOUT}}
IDLE_STOPS=${MB_SLURM_IDLE_STOPS:-0}
MASTER_ADDR={{MASTER_ADDR}}
STOP_FILE="$RUN_DIR/slurm-$SLURM_JOB_ID.stop"
export MB_HEARTBEATS="$RUN_DIR/.heartbeats/$SLURM_JOB_ID"  # each node's launcher writes node<N> there every 5 s
{{EXPORTS}}
say() { echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) [slurm job $SLURM_JOB_ID] $*"; }

# Stop signals (the pre-time-limit signal, Slurm's --signal=B:..., and `scancel --batch --signal=...`) reach this
# shell: remembered in $STOP_FILE, sent on to every process of the training step (again every 5 s: a launcher still
# starting up misses one), or, before the step starts, the job ends at once and the next one resumes. A signal sent
# to the step itself (`scancel --signal=USR1 JOB`) reaches the launchers and workers directly; the launchers record it
# in $STOP_FILE too.
STOP_SIG=""
SRUN_PID=""
on_stop() {
    [[ -n "$STOP_SIG" ]] && return
    STOP_SIG=$1
    echo "SIG$1" >> "$STOP_FILE"
    say "got SIG$1: the workers save a checkpoint at the next step boundary and stop; a new job resumes"
    [[ -n "$SRUN_PID" ]] && forward_stop
}
forward_stop() {  # until every node's launcher recorded it ("SIGTERM node 1" lines)
    ( while kill -0 "$SRUN_PID" 2>/dev/null && (( $(grep -c ' node ' "$STOP_FILE" 2>/dev/null) < {{NODES}} )); do
          scancel --signal="$STOP_SIG" "$SLURM_JOB_ID" >/dev/null 2>&1
          sleep 5
      done ) &
}
for sig in {{STOP_SIGNALS}}; do trap "on_stop $sig" "$sig"; done

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
    if [[ -n "$holder" && "$holder" != "$SLURM_JOB_ID" ]] && cut -d' ' -f1 "$RUN_DIR/{{JOBS_FILE}}" 2>/dev/null | grep -qx "$holder"; then
        rm -f "$lock" && say "removed the checkpoint lock of job $holder, which has ended"
    fi
}

watch_nodes() {  # a node whose launcher wrote no heartbeat for NODE_TIMEOUT s (by this shell's clock) and did not
    # end (its last heartbeat then says "ended CODE"): stop the step
    local -A last seen
    local n beat now
    while kill -0 "$SRUN_PID" 2>/dev/null; do
        sleep 5
        now=$SECONDS
        for ((n = 0; n < {{NODES}}; n++)); do
            beat=$(cat "$MB_HEARTBEATS/node$n" 2>/dev/null) || continue  # not started yet: the rendezvous timeout
            [[ "$beat" == ended* ]] && continue  # its launcher ended (its exit code reaches srun): not silent
            if [[ "$beat" != "${last[$n]:-}" ]]; then
                last[$n]=$beat
                seen[$n]=$now
            elif (( now - seen[$n] > NODE_TIMEOUT )); then
                echo "node $n" > "$MB_HEARTBEATS/silent"
                say "node $n stopped answering: no heartbeat for $((now - seen[$n])) s (--node_timeout $NODE_TIMEOUT);" \
                    "stopping the job step"
                scancel --signal=KILL "$SLURM_JOB_ID.0" >/dev/null 2>&1 &  # slurmctld may wait for the lost node
                sleep 5
                kill -KILL "$SRUN_PID" 2>/dev/null  # srun may wait for the lost node's answer too
                return
            fi
        done
    done
}

if (( REQUEUES > 0 )); then
    HANDED_TO=$(sed -n "s/^\([0-9]*\) after $SLURM_JOB_ID\$/\1/p" "$RUN_DIR/{{JOBS_FILE}}" 2>/dev/null | head -n 1)
    if [[ -n "$HANDED_TO" ]]; then
        say "requeued by Slurm, but this job already handed the run over to job $HANDED_TO: nothing to do"
        exit 0
    fi
    rm -f "$STOP_FILE"
    say "requeued by Slurm after a node failure (requeue $REQUEUES, counted as a retry)"
    if (( RETRIES_USED > MAX_RETRIES )); then
        say "failed: a node failed with all $MAX_RETRIES retries used"
        exit 1
    fi
fi
rm -rf "$MB_HEARTBEATS"

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

# One task per node: torch's launcher with this node's rank (node 0 holds global rank 0). A stop signal (TERM, USR1,
# USR2, INT) sent to the step reaches every process of it: the launcher (ignoring it until its own handler is in
# place) records it and sends it to workers started later; the workers save a checkpoint at one agreed step and exit.
RC=0
if [[ -z "$STOP_SIG" ]]; then
    srun --nodes={{NODES}} --ntasks-per-node=1 --kill-on-bad-exit=1 {{SRUN_ARGS}} \
        bash -c 'trap "" {{STOP_SIGNALS}}; exec "$0" -m megatron_bridge.launcher.torchrun --node_rank="$SLURM_NODEID" \
            --heartbeat_file="$MB_HEARTBEATS/node$SLURM_NODEID" "$@"' \
        {{PYTHON}} --stop_signals={{STOP_SIGNALS_CSV}} --stop_file="$STOP_FILE" \
        --nnodes={{NODES}} --nproc_per_node={{NPROC_PER_NODE}} --max_restarts={{MAX_RESTARTS}} \
        --signals_to_handle=SIGHUP,SIGQUIT \
        --master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" \
        {{COMMAND}} &
    SRUN_PID=$!
    watch_nodes &
    [[ -n "$STOP_SIG" ]] && forward_stop  # a signal between the check above and srun's start
    while kill -0 "$SRUN_PID" 2>/dev/null; do
        wait "$SRUN_PID"  # returns early when a trapped signal arrives
    done
    wait "$SRUN_PID"
    RC=$?
else
    say "the stop signal came before the training step started"
fi
STEP_AFTER=$(checkpoint_step)

STOPPED_BY=$(head -n 1 "$STOP_FILE" 2>/dev/null | cut -d' ' -f1)
STATE=$(scontrol -o show job "$SLURM_JOB_ID" 2>/dev/null | tr ' ' '\n' | sed -n 's/^JobState=//p')
NEXT_IDLE=0

if (( (RC == 0 || RC == {{EXIT_PREEMPTED}}) && STEP_AFTER >= TRAIN_ITERS )); then
    say "finished: checkpoint step $STEP_AFTER of $TRAIN_ITERS"
    exit 0
fi
if [[ "$STATE" == CANCELLED* ]]; then
    say "cancelled (scancel) at checkpoint step $STEP_AFTER of $TRAIN_ITERS (exit $RC): not resubmitted; the same" \
        "launch.py command with the same --output_dir resumes from that checkpoint"
    exit "$(( RC == 0 ? 1 : RC ))"
fi
if (( RC == {{EXIT_USER_ERROR}} )); then
    say "stopped by an error a retry would repeat (exit $RC): not retried"
    exit "$RC"
fi
if [[ -n "$STOPPED_BY" ]] && (( RC == 0 || RC == {{EXIT_PREEMPTED}} || ({{STOP_EXIT_CODES}}) )); then
    if (( STEP_AFTER > STEP_BEFORE )); then
        REASON="stopped by $STOPPED_BY at step $STEP_AFTER of $TRAIN_ITERS (exit $RC), checkpoint saved"
    else
        REASON="stopped by $STOPPED_BY before a step of this job (exit $RC): nothing new to save"
        NEXT_IDLE=$((IDLE_STOPS + 1))
        if (( NEXT_IDLE > {{MAX_IDLE_STOPS}} )); then
            say "$REASON, and $NEXT_IDLE jobs in a row stopped so: not resubmitted (the signal comes before" \
                "training starts; raise -t or lower --preempt_time)"
            exit 1
        fi
    fi
    NEXT_RETRIES=$RETRIES_USED
elif (( (RC == 0 || RC == {{EXIT_PREEMPTED}}) && STEP_AFTER > STEP_BEFORE )); then
    REASON="stopped at step $STEP_AFTER of $TRAIN_ITERS (exit $RC) with a checkpoint saved"
    NEXT_RETRIES=$RETRIES_USED
elif (( RETRIES_USED < MAX_RETRIES )); then
    LOST=$(sed 's/^/, lost /' "$MB_HEARTBEATS/silent" 2>/dev/null)
    REASON="failed (exit $RC$LOST): retry $((RETRIES_USED + 1)) of $MAX_RETRIES"
    NEXT_RETRIES=$((RETRIES_USED + 1))
else
    say "failed (exit $RC) with all $MAX_RETRIES retries used"
    exit $(( RC == 0 ? 1 : RC ))
fi
# The next job of this run starts when this one has ended and resumes from the last checkpoint.
NEXT=$(sbatch --parsable --dependency="afterany:$SLURM_JOB_ID" \
    --export="ALL,MB_SLURM_RETRIES_USED=$NEXT_RETRIES,MB_SLURM_IDLE_STOPS=$NEXT_IDLE" "$RUN_DIR/{{SCRIPT_NAME}}") || { say "$REASON; resubmitting failed"; exit 1; }
NEXT=${NEXT%%;*}
echo "$NEXT after $SLURM_JOB_ID" >> "$RUN_DIR/{{JOBS_FILE}}"  # followers follow this job's own successor
say "$REASON; job $NEXT resumes from checkpoint step $STEP_AFTER"
exit "$RC"
