#!/usr/bin/env bash
# Capture "stagetrace v1" traces of MariaDB 10.11 under sysbench.
#
#   bench/capture/capture.sh [--workloads "oltp_read_only oltp_read_write"]
#                            [--events N] [--threads N] [--no-validate] [--force]
#
# Leaves target/traces/mariadb-<workload>.strace.zst and
# target/traces/mariadb-<workload>.strace.zst.stages.toml.  See README.md.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="${CAPTURE_OUT:-$ROOT/target/traces}"
BUILD="$ROOT/target/capture-build"

WORKLOADS="oltp_read_only oltp_read_write"
EVENTS=100         # sysbench transactions in the traced window, per workload
THREADS=16         # sysbench connections (= server connection threads)
TABLES=4
TABLE_SIZE=10000
SEED=1
VALIDATE=1
FORCE=0
PORT=${CAPTURE_PORT:-33917}

while [ $# -gt 0 ]; do
  case "$1" in
    --workloads) WORKLOADS="$2"; shift 2 ;;
    --events) EVENTS="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --no-validate) VALIDATE=0; shift ;;
    --force) FORCE=1; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "capture.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

T0=$(date +%s)
say() { printf '[capture %4ds] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }

# ---------------------------------------------------------------- packages
need_pkgs=()
command -v mariadbd >/dev/null 2>&1 || need_pkgs+=(mariadb-server)
command -v mariadb-install-db >/dev/null 2>&1 || need_pkgs+=(mariadb-server)
command -v sysbench >/dev/null 2>&1 || need_pkgs+=(sysbench)
command -v valgrind >/dev/null 2>&1 || need_pkgs+=(valgrind)
[ -f /usr/include/valgrind/pub_tool_tooliface.h ] || need_pkgs+=(valgrind)
command -v zstd >/dev/null 2>&1 || need_pkgs+=(zstd)
command -v gcc >/dev/null 2>&1 || need_pkgs+=(gcc libc6-dev)
command -v python3 >/dev/null 2>&1 || need_pkgs+=(python3)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  say "installing ${need_pkgs[*]} with apt-get"
  [ "$(id -u)" = 0 ] || { echo "capture.sh: need root to install ${need_pkgs[*]}" >&2; exit 1; }
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi
MARIADBD="$(command -v mariadbd)"
MDB_VERSION="$("$MARIADBD" --version | sed 's/^.*Ver //')"
VG_VERSION="$(valgrind --version)"
SB_VERSION="$(sysbench --version)"
PY=/usr/bin/python3; [ -x "$PY" ] || PY="$(command -v python3)"
say "mariadbd $MDB_VERSION; $VG_VERSION; $SB_VERSION"

# ---------------------------------------------------------------- the tool
mkdir -p "$BUILD" "$OUT"
say "building the stgtrace Valgrind tool (if needed)"
VALGRIND_LIB="$("$HERE/build_tool.sh")"
export VALGRIND_LIB

say "resolving stage functions ($HERE/mariadb-stages.toml)"
"$PY" "$HERE/resolve_stages.py" "$HERE/mariadb-stages.toml" "$MARIADBD" \
  --table "$BUILD/stages.tbl" --json "$BUILD/stages.json"

# ---------------------------------------------------------------- server
WORK="$(mktemp -d /tmp/stagevm-capture.XXXXXX)"
SERVER_PID=""
ZSTD_PID=""
cleanup() {
  local rc=$?
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
    kill -9 "$SERVER_PID" 2>/dev/null || true
  fi
  if [ -n "$ZSTD_PID" ] && kill -0 "$ZSTD_PID" 2>/dev/null; then kill "$ZSTD_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT INT TERM

SOCK="$WORK/mysqld.sock"
server_opts() {
  echo --no-defaults --datadir="$WORK/data" --socket="$SOCK" --port="$PORT" \
    --bind-address=127.0.0.1 --user=root --pid-file="$WORK/mysqld.pid" \
    --log-error="$WORK/error.log" --skip-name-resolve --innodb-use-native-aio=0 \
    --innodb-buffer-pool-size=128M --innodb-buffer-pool-size-max=256M \
    --max-connections=64 --performance-schema=OFF
}
wait_ready() {   # $1 timeout s
  local t0; t0=$(date +%s)
  until mariadb-admin --no-defaults --socket="$SOCK" -uroot ping >/dev/null 2>&1; do
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "server died:"; tail -20 "$WORK/error.log"; return 1; }
    [ $(( $(date +%s) - t0 )) -lt "$1" ] || { echo "server not ready after $1 s"; return 1; }
    sleep 1
  done
}
stop_server() {
  mariadb-admin --no-defaults --socket="$SOCK" -uroot shutdown >/dev/null 2>&1 || kill "$SERVER_PID"
  local t0; t0=$(date +%s)
  while kill -0 "$SERVER_PID" 2>/dev/null; do
    [ $(( $(date +%s) - t0 )) -lt 600 ] || { kill -9 "$SERVER_PID"; break; }
    sleep 1
  done
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
}
SB_COMMON=(--db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$PORT" --mysql-user=sbtest
           --mysql-password=sbtest --mysql-db=sbtest --tables="$TABLES" --table-size="$TABLE_SIZE")

if ss -ltn 2>/dev/null | grep -q ":$PORT "; then
  echo "capture.sh: port $PORT is in use (set CAPTURE_PORT)" >&2; exit 1
fi

# A prepared datadir, made once natively (fast) and copied for every run.
say "creating the datadir and the sysbench tables natively ($TABLES x $TABLE_SIZE rows)"
mariadb-install-db --no-defaults --datadir="$WORK/template" --user=root \
  --auth-root-authentication-method=socket --skip-test-db >"$WORK/install.log" 2>&1
cp -a "$WORK/template" "$WORK/data"
# shellcheck disable=SC2046
"$MARIADBD" $(server_opts) >"$WORK/mariadbd.out" 2>&1 &
SERVER_PID=$!
wait_ready 120
mariadb --no-defaults --socket="$SOCK" -uroot -e "CREATE DATABASE sbtest;
  CREATE USER sbtest@'127.0.0.1' IDENTIFIED BY 'sbtest';
  GRANT ALL ON sbtest.* TO sbtest@'127.0.0.1';"
sysbench oltp_read_write "${SB_COMMON[@]}" --threads=2 prepare >"$WORK/prepare.log"
stop_server
rm -rf "$WORK/template"; mv "$WORK/data" "$WORK/template"

# one run of a workload under Valgrind tool $1 ("stgtrace" or "callgrind")
# $2 workload; writes $WORK/<tool>.* files
run_under() {
  local tool=$1 wl=$2
  rm -rf "$WORK/data"; cp -a "$WORK/template" "$WORK/data"
  rm -f "$WORK/ctl"
  local vgopts=(--tool="$tool" --log-file="$WORK/$tool.vg.log")
  if [ "$tool" = stgtrace ]; then
    rm -f "$WORK/trace.fifo"; mkfifo "$WORK/trace.fifo"
    zstd -q -T1 -3 -f -o "$WORK/trace.zst" <"$WORK/trace.fifo" &
    ZSTD_PID=$!
    vgopts+=(--out="$WORK/trace.fifo" --stages="$BUILD/stages.tbl" --exe=mariadbd
             --ctl-file="$WORK/ctl" --stats-file="$WORK/stgtrace.stats")
  else
    vgopts+=(--callgrind-out-file="$WORK/callgrind.out" --separate-threads=yes)
  fi
  say "$wl: starting mariadbd under valgrind --tool=$tool"
  # shellcheck disable=SC2046
  valgrind "${vgopts[@]}" "$MARIADBD" $(server_opts) >"$WORK/mariadbd.out" 2>&1 &
  SERVER_PID=$!
  wait_ready 900
  say "$wl: server up; warm-up (not traced): read every table once into the buffer pool"
  local warm="" i
  for i in $(seq "$TABLES"); do
    warm+="SELECT SUM(id), SUM(k), SUM(LENGTH(c)) FROM sbtest.sbtest$i;"
    warm+="SELECT SUM(k) FROM sbtest.sbtest$i FORCE INDEX (k_$i);"
  done
  mariadb --no-defaults --socket="$SOCK" -uroot -e "$warm" >/dev/null
  # window open: the tool starts at the next dispatch_command (the DO 1 below)
  if [ "$tool" = stgtrace ]; then touch "$WORK/ctl"; else callgrind_control -z "$SERVER_PID" >/dev/null 2>&1; fi
  mariadb --no-defaults --socket="$SOCK" -uroot -e "DO 1"
  local ts; ts=$(date +%s)
  say "$wl: sysbench $wl: $EVENTS transactions, $THREADS connections (traced window)"
  sysbench "$wl" "${SB_COMMON[@]}" --threads="$THREADS" --events="$EVENTS" --time=0 \
    --rand-seed="$SEED" --db-ps-mode=disable --report-interval=10 run \
    | tee "$WORK/$tool.sysbench.log" | sed -u 's/^/    sysbench: /' \
    | grep --line-buffered -E 'sysbench: \[|transactions:|queries:|total time:' || true
  # window close: the next dispatch_command (the ping) sees no control file
  if [ "$tool" = stgtrace ]; then
    rm -f "$WORK/ctl"
    mariadb-admin --no-defaults --socket="$SOCK" -uroot ping >/dev/null
  else
    callgrind_control -d "$SERVER_PID" >/dev/null 2>&1
  fi
  say "$wl: window done in $(( $(date +%s) - ts )) s; stopping the server"
  stop_server
  if [ "$tool" = stgtrace ]; then wait "$ZSTD_PID"; ZSTD_PID=""; fi
  grep -q "transactions:" "$WORK/$tool.sysbench.log" || { echo "sysbench failed"; cat "$WORK/$tool.sysbench.log"; exit 1; }
}

sb_field() {  # $1 log, $2 field name (transactions|queries)
  sed -n "s/^ *$2: *\([0-9]*\).*/\1/p" "$1" | head -1
}

for wl in $WORKLOADS; do
  dest="$OUT/mariadb-$wl.strace.zst"
  if [ "$FORCE" = 0 ] && [ -s "$dest" ] && [ -s "$dest.stages.toml" ]; then
    say "$wl: $dest exists (use --force to recapture)"; continue
  fi
  tw=$(date +%s)
  run_under stgtrace "$wl"
  cp "$WORK/trace.zst" "$dest.tmp"
  say "$wl: trace $(du -h "$dest.tmp" | cut -f1); decoding it for statistics"
  "$PY" "$HERE/trace_stats.py" --json "$WORK/stats.json" "$dest.tmp" >"$WORK/trace_stats.txt"
  sed 's/^/    /' "$WORK/trace_stats.txt" | head -40
  cg_ir=""
  if [ "$VALIDATE" = 1 ]; then
    run_under callgrind "$wl"
    # the zeroed-then-dumped part is callgrind.out.1-<thread> (one file per thread)
    # (a thread that ran do_command in the window is a connection thread)
    for f in "$WORK"/callgrind.out.1-*; do
      conn=0; grep -q 'do_command' "$f" && conn=1
      awk -v c=$conn '/^thread:/ {t=$2} /^totals:/ {print t, $2, c}' "$f"
    done >"$WORK/callgrind.threads"
    cp "$WORK/callgrind.threads" "$BUILD/callgrind-$wl.threads"
    cg_ir=$(awk '{s+=$2} END {print s}' "$WORK/callgrind.threads")
  fi
  tcap=$(( $(date +%s) - tw ))
  "$PY" "$HERE/write_sidecar.py" \
    --stages-json "$BUILD/stages.json" --stages-toml "$HERE/mariadb-stages.toml" \
    --tool-stats "$WORK/stgtrace.stats" --trace-stats "$WORK/stats.json" \
    --sysbench-log "$WORK/stgtrace.sysbench.log" \
    ${cg_ir:+--callgrind-ir "$cg_ir" --callgrind-threads "$WORK/callgrind.threads" --callgrind-sysbench-log "$WORK/callgrind.sysbench.log"} \
    --workload "$wl" --events "$EVENTS" --threads "$THREADS" --tables "$TABLES" \
    --table-size "$TABLE_SIZE" --seed "$SEED" --mariadb "$MDB_VERSION" \
    --valgrind "$VG_VERSION" --sysbench "$SB_VERSION" --seconds "$tcap" \
    --vg-log "$WORK/stgtrace.vg.log" --trace "$dest" --out "$dest.stages.toml.tmp"
  mv "$dest.tmp" "$dest"; mv "$dest.stages.toml.tmp" "$dest.stages.toml"
  say "$wl: wrote $dest ($(du -h "$dest" | cut -f1)) and $dest.stages.toml in $tcap s"
  sed -n '/^\[capture\]/,/^$/p;/^\[validation\]/,/^$/p' "$dest.stages.toml" | sed 's/^/    /'
done
say "done"
