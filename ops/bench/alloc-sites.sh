#!/usr/bin/env bash
# Where a turn's allocations come from: one process (serve or worker) under valgrind's DHAT
# while N turns of one session run through the synchronous endpoint, then the program points
# that allocated most, per turn, by bytes and by blocks. A debug build with the system's
# allocator (the `system-allocator` feature: DHAT sees only malloc, not mimalloc) keeps the
# symbols; its counts match the product's within a few per cent (the bench's counting
# allocator gives the release figures: docs/benchmarks.md, "Allocations per turn"). Startup's
# allocations are in the totals too, once: read the sites that grow with N.
#
#   ops/bench/alloc-sites.sh worker|serve [turns=400] [sites=15]
#   ops/bench/alloc-sites.sh worker|serve held [turns=200] [sites=15]
#   ops/bench/alloc-sites.sh worker|serve waiting [turns=500] [sites=30]
#
# With `held`, the turns go at once, each in a new session, against a model that answers after
# 20 s, and the sites are those that held most at the process's heap peak (DHAT's t-gmax), per
# turn in flight. Under valgrind's slowness that peak is often the answers' handling (many
# turns settling together), not the wait: `waiting` runs the process under massif instead,
# the turns against a model that answers after 90 s, and takes a snapshot of the heap (vgdb's
# `detailed_snapshot`) a minute after they went: what a turn waiting on its model keeps, by
# site, per turn (a process's fixed buffers, such as lapin's two 4 MiB frame buffers, appear
# divided by the turns too: leave them out).
#
# APTIX_BIN names a binary to profile instead of the debug build (say a release build with line
# tables and the system's allocator: `CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
# CARGO_PROFILE_RELEASE_STRIP=false cargo build --release --features system-allocator`), whose
# futures are laid out as the product's are. APTIX_LLM_HTTP=http2 puts the model calls on HTTP/2.
#
# Needs RabbitMQ and Redis (APTIX_AMQP_URL, APTIX_REDIS_URL; the local defaults otherwise),
# valgrind and python3. Runs under a namespace of its own; leaves dhat.<process>.json in
# target/alloc-sites/.
set -euo pipefail
cd "$(dirname "$0")/../.."
which=${1:?"worker or serve"}
shift
held=0
waiting=0
if [ "${1:-}" = held ]; then held=1; shift; fi
if [ "${1:-}" = waiting ]; then waiting=1; shift; fi
turns=${1:-$([ $held = 1 ] && echo 200 || { [ $waiting = 1 ] && echo 500; } || echo 400)}
sites=${2:-$([ $waiting = 1 ] && echo 30 || echo 15)}
latency=$([ $held = 1 ] && echo 20000 || { [ $waiting = 1 ] && echo 90000; } || echo 0)
case "$which" in worker|serve) ;; *) echo "worker or serve, not $which" >&2; exit 2 ;; esac
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 2; }

if [ -n "${APTIX_BIN:-}" ]; then
  bin=$(realpath "$APTIX_BIN")
else
  cargo build --quiet --features system-allocator
  bin=$PWD/target/debug/aptix
fi
out=$PWD/target/alloc-sites
mkdir -p "$out"
rm -f "$out/dhat.$which.json"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
model_port=$(port)
api_port=$(port)
export APTIX_NAMESPACE="alloc-sites-$$" \
  APTIX_AMQP_URL="${APTIX_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}" \
  APTIX_REDIS_URL="${APTIX_REDIS_URL:-redis://127.0.0.1:6379/}" \
  APTIX_LLM_BASE_URL="http://127.0.0.1:$model_port/v1" APTIX_MODEL=bench-model RUST_LOG=warn
unset OPENAI_API_KEY

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
"$bin" fake-llm --listen "127.0.0.1:$model_port" --latency-ms "$latency" > "$out/fake-llm.log" 2>&1 &
pids+=($!)
start() { # start <process> <args…>: under DHAT (massif when waiting) when it is the one measured
  local name=$1; shift
  if [ "$name" = "$which" ] && [ $waiting = 1 ]; then
    valgrind --tool=massif --threshold=0.02 --depth=40 --vgdb=yes \
      --massif-out-file="$out/massif.$which.out" "$bin" "$@" > "$out/$name.log" 2>&1 &
    measured=$!
  elif [ "$name" = "$which" ]; then
    valgrind --tool=dhat --dhat-out-file="$out/dhat.$which.json" "$bin" "$@" > "$out/$name.log" 2>&1 &
  else
    "$bin" "$@" > "$out/$name.log" 2>&1 &
  fi
  pids+=($!)
}
start serve serve --listen "127.0.0.1:$api_port"
start worker worker
for _ in $(seq 1 240); do curl -fsS "127.0.0.1:$api_port/readyz" >/dev/null 2>&1 && break; sleep 0.5; done
if [ $waiting = 1 ]; then
  # No first turn (it would wait 90 s): time for the worker to consume, then the turns, and
  # the snapshot once they all wait on the model.
  sleep 25
  clients=()
  for i in $(seq 1 "$turns"); do
    curl -s -m 200 -o /dev/null -H 'content-type: application/json' \
      -d "{\"sessionId\":\"waiting-$i\",\"turnId\":\"t\",\"instruction\":\"summarise the design\"}" \
      "127.0.0.1:$api_port/api/ai/agent/execute" &
    clients+=($!)
  done
  sleep 60
  rm -f "$out/snapshot.$which.out"
  vgdb --pid="$measured" detailed_snapshot "$out/snapshot.$which.out" > /dev/null
  kill "${clients[@]}" "${pids[@]}" 2>/dev/null || true
  redis-cli -u "$APTIX_REDIS_URL" --scan --pattern "$APTIX_NAMESPACE:*" | xargs -r redis-cli -u "$APTIX_REDIS_URL" del > /dev/null || true
  python3 - "$out/snapshot.$which.out" "$turns" "$sites" <<'EOF'
import re, sys
path, turns, sites = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lines = open(path).read().split("\n")
heap = next(int(l.split("=")[1]) for l in lines if l.startswith("mem_heap_B="))
start = next(i for i, l in enumerate(lines) if l.startswith("heap_tree=")) + 1
# Frames of the allocator, the standard library and massif's own say little about who asked.
plumbing = re.compile(r"library/|__rust|__rdl|GlobalAlloc|malloc|calloc|realloc|raw_vec|RawVec|alloc\.rs"
                      r"|hashbrown|bytes_mut|main\.rs:33|\?\?\?|heap allocation functions|below massif")
held, stack = {}, []
for line in lines[start:]:
    m = re.match(r"^( *)n(\d+): (\d+) (.*)$", line)
    if not m:
        continue
    stack = stack[:len(m.group(1))] + [re.sub(r"^0x[0-9A-F]+: ", "", m.group(4))]
    if m.group(2) == "0":
        asked = [n for n in stack if not plumbing.search(n)][:3] or stack[-2:]
        site = " <- ".join(n[:100] for n in asked)
        held[site] = held.get(site, 0) + int(m.group(3))
print(f"{path}: {heap / turns / 1024:.1f} KiB of heap per turn waiting on its model ({turns} at once; "
      f"the process's fixed buffers included)\n\nthe {sites} sites that held most, per turn:")
for site, b in sorted(held.items(), key=lambda kv: -kv[1])[:sites]:
    print(f"  {b / turns:9.0f} B  {site}")
EOF
  exit 0
fi
# A first turn, answered once the worker consumes (under valgrind it starts slowly).
for attempt in $(seq 1 60); do
  curl -fsS -m 30 -H 'content-type: application/json' \
    -d '{"sessionId":"s","turnId":"warm","instruction":"summarise the design"}' \
    "127.0.0.1:$api_port/api/ai/agent/execute" > /dev/null && break
  sleep 1
done
turn() { # turn <session> <turn id>
  curl -fsS -m 300 -H 'content-type: application/json' \
    -d "{\"sessionId\":\"$1\",\"turnId\":\"$2\",\"instruction\":\"summarise the design\"}" \
    "127.0.0.1:$api_port/api/ai/agent/execute" > /dev/null || echo "turn $2 of session $1 failed" >&2
}
if [ $held = 1 ]; then
  clients=()
  for i in $(seq 1 "$turns"); do turn "held-$i" t & clients+=($!); done
  wait "${clients[@]}"
else
  for i in $(seq 1 "$turns"); do turn s "t$i"; done
fi
# SIGTERM: the process drains and exits, and DHAT writes its profile.
kill -TERM "${pids[@]}"
for _ in $(seq 1 120); do [ -s "$out/dhat.$which.json" ] && ! pgrep -f "dhat-out-file=$out" >/dev/null && break; sleep 0.5; done
redis-cli -u "$APTIX_REDIS_URL" --scan --pattern "$APTIX_NAMESPACE:*" | xargs -r redis-cli -u "$APTIX_REDIS_URL" del > /dev/null || true

python3 - "$out/dhat.$which.json" "$turns" "$sites" "$held" <<'EOF'
import json, re, sys
path, turns, sites, held = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
d = json.load(open(path))
frames = d["ftbl"]
# Frames of the allocator and the standard library say little about who asked.
plumbing = re.compile(r"\(library/|\(alloc\.rs|__rust|__rdl|GlobalAlloc|malloc|calloc|realloc|raw_vec|\?\?\?"
                      r"|^(grow_amortized|try_allocate_in|with_capacity_in|with_capacity|reserve|finish_grow|to_vec|to_owned|allocate|append_elements|spec_extend|extend_from_slice)\b")
def show(p, bytes_key, blocks_key):
    names = [re.sub(r"^0x[0-9A-F]+: ", "", frames[i]) for i in p["fs"][1:]]
    asked = [n for n in names if not plumbing.search(n)][:3] or names[:3]
    print(f"  {p[bytes_key] / turns:9.0f} B {p[blocks_key] / turns:6.1f} blocks  " + " <- ".join(n[:110] for n in asked))
if held:
    print(f"{path}: {sum(p['gb'] for p in d['pps']) / turns / 1024:.1f} KiB in "
          f"{sum(p['gbk'] for p in d['pps']) / turns:.0f} blocks held per turn in flight at the heap's peak "
          f"({turns} at once; startup's share included)")
    print(f"\nthe {sites} sites that held most bytes at the peak, per turn in flight:")
    for p in sorted(d["pps"], key=lambda p: -p["gb"])[:sites]:
        show(p, "gb", "gbk")
    sys.exit(0)
print(f"{path}: {sum(p['tbk'] for p in d['pps']) / turns:.0f} allocations and "
      f"{sum(p['tb'] for p in d['pps']) / turns / 1024:.1f} KiB per turn (startup included)")
for key, what in (("tb", "bytes"), ("tbk", "blocks")):
    print(f"\nthe {sites} sites that allocated most {what}, per turn:")
    for p in sorted(d["pps"], key=lambda p: -p[key])[:sites]:
        show(p, "tb", "tbk")
EOF
