#!/usr/bin/env bash
# rllib-ext train on a two-node Ray cluster, both nodes on this machine; then the worker node is lost.
#
#   examples/multinode_two_nodes.sh            (about 4 minutes on 2 CPU cores)
#
# 1. `ray start --head` and a second `ray start --address` node, each with 2 CPUs and one
#    `learner_slot` custom resource; every learner asks for one slot, so the 2 learners land on
#    different nodes (env runners go wherever CPUs are free).
# 2. `rllib-ext train --address ...` with 2 env runners, 2 learners and PowerSGD gradients: 2
#    iterations, a checkpoint each; the learners' nodes are read off the watchdog's log line.
# 3. `--resume` for more iterations, and the worker node's raylet killed (SIGKILL) mid-run: the
#    run ends with one error line naming the last complete checkpoint.
# 4. `--resume` while the worker node is gone: one error line (the cluster lacks a learner_slot).
# 5. The worker node restarted, `--resume` once more: training continues from the checkpoint.
#
# Only the Ray processes this script starts are stopped (by process group): never `ray stop`,
# which ends every Ray on the machine. On a real cluster run step 1's `ray start` lines on
# each machine with the head's address, and step 2's command anywhere that reaches the head.
#
# Environment: PORT (default 6390), WORK (default: a new /tmp/rxmn.XXXXXX), VENV_BIN (default:
# the directory of the `rllib-ext` on PATH), RAY_AUTH_MODE (default token, with a new token in
# $WORK/auth_token unless RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH is set; or disabled).
set -euo pipefail

PORT=${PORT:-6390}
VENV_BIN=${VENV_BIN:-$(dirname "$(command -v rllib-ext)")}
RAY="$VENV_BIN/ray"
RLLIB_EXT="$VENV_BIN/rllib-ext"
WORK=${WORK:-$(mktemp -d /tmp/rxmn.XXXXXX)} # short: Ray's unix socket paths
ADDRESS="127.0.0.1:$PORT"
RUN_DIR="$WORK/run"
SLOT='{"learner_slot": 1}'
TRAIN=(
    "$RLLIB_EXT" train --address "$ADDRESS" --no-progress
    --num-env-runners 2 --num-envs-per-env-runner 1
    --num-learners 2 --custom-resources-per-learner "$SLOT"
    --grad-compression powersgd
    --training '{"train_batch_size_per_learner": 64, "minibatch_size": 32, "num_epochs": 1}'
    --stop-reward none --checkpoint-freq 1
)
mkdir -p "$WORK"
HEAD_PID="" WORKER_PID=""

# Token authentication, set explicitly: Ray >= 2.59 turns it on for every cluster a plain
# `ray.init()` starts and writes ~/.ray/auth_token, after which `ray start --head` asks for the
# token. Every node and every client gets the same RAY_AUTH_MODE and token; on a real cluster,
# copy the token file to each machine (or set RAY_AUTH_MODE=disabled on all of them).
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
if [[ $RAY_AUTH_MODE == token && -z ${RAY_AUTH_TOKEN:-} && -z ${RAY_AUTH_TOKEN_PATH:-} ]]; then
    export RAY_AUTH_TOKEN_PATH="$WORK/auth_token"
    "$VENV_BIN/python" -c "import secrets; print(secrets.token_hex(32), end='')" >"$RAY_AUTH_TOKEN_PATH"
fi

say() { printf '\n=== %s\n' "$*"; }

stop_group() { # stop_group PID: the `ray start --block` process group PID and what it started
    local pid=$1
    [[ -n $pid ]] || return 0
    kill -TERM -- "-$pid" 2>/dev/null || return 0
    for _ in $(seq 20); do
        kill -0 -- "-$pid" 2>/dev/null || return 0
        sleep 0.5
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
}

cleanup() {
    stop_group "$WORKER_PID"
    stop_group "$HEAD_PID"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_worker() { # each node: 2 CPUs and one learner slot; --block keeps it in our process group
    setsid "$RAY" start --address="$ADDRESS" --num-cpus=2 --resources="$SLOT" \
        --disable-usage-stats --block >>"$WORK/worker.log" 2>&1 &
    WORKER_PID=$!
}

alive_nodes() { # as the GCS sees them (`ray status` keeps listing a lost node for minutes)
    "$VENV_BIN/python" -c "import ray
ray.init(address='$ADDRESS', logging_level='ERROR', log_to_driver=False)
print(sum(node['Alive'] for node in ray.nodes()))" 2>/dev/null || echo 0
}

wait_nodes() { # wait_nodes N: until the cluster has N alive nodes
    for _ in $(seq 60); do
        [[ $(alive_nodes) == "$1" ]] && return 0
        sleep 1
    done
    echo "the cluster did not reach $1 alive nodes" >&2
    return 1
}

say "1. a two-node Ray cluster at $ADDRESS (temp dir $WORK/ray)"
setsid "$RAY" start --head --port="$PORT" --num-cpus=2 --resources="$SLOT" \
    --temp-dir="$WORK/ray" --include-dashboard=false --disable-usage-stats --block \
    >"$WORK/head.log" 2>&1 &
HEAD_PID=$!
wait_nodes 1
start_worker
wait_nodes 2
"$RAY" status --address="$ADDRESS" | sed -n '/Active:/,/Pending:/p'

say "2. train 2 iterations across both nodes"
"${TRAIN[@]}" --run-dir "$RUN_DIR" --seed 0 --stop-timesteps 256 2>&1 | tee "$WORK/train.log"
watch_line=$(grep 'learner watchdog' "$WORK/train.log")
nodes=$(grep -o ' on [0-9a-f]\{8\}' <<<"$watch_line" | sort -u | wc -l)
echo "learners on $nodes different nodes: ${watch_line#*(}"
[[ $nodes == 2 ]] || { echo "FAIL: both learners on one node" >&2; exit 1; }
ls "$RUN_DIR/checkpoints"

say "3. resume for more iterations; SIGKILL the worker node's raylet after the first one"
rows=$(wc -l <"$RUN_DIR/result.json")
"${TRAIN[@]}" --resume "$RUN_DIR" --stop-timesteps 100000 >"$WORK/killed.log" 2>&1 &
train_pid=$!
until (($(wc -l <"$RUN_DIR/result.json") > rows)); do
    kill -0 "$train_pid" || { cat "$WORK/killed.log"; exit 1; }
    sleep 0.5
done
raylet=$(pgrep -g "$WORKER_PID" -x raylet)
echo "kill -9 $raylet (the worker node's raylet)"
kill -KILL "$raylet"
status=0
wait "$train_pid" || status=$?
grep '^rllib-ext: error' "$WORK/killed.log" || tail -n 20 "$WORK/killed.log"
echo "exit status $status, Python tracebacks: $(grep -c '^Traceback' "$WORK/killed.log")"

say "4. --resume while the worker node is gone"
stop_group "$WORKER_PID"
WORKER_PID=""
wait_nodes 1
status=0
"${TRAIN[@]}" --resume "$RUN_DIR" --stop-timesteps 100000 >"$WORK/gone.log" 2>&1 || status=$?
grep -v '^\s*$' "$WORK/gone.log" | tail -n 2
echo "exit status $status"

say "5. restart the worker node, --resume: training continues"
start_worker
wait_nodes 2
"${TRAIN[@]}" --resume "$RUN_DIR" --stop-timesteps 640 2>&1 | tee "$WORK/restarted.log"
echo "checkpoints: $(ls "$RUN_DIR/checkpoints" | tr '\n' ' ')"

