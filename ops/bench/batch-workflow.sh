#!/usr/bin/env bash
# The main job as a user runs it, measured: `aptix batch` of N documents through --url against
# `aptix serve` + one `aptix worker` at their defaults (the fake model at 200 ms), the folder
# indexed first. Prints documents per second, the wall time, the CPU seconds per document of
# every process (serve, worker, fake model, the batch client, RabbitMQ, Redis), the peak
# resident memory of serve and worker, and the reply queues the run left on the broker. The
# baseline beside it: the same documents' turns as one closed loop of the fake model alone
# (N calls at the model's latency, as many at once as the worker holds) — the best the bare
# model can do.
#
#   ops/bench/batch-workflow.sh [documents=5000] [model latency ms=200]
#
# Needs RabbitMQ and Redis (APTIX_AMQP_URL, APTIX_REDIS_URL; the local defaults otherwise) and
# a release build (cargo build --release). Everything runs under a namespace of its own, removed
# afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-5000}
latency=${2:-200}
bin=target/release/aptix
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
export APTIX_AMQP_URL=${APTIX_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}
export APTIX_REDIS_URL=${APTIX_REDIS_URL:-redis://127.0.0.1:6379/}
export APTIX_NAMESPACE="bench-batch-$$"
export RUST_LOG=warn
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  redis-cli --scan --pattern "$APTIX_NAMESPACE:*" | xargs -r -n 500 redis-cli del >/dev/null || true
  rabbitmqctl -q list_queues name 2>/dev/null | grep "^$APTIX_NAMESPACE\." | while read -r q; do
    rabbitmqctl -q delete_queue "$q" >/dev/null 2>&1 || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cpu() { # user+system seconds of a pid
  awk '{ print ($14 + $15) / 100 }' "/proc/$1/stat" 2>/dev/null || echo 0
}
cpu_of() { # summed over processes named $1
  local total=0
  for p in $(pgrep -x "$1" || true); do total=$(echo "$total + $(cpu "$p")" | bc -l); done
  echo "$total"
}
hwm() { awk '/VmHWM/ { print $2 }' "/proc/$1/status"; }

# N documents (the examples, renamed), each a new session as `aptix batch` makes it.
mkdir -p "$work/docs"
i=0
while [ "$i" -lt "$n" ]; do
  for f in examples/ddrs/*.md; do
    [ "$i" -lt "$n" ] || break
    cp "$f" "$work/docs/doc-$i.md"
    i=$((i + 1))
  done
done

model=$(port); api=$(port); wport=$(port)
"$bin" fake-llm --listen "127.0.0.1:$model" --latency-ms "$latency" --stateless 2>"$work/fake.log" & pids+=($!); fake_pid=$!
export APTIX_LLM_BASE_URL="http://127.0.0.1:$model/v1"
"$bin" serve --listen "127.0.0.1:$api" 2>"$work/serve.log" & pids+=($!); serve_pid=$!
RUST_LOG=warn,aptix_worker::worker=info "$bin" worker --listen "127.0.0.1:$wport" 2>"$work/worker.log" & pids+=($!); worker_pid=$!
for _ in $(seq 1 100); do
  "$bin" probe "http://127.0.0.1:$api/readyz" >/dev/null 2>&1 && "$bin" probe "http://127.0.0.1:$wport/readyz" >/dev/null 2>&1 && break
  sleep 0.2
done
concurrency=$(grep -o 'concurrency[=":]*[0-9]*' "$work/worker.log" | head -1 | grep -o '[0-9]*$' || true)

before_rabbit=$(cpu_of beam.smp); before_redis=$(cpu_of redis-server)
before_serve=$(cpu "$serve_pid"); before_worker=$(cpu "$worker_pid"); before_fake=$(cpu "$fake_pid")
start=$(date +%s.%N)
/usr/bin/time -f "%U %S" -o "$work/client.cpu" "$bin" batch "$work/docs" --url "http://127.0.0.1:$api" \
  --index "$work/docs" --out "$work/out" \
  --instruction "Review this design record: list its decisions, open questions and risks." >"$work/batch.out" 2>&1
end=$(date +%s.%N)
wall=$(echo "$end - $start" | bc -l)
per() { echo "scale=3; ($1) * 1000 / $n" | bc -l; }
client=$(awk '{ print $1 + $2 }' "$work/client.cpu")
reply_queues=$(rabbitmqctl -q list_queues name 2>/dev/null | grep -c "^$APTIX_NAMESPACE\.reply\." || true)
completed=$(grep -o '"completed": *[0-9]*' "$work/out/summary.json" | head -1 | grep -o '[0-9]*$' || echo "?")

# The baseline: the bare model, N calls, as many at once as the worker holds.
base=$(python3 - "$model" "$n" "${concurrency:-256}" <<'PY'
import json, sys, time, urllib.request, concurrent.futures
port, n, width = int(sys.argv[1]), int(sys.argv[2]), int(float(sys.argv[3]))
body = json.dumps({"model": "m", "input": "baseline"}).encode()
def call(_):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/responses", data=body, headers={"content-type": "application/json"})
    urllib.request.urlopen(req).read()
start = time.time()
with concurrent.futures.ThreadPoolExecutor(max_workers=min(width, 512)) as pool:
    list(pool.map(call, range(n)))
print(f"{n / (time.time() - start):.1f}")
PY
)
rate=$(echo "scale=1; $n / $wall" | bc -l)
echo "aptix batch: $n documents through --url, serve + 1 worker at defaults (worker concurrency ${concurrency:-?}), model ${latency} ms, indexed first"
echo "  completed $completed of $n in $(printf %.1f "$wall") s: $rate documents/s (bare model, same width, Python client: $base calls/s; ratio $(echo "scale=2; $rate / $base" | bc -l))"
echo "  CPU ms per document: serve $(per "$(cpu "$serve_pid") - $before_serve")  worker $(per "$(cpu "$worker_pid") - $before_worker")  fake model $(per "$(cpu "$fake_pid") - $before_fake")  batch client $(per "$client")  RabbitMQ $(per "$(cpu_of beam.smp) - $before_rabbit")  Redis $(per "$(cpu_of redis-server) - $before_redis")"
echo "  peak resident memory: serve $(( $(hwm "$serve_pid") / 1024 )) MiB, worker $(( $(hwm "$worker_pid") / 1024 )) MiB"
echo "  reply queues left on the broker: $reply_queues"
