#!/usr/bin/env bash
# What a piece of a store script costs Redis, in instructions per call: a private redis-server
# (free port, nothing on disk) under valgrind's callgrind runs each Lua snippet N times through
# EVALSHA, counts zeroed before and dumped after, and the instructions per call are printed
# beside those of an empty script (what every EVALSHA costs before its body). Callgrind counts
# are the same on any host, so two snippets compare here the way they would compare in
# production: use it before trading one command for another (a command fewer is not always
# less work: docs/benchmarks-journal.md, "Two cuts not made", has the cases measured).
#
#   ops/bench/redis-lua-cost.sh [calls=2000]
#
# It compares the pairs docs/benchmarks.md cites (INCR + PEXPIRE against a counter read back
# and written with SET … PX; a tally's HINCRBY per field against one HMGET and one HSET); add
# a `cost` line below to measure another snippet.
#
# Needs redis-server, redis-cli, valgrind (callgrind_control) and a free port; leaves nothing.
set -euo pipefail

calls=${1:-2000}
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out.%p" \
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
    >"$dir/redis.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.2
done
redis-cli -p "$port" ping >/dev/null

# cost NAME BODY NUMKEYS ARGS…: the instructions per call of BODY.
cost() {
    local name=$1 body=$2
    shift 2
    local sha
    sha=$(redis-cli -p "$port" SCRIPT LOAD "$body")
    redis-cli -p "$port" EVALSHA "$sha" "$@" >/dev/null
    callgrind_control -z "$server" >/dev/null 2>&1
    redis-cli -p "$port" -r "$calls" EVALSHA "$sha" "$@" >/dev/null
    callgrind_control -d "$server" >/dev/null 2>&1
    local dump="" total
    for _ in $(seq 50); do
        dump=$(ls -t "$dir"/callgrind.out."$server".* 2>/dev/null | head -1 || true)
        [ -n "$dump" ] && grep -qE '^(summary|totals):' "$dump" && break
        sleep 0.2
    done
    total=$(grep -E '^(summary|totals):' "$dump" | head -1 | awk '{print $2}')
    rm -f "$dir"/callgrind.out."$server".*
    printf '%-28s %9d instructions per call\n' "$name" $((total / calls))
}

cost "empty script" "return 1" 0
cost "INCR + PEXPIRE" \
    "local t = redis.call('INCR', KEYS[1]); redis.call('PEXPIRE', KEYS[1], ARGV[1]); return t" \
    1 '{s}fence' 2592000000
cost "read back, SET ... PX" \
    "local n = tonumber(redis.call('GET', KEYS[1]) or '0') + 1
redis.call('SET', KEYS[1], string.format('%.0f', n), 'PX', ARGV[1]); return n" \
    1 '{s}fence2' 2592000000
cost "HINCRBY per field (4)" \
    "for i = 1, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end return 1" \
    1 '{t}tally' ctx/calls 1 ctx/input 120 ctx/output 30 ctx/total 150
cost "HMGET + HSET (4 fields)" \
    "local f, a = {}, {}
for i = 1, #ARGV, 2 do f[#f + 1] = ARGV[i]; a[#a + 1] = ARGV[i + 1] end
local held = redis.call('HMGET', KEYS[1], unpack(f))
local set = {}
for k = 1, #f do
  set[#set + 1] = f[k]
  set[#set + 1] = string.format('%.0f', tonumber(held[k] or '0') + tonumber(a[k]))
end
redis.call('HSET', KEYS[1], unpack(set)) return 1" \
    1 '{t}tally2' ctx/calls 1 ctx/input 120 ctx/output 30 ctx/total 150
cost "PEXPIRE" "return redis.call('PEXPIRE', KEYS[1], ARGV[1])" 1 '{s}fence' 2592000000

