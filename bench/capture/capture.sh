#!/usr/bin/env bash
# Capture "stagetrace v1" traces of MariaDB 10.11 under sysbench.
#
#   bench/capture/capture.sh [--workloads "oltp_read_only oltp_read_write tpcc"]
#                            [--events N] [--tpcc-events N] [--warehouses N]
#                            [--threads N] [--no-validate] [--force]
#                            [--discover-map DIR]
#
# --discover-map DIR: instead of traces, stagevm-discover's whole path on each
# workload (request marker do_command, the same server, warm-up, window and
# load): DIR/mariadb-<workload>.stagemap and DIR/mariadb-<workload>-discover.txt
# (its report), for this host's cores and L2.
#
# tpcc is bench/capture/tpcc.lua (TPC-C's five transactions); its validation
# also counts the transaction mix in the trace (tpcc_mix.py).
#
# Leaves target/traces/mariadb-<workload>.strace.zst and
# target/traces/mariadb-<workload>.strace.zst.stages.toml.  See README.md.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="${CAPTURE_OUT:-$ROOT/target/traces}"
BUILD="$ROOT/target/capture-build"

WORKLOADS="oltp_read_only oltp_read_write tpcc"
EVENTS=100         # sysbench transactions in the traced window, per OLTP workload
TPCC_EVENTS=160    # TPC-C transactions in the traced window: each connection runs TPCC_EVENTS/THREADS
WAREHOUSES=2       # TPC-C warehouses (seed 000's scale)
THREADS=16         # sysbench connections (= server connection threads)
TABLES=4
TABLE_SIZE=10000
SEED=1
VALIDATE=1
FORCE=0
DISCOVER_MAP=""
PORT=${CAPTURE_PORT:-33917}

while [ $# -gt 0 ]; do
  # (checked after the loop: --tpcc-events must be a multiple of --threads)
  case "$1" in
    --workloads) WORKLOADS="$2"; shift 2 ;;
    --events) EVENTS="$2"; shift 2 ;;
    --tpcc-events) TPCC_EVENTS="$2"; shift 2 ;;
    --warehouses) WAREHOUSES="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --no-validate) VALIDATE=0; shift ;;
    --force) FORCE=1; shift ;;
    --discover-map) DISCOVER_MAP="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "capture.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

if [ $(( TPCC_EVENTS % THREADS )) != 0 ] || [ "$TPCC_EVENTS" -lt "$THREADS" ]; then
  echo "capture.sh: --tpcc-events ($TPCC_EVENTS) must be a positive multiple of --threads ($THREADS)" >&2; exit 2
fi

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
say "building the stgtrace Valgrind tool (if needed) and stagevm-discover"
"$ROOT/discover/stgtrace/build_tool.sh" >/dev/null
(cd "$ROOT" && cargo build --release -q -p stagevm-discover -p stagesim)
DISCOVER="$ROOT/target/release/stagevm-discover"

say "resolving stage functions ($HERE/mariadb-stages.toml)"
"$PY" "$HERE/resolve_stages.py" "$HERE/mariadb-stages.toml" "$MARIADBD" \
  --table "$BUILD/stages.tbl" --json "$BUILD/stages.json"

# ---------------------------------------------------------------- server
WORK="$(mktemp -d /tmp/stagevm-capture.XXXXXX)"
SERVER_PID=""
cleanup() {
  local rc=$?
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
    kill -9 "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT INT TERM

SOCK="$WORK/mysqld.sock"
BP_OPTS="--innodb-buffer-pool-size=128M --innodb-buffer-pool-size-max=256M"
# TPC-C at 2 warehouses is ~230 MB of tables: a larger buffer pool so the
# warm-up caches all of it, and no asynchronous buffer-pool load at start-up
# (it would still be running in the traced window)
TPCC_BP_OPTS="--innodb-buffer-pool-size=512M --innodb-buffer-pool-size-max=1G --innodb-buffer-pool-load-at-startup=0"
server_opts() {
  # shellcheck disable=SC2086
  echo --no-defaults --datadir="$WORK/data" --socket="$SOCK" --port="$PORT" \
    --bind-address=127.0.0.1 --user=root --pid-file="$WORK/mysqld.pid" \
    --log-error="$WORK/error.log" --skip-name-resolve --innodb-use-native-aio=0 \
    $BP_OPTS \
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
SB_TPCC=(--db-driver=mysql --mysql-host=127.0.0.1 --mysql-port="$PORT" --mysql-user=sbtest
         --mysql-password=sbtest --mysql-db=tpcc --warehouses="$WAREHOUSES")
TPCC_TABLES="warehouse district customer history new_orders orders order_line item stock"

# does workload $1 need capturing (else its trace is reused)?
wanted() {
  local dest="$OUT/mariadb-$1.strace.zst"
  [ -n "$DISCOVER_MAP" ] || [ "$FORCE" = 1 ] || ! [ -s "$dest" ] || ! [ -s "$dest.stages.toml" ]
}
NEED_OLTP=0; NEED_TPCC=0
for wl in $WORKLOADS; do
  if wanted "$wl"; then if [ "$wl" = tpcc ]; then NEED_TPCC=1; else NEED_OLTP=1; fi; fi
done

if ss -ltn 2>/dev/null | grep -q ":$PORT "; then
  echo "capture.sh: port $PORT is in use (set CAPTURE_PORT)" >&2; exit 1
fi

# A prepared datadir, made once natively (fast) and copied for every run.
if [ "$NEED_OLTP" = 1 ]; then
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
fi

# The TPC-C datadir: loaded natively by tpcc.lua (2 loader threads).
TPCC_LOAD_S=""
if [ "$NEED_TPCC" = 1 ]; then
  say "creating the TPC-C datadir natively ($WAREHOUSES warehouses, tpcc.lua prepare)"
  mariadb-install-db --no-defaults --datadir="$WORK/template-tpcc" --user=root \
    --auth-root-authentication-method=socket --skip-test-db >"$WORK/install-tpcc.log" 2>&1
  cp -a "$WORK/template-tpcc" "$WORK/data"
  BP_OPTS=$TPCC_BP_OPTS
  # shellcheck disable=SC2046
  "$MARIADBD" $(server_opts) >"$WORK/mariadbd.out" 2>&1 &
  SERVER_PID=$!
  wait_ready 120
  mariadb --no-defaults --socket="$SOCK" -uroot -e "CREATE DATABASE tpcc;
    CREATE USER sbtest@'127.0.0.1' IDENTIFIED BY 'sbtest';
    GRANT ALL ON tpcc.* TO sbtest@'127.0.0.1';"
  tl=$(date +%s)
  sysbench "$HERE/tpcc.lua" "${SB_TPCC[@]}" --threads=2 prepare >"$WORK/prepare-tpcc.log"
  sysbench "$HERE/tpcc.lua" "${SB_TPCC[@]}" analyze >>"$WORK/prepare-tpcc.log"
  TPCC_LOAD_S=$(( $(date +%s) - tl ))
  rows=""
  for t in $TPCC_TABLES; do
    rows+="$t $(mariadb --no-defaults --socket="$SOCK" -uroot -N -e "SELECT COUNT(*) FROM tpcc.$t") "
  done
  say "TPC-C loaded in $TPCC_LOAD_S s: $rows"
  stop_server
  BP_OPTS="--innodb-buffer-pool-size=128M --innodb-buffer-pool-size-max=256M"
  rm -rf "$WORK/template-tpcc"; mv "$WORK/data" "$WORK/template-tpcc"
fi

# The workload's datadir template, event options and buffer pool ($1 workload):
# sets TEMPLATE, EV, EVOPT and BP_OPTS, and copies the template to $WORK/data.
prepare_run() {
  local wl=$1
  TEMPLATE="$WORK/template" EV=$EVENTS
  BP_OPTS="--innodb-buffer-pool-size=128M --innodb-buffer-pool-size-max=256M"
  if [ "$wl" = tpcc ]; then TEMPLATE="$WORK/template-tpcc"; EV=$TPCC_EVENTS; BP_OPTS=$TPCC_BP_OPTS; fi
  EVOPT=(--events="$EV")
  # tpcc: exactly TPCC_EVENTS/THREADS transactions per connection, so the
  # mix and every connection's work do not depend on the scheduling (the
  # stgtrace and the callgrind run do the same transactions)
  [ "$wl" = tpcc ] && EVOPT=(--events="$(( EV + THREADS ))" --thread-events="$(( EV / THREADS ))")
  rm -rf "$WORK/data"; cp -a "$TEMPLATE" "$WORK/data"
}
# SQL that reads every table once into the buffer pool ($1 workload).
warm_sql() {
  local i warm=""
  if [ "$1" = tpcc ]; then
    # every row of every table (clustered index) and the two secondary indexes
    warm="USE tpcc; SELECT SUM(w_ytd) FROM warehouse; SELECT SUM(d_ytd) FROM district;
      SELECT SUM(LENGTH(c_data)) FROM customer FORCE INDEX (PRIMARY);
      SELECT COUNT(c_first) FROM customer FORCE INDEX (idx_customer_name);
      SELECT SUM(h_amount) FROM history; SELECT SUM(no_o_id) FROM new_orders;
      SELECT SUM(o_ol_cnt) FROM orders FORCE INDEX (PRIMARY);
      SELECT SUM(o_c_id) FROM orders FORCE INDEX (idx_orders_customer);
      SELECT SUM(ol_amount) FROM order_line; SELECT SUM(i_price) FROM item;
      SELECT SUM(s_quantity), SUM(LENGTH(s_data)) FROM stock;"
  else
    for i in $(seq "$TABLES"); do
      warm+="SELECT SUM(id), SUM(k), SUM(LENGTH(c)) FROM sbtest.sbtest$i;"
      warm+="SELECT SUM(k) FROM sbtest.sbtest$i FORCE INDEX (k_$i);"
    done
  fi
  # one line: the warm-up goes through sh -c, where printf %q would write
  # a newline as $'\n' (bash's quoting, which dash does not read)
  printf '%s' "${warm//$'\n'/ }"
}
# The sysbench command line of workload $1 (one string, quoted for sh -c).
sysbench_cmd() {
  local sbwl=("$1" "${SB_COMMON[@]}")
  [ "$1" = tpcc ] && sbwl=("$HERE/tpcc.lua" "${SB_TPCC[@]}")
  printf '%q ' sysbench "${sbwl[@]}" --threads="$THREADS" "${EVOPT[@]}" --time=0 \
    --rand-seed="$SEED" --db-ps-mode=disable --report-interval=10 run
}
MYSQL_ROOT=(mariadb --no-defaults --socket="$SOCK" -uroot)
PING="$(printf '%q ' mariadb-admin --no-defaults --socket="$SOCK" -uroot ping)"

# stagevm-discover's options for a MariaDB run of workload $1 with its
# sysbench output in $2 (the server, readiness, warm-up, the window opened
# by `DO 1` at dispatch_command and closed by a ping, bounds for Valgrind's
# pace): sets DISCOVER_ARGS; the server's command line follows `--`.
discover_args() {
  local wl=$1 log=$2
  DISCOVER_ARGS=(--binary "$MARIADBD" --duration 3600 --ready-timeout 900 --stop-timeout 600
    --ready "$PING"
    --warmup "$(printf '%q ' "${MYSQL_ROOT[@]}" -e "$(warm_sql "$wl")")"
    --load "$(printf '%q ' "${MYSQL_ROOT[@]}" -e 'DO 1') && $(sysbench_cmd "$wl") >$(printf '%q' "$log")"
    --close "$PING")
}

# The stgtrace run of workload $1 through stagevm-discover --trace-only (the
# capture every user of the tool gets: server under the tool, the window at
# dispatch_command boundaries, the load, the server stopped whatever happens).
# Writes $WORK/trace.zst, $WORK/stgtrace.{stats,vg.log,sysbench.log}.
run_stgtrace() {
  local wl=$1
  prepare_run "$wl"
  discover_args "$wl" "$WORK/stgtrace.sysbench.log"
  say "$wl: mariadbd under valgrind --tool=stgtrace (stagevm-discover --trace-only); window: $EV transactions, $THREADS connections"
  # shellcheck disable=SC2046
  "$DISCOVER" --trace-only "$WORK/trace.zst" --table "$BUILD/stages.tbl" --work-dir "$WORK/stg" \
    --max-instrs 0 "${DISCOVER_ARGS[@]}" -- "$MARIADBD" $(server_opts) 2>&1 | sed -u 's/^/    /'
  cp "$WORK/stg/stgtrace.stats" "$WORK/stgtrace.stats"
  cp "$WORK/stg/valgrind.log" "$WORK/stgtrace.vg.log"
  grep -E 'transactions:|queries:|total time:' "$WORK/stgtrace.sysbench.log" | sed 's/^/    sysbench: /' || true
  grep -q "transactions:" "$WORK/stgtrace.sysbench.log" || { echo "sysbench failed"; cat "$WORK/stgtrace.sysbench.log"; exit 1; }
}

# stagevm-discover's whole path on workload $1 (see --discover-map).
run_discover() {
  local wl=$1
  prepare_run "$wl"
  mkdir -p "$DISCOVER_MAP"
  discover_args "$wl" "$WORK/discover.sysbench.log"
  say "$wl: stagevm-discover on mariadbd (request marker do_command); window: $EV transactions, $THREADS connections"
  # shellcheck disable=SC2046
  "$DISCOVER" --request do_command --out "$DISCOVER_MAP/mariadb-$wl.stagemap" --work-dir "$WORK/discover-$wl" \
    "${DISCOVER_ARGS[@]}" -- "$MARIADBD" $(server_opts) | tee "$DISCOVER_MAP/mariadb-$wl-discover.txt"
  grep -E 'transactions:|queries:' "$WORK/discover.sysbench.log" | sed 's/^/    sysbench: /' || true
}

# The callgrind run of workload $1 (the independent instruction count);
# writes $WORK/callgrind.* files.
run_callgrind() {
  local wl=$1
  prepare_run "$wl"
  say "$wl: starting mariadbd under valgrind --tool=callgrind"
  # shellcheck disable=SC2046
  valgrind --tool=callgrind --log-file="$WORK/callgrind.vg.log" --callgrind-out-file="$WORK/callgrind.out" \
    --separate-threads=yes "$MARIADBD" $(server_opts) >"$WORK/mariadbd.out" 2>&1 &
  SERVER_PID=$!
  wait_ready 900
  say "$wl: server up; warm-up (not counted): read every table once into the buffer pool"
  "${MYSQL_ROOT[@]}" -e "$(warm_sql "$wl")" >/dev/null
  callgrind_control -z "$SERVER_PID" >/dev/null 2>&1
  "${MYSQL_ROOT[@]}" -e "DO 1"
  local ts; ts=$(date +%s)
  say "$wl: sysbench $wl: $EV transactions, $THREADS connections (counted window)"
  sh -c "$(sysbench_cmd "$wl")" | tee "$WORK/callgrind.sysbench.log" | sed -u 's/^/    sysbench: /' \
    | grep --line-buffered -E 'sysbench: \[|transactions:|queries:|total time:' || true
  callgrind_control -d "$SERVER_PID" >/dev/null 2>&1
  say "$wl: window done in $(( $(date +%s) - ts )) s; stopping the server"
  stop_server
  grep -q "transactions:" "$WORK/callgrind.sysbench.log" || { echo "sysbench failed"; cat "$WORK/callgrind.sysbench.log"; exit 1; }
}

sb_field() {  # $1 log, $2 field name (transactions|queries)
  sed -n "s/^ *$2: *\([0-9]*\).*/\1/p" "$1" | head -1
}

if [ -n "$DISCOVER_MAP" ]; then
  for wl in $WORKLOADS; do run_discover "$wl"; done
  say "done"
  exit 0
fi

for wl in $WORKLOADS; do
  dest="$OUT/mariadb-$wl.strace.zst"
  if [ "$FORCE" = 0 ] && [ -s "$dest" ] && [ -s "$dest.stages.toml" ]; then
    say "$wl: $dest exists (use --force to recapture)"; continue
  fi
  tw=$(date +%s)
  run_stgtrace "$wl"
  cp "$WORK/trace.zst" "$dest.tmp"
  say "$wl: trace $(du -h "$dest.tmp" | cut -f1); decoding it for statistics"
  "$PY" "$HERE/trace_stats.py" --json "$WORK/stats.json" "$dest.tmp" >"$WORK/trace_stats.txt"
  sed 's/^/    /' "$WORK/trace_stats.txt" | head -40
  mix_ok=1
  if [ "$wl" = tpcc ]; then
    say "$wl: counting the transaction mix in the trace (tpcc_mix.py)"
    "$PY" "$HERE/tpcc_mix.py" "$dest.tmp" --sysbench-log "$WORK/stgtrace.sysbench.log" \
      --warehouses "$WAREHOUSES" --json "$WORK/mix.json" >"$WORK/mix.txt" || mix_ok=0
    sed 's/^/    /' "$WORK/mix.txt"
    cp "$WORK/mix.txt" "$BUILD/tpcc-mix.txt"; cp "$WORK/stgtrace.sysbench.log" "$BUILD/tpcc-stgtrace.sysbench.log"
  fi
  cg_ir=""
  if [ "$VALIDATE" = 1 ]; then
    run_callgrind "$wl"
    # the zeroed-then-dumped part is callgrind.out.1-<thread> (one file per thread)
    # (a thread that ran do_command in the window is a connection thread)
    for f in "$WORK"/callgrind.out.1-*; do
      conn=0; grep -q 'do_command' "$f" && conn=1
      awk -v c=$conn '/^thread:/ {t=$2} /^totals:/ {print t, $2, c}' "$f"
    done >"$WORK/callgrind.threads"
    cp "$WORK/callgrind.threads" "$BUILD/callgrind-$wl.threads"
    cp "$WORK/callgrind.sysbench.log" "$BUILD/callgrind-$wl.sysbench.log"
    cg_ir=$(awk '{s+=$2} END {print s}' "$WORK/callgrind.threads")
  fi
  tcap=$(( $(date +%s) - tw ))
  if [ "$wl" = tpcc ]; then
    wl_args=(--events "$TPCC_EVENTS" --mix-json "$WORK/mix.json" --warehouses "$WAREHOUSES"
             --server-opts "$TPCC_BP_OPTS")
    [ -n "$TPCC_LOAD_S" ] && wl_args+=(--load-seconds "$TPCC_LOAD_S")
  else
    wl_args=(--events "$EVENTS" --tables "$TABLES" --table-size "$TABLE_SIZE")
  fi
  "$PY" "$HERE/write_sidecar.py" \
    --stages-json "$BUILD/stages.json" --stages-toml "$HERE/mariadb-stages.toml" \
    --tool-stats "$WORK/stgtrace.stats" --trace-stats "$WORK/stats.json" \
    --sysbench-log "$WORK/stgtrace.sysbench.log" \
    ${cg_ir:+--callgrind-ir "$cg_ir" --callgrind-threads "$WORK/callgrind.threads" --callgrind-sysbench-log "$WORK/callgrind.sysbench.log"} \
    --workload "$wl" --threads "$THREADS" --seed "$SEED" --mariadb "$MDB_VERSION" "${wl_args[@]}" \
    --valgrind "$VG_VERSION" --sysbench "$SB_VERSION" --seconds "$tcap" \
    --vg-log "$WORK/stgtrace.vg.log" --trace "$dest" --out "$dest.stages.toml.tmp"
  if [ "$mix_ok" = 0 ]; then
    if [ "$VALIDATE" = 1 ]; then
      echo "capture.sh: $wl: the transaction mix counted in the trace differs from the script's by more" \
           "than 5 percentage points (see above); trace left as $dest.tmp" >&2
      exit 1
    fi
    echo "capture.sh: warning: $wl: transaction mix check failed (--no-validate: trace kept)" >&2
  fi
  mv "$dest.tmp" "$dest"; mv "$dest.stages.toml.tmp" "$dest.stages.toml"
  say "$wl: wrote $dest ($(du -h "$dest" | cut -f1)) and $dest.stages.toml in $tcap s"
  sed -n '/^\[capture\]/,/^$/p;/^\[validation\]/,/^$/p;/^\[tpcc\]/,/^$/p' "$dest.stages.toml" | sed 's/^/    /'
done
say "done"
