#!/usr/bin/env bash
# Builds the MariaDB guest image (images/linux/mariadb/README.md) into OUT
# (default target/mariadb-image):
#   vmlinux        the test kernel plus kernel/mariadb.config (ext4, unix
#                  sockets, epoll, uprobes, ...; cached by kernel.sh)
#   initramfs.cpio the test image's /init and tools (images/linux/build.sh,
#                  against this kernel), which mounts the root disk and starts
#                  mariadbd from it (stagevm.test=mariadb, mariadb.c), and the
#                  preload library with stagevm-gatectl (the preload path)
#   root.ext4      the root disk: Debian's own mariadb-server-core package and
#                  the library packages it depends on (apt-get download,
#                  dpkg-deb -x; no hand-built server), my.cnf, and a data
#                  directory initialised on the host by that same mariadbd
#                  with an `sbtest` database (sysbench oltp tables) and user
#   cmdline        the kernel command line
# The root disk is cached by the package versions, my.cnf and TABLE_SIZE;
# prints each step's time.
#
# Environment: OUT=dir, TABLE_SIZE (rows of sbtest1, default 1000),
# ROOT_ONLY=1 (the root disk only; no kernel, /init or command line),
# STAGEVM_MARIADB_MAP=FILE (the stage map installed as /etc/mysql/stages.map,
# e.g. stagevm-discover's mariadbd.stagemap; default oltp_read_only.stagemap).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
out="${OUT:-$repo/target/mariadb-image}"
rows="${TABLE_SIZE:-1000}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
map="${STAGEVM_MARIADB_MAP:-$here/oltp_read_only.stagemap}"
[ -f "$map" ] || { echo "mariadb-image: STAGEVM_MARIADB_MAP=$map: no such file" >&2; exit 1; }
log() { echo "mariadb-image: $*" >&2; }
t0=$(date +%s)

missing=()
for tool in mke2fs:e2fsprogs sysbench:sysbench cpio:cpio mariadb:mariadb-client-core; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- kernel, /init and the agent (the test image's build against this kernel) --
if [ -z "${ROOT_ONLY:-}" ]; then
    OUT="$out/initrd" KERNEL_FRAGMENTS="$repo/images/linux/kernel/mariadb.config" \
        KERNEL_OUT="$repo/target/linux-kernel-mariadb" "$repo/images/linux/build.sh"
    cp "$out/initrd/vmlinux" "$out/vmlinux"
    cp "$out/initrd/initramfs.cpio" "$out/initramfs.cpio"
    # The preload path (stagevm.mariadb=preload, mariadb.c): the preload
    # library and stagevm-gatectl in a second cpio archive appended to the
    # first (the kernel unpacks concatenated archives), under
    # /lib/stagevm/preload; mariadb.c copies them into the chroot's /run.
    (cd "$repo" && cargo build --release -q -p stagevm-preload)
    pre="$out/preload-cpio"
    rm -rf "$pre" && mkdir -p "$pre/lib/stagevm/preload"
    install -m 644 "$repo/target/release/libstagevm_preload.so" "$pre/lib/stagevm/preload/"
    install -m 755 "$repo/target/release/stagevm-gatectl" "$pre/lib/stagevm/preload/"
    strip --strip-unneeded "$pre"/lib/stagevm/preload/* 2>/dev/null || true
    (cd "$pre" && find lib/stagevm/preload | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >> "$out/initramfs.cpio"
fi
t1=$(date +%s)

# --- Debian's packages: mariadb-server-core and the libraries it links -------
# The closure of Depends over library packages (lib*, zlib1g): what the
# binary loads, not the whole dependency tree (no perl, no passwd).
debs="$out/debs"
mkdir -p "$debs"
declare -A seen=()
queue=(mariadb-server-core)
while [ ${#queue[@]} -gt 0 ]; do
    pkg="${queue[0]}" && queue=("${queue[@]:1}")
    [ -n "${seen[$pkg]:-}" ] && continue
    seen[$pkg]=1
    if ! ls "$debs/${pkg}"_*.deb >/dev/null 2>&1; then
        (cd "$debs" && apt-get download -q "$pkg" >/dev/null 2>&1) ||
            { apt-get update -q >/dev/null && (cd "$debs" && apt-get download -q "$pkg" >/dev/null); } ||
            { log "apt-get download $pkg failed"; exit 1; }
    fi
    found=("$debs/${pkg}"_*.deb)
    deb="${found[0]}"
    for dep in $(dpkg-deb -f "$deb" Depends Pre-Depends | tr ',' '\n' | sed 's/[|(].*//; s/:any//' | tr -d ' '); do
        case "$dep" in lib* | zlib1g) [ -z "${seen[$dep]:-}" ] && queue+=("$dep") ;; esac
    done
done
# shellcheck disable=SC2012 # .deb names (name_version_arch) are plain; the key must stay as it was
key="$( { ls "$debs" | sort; cat "$here/my.cnf" "$map" "$here"/refused/*; echo "rows=$rows"; } | sha256sum | cut -c1-12)"
if [ -f "$out/root.ext4" ] && [ -f "$out/expected.tsv" ] && [ "$(cat "$out/root.key" 2>/dev/null)" = "$key" ]; then
    log "root disk cached ($key)"
else
    root="$out/root"
    rm -rf "$root" && mkdir -p "$root"
    for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$root"; done
    rm -rf "$root"/usr/share/{doc,man,lintian,locale,info}
    # Debian 12's merged /usr: the packages ship /lib and /lib64 paths.
    for d in bin sbin lib lib64; do
        if [ -d "$root/$d" ] && [ ! -L "$root/$d" ]; then
            mkdir -p "$root/usr/$d" && cp -a "$root/$d/." "$root/usr/$d/" && rm -rf "${root:?}/$d"
        fi
        ln -sfn "usr/$d" "$root/$d"
    done
    mkdir -p "$root"/{etc/mysql,proc,sys,dev,tmp,run/mysqld,var/lib/mysql,mnt}
    install -m 644 "$here/my.cnf" "$root/etc/mysql/my.cnf"
    install -m 644 "$map" "$root/etc/mysql/stages.map"
    mkdir -p "$root/etc/mysql/refused" && install -m 644 "$here"/refused/*.stagemap "$root/etc/mysql/refused/"
    printf 'root:x:0:0:root:/root:/bin/sh\nmysql:x:100:101::/nonexistent:/bin/false\n' > "$root/etc/passwd"
    printf 'root:x:0:\nmysql:x:101:\n' > "$root/etc/group"
    printf 'passwd: files\ngroup: files\nhosts: files\n' > "$root/etc/nsswitch.conf"
    printf '127.0.0.1 localhost\n' > "$root/etc/hosts"

    # --- the data directory, initialised on the host by the same binary --------
    t2=$(date +%s)
    data="$root/var/lib/mysql"
    sock="$out/host-mysqld.sock"
    libs="$root/usr/lib/x86_64-linux-gnu"
    share="$root/usr/share/mysql"
    mysqld=(env LD_LIBRARY_PATH="$libs" "$root/usr/sbin/mariadbd" --defaults-file="$root/etc/mysql/my.cnf"
        --datadir="$data" --lc-messages-dir="$share" --character-sets-dir="$share/charsets"
        --socket="$sock" --pid-file="$out/host-mysqld.pid" --skip-networking --user=root)
    { printf "CREATE DATABASE IF NOT EXISTS mysql;\nuse mysql;\n"; cat "$share/mysql_system_tables.sql" "$share/mysql_system_tables_data.sql"; } |
        "${mysqld[@]}" --bootstrap --log-warnings=0 > "$out/bootstrap.log" 2>&1 ||
        { tail -n 20 "$out/bootstrap.log" >&2; log "mariadbd --bootstrap failed ($out/bootstrap.log)"; exit 1; }
    "${mysqld[@]}" > "$out/host-mysqld.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do [ -S "$sock" ] && break; sleep 0.1; done
    [ -S "$sock" ] || { tail -n 20 "$out/host-mysqld.log" >&2; log "mariadbd did not start on the host"; kill "$pid"; exit 1; }
    sb=(sysbench oltp_read_only --db-driver=mysql --mysql-socket="$sock" --mysql-user=root --mysql-db=sbtest
        --tables=1 --table-size="$rows")
    # sysbench's own client runs the set-up statements (no mariadb client needed).
    cat > "$out/setup.lua" <<'LUA'
function event() end
function prepare()
    local con = sysbench.sql.driver():connect()
    con:query("CREATE DATABASE IF NOT EXISTS sbtest")
    con:query("CREATE USER IF NOT EXISTS 'sbtest'@'%' IDENTIFIED BY 'sbtest'")
    con:query("GRANT ALL ON sbtest.* TO 'sbtest'@'%'")
end
LUA
    sysbench "$out/setup.lua" --db-driver=mysql --mysql-socket="$sock" --mysql-user=root --mysql-db=mysql \
        prepare > "$out/setup.log" 2>&1 || { cat "$out/setup.log" >&2; kill "$pid"; exit 1; }
    "${sb[@]}" prepare > "$out/prepare.log" 2>&1 || { cat "$out/prepare.log" >&2; kill "$pid"; exit 1; }
    # The table as the harness will check it (id, k, c, pad; tab-separated).
    mariadb -S "$sock" -u root -N -B sbtest -e 'SELECT id,k,c,pad FROM sbtest1 ORDER BY id' > "$out/expected.tsv"
    kill -TERM "$pid"
    wait "$pid" || true
    rm -f "$sock" "$out/host-mysqld.pid"
    t3=$(date +%s)
    log "data directory initialised on the host in $((t3 - t2)) s (sbtest1: $rows rows)"

    # --- the ext4 image, without a journal (no jbd2 commits in emulated kernel
    # mode); 1.5× the files plus 256 MiB for InnoDB's growth and temporary files.
    used_mb=$(du -sm "$root" | cut -f1)
    size_mb=$((used_mb * 3 / 2 + 256))
    rm -f "$out/root.ext4"
    mke2fs -q -t ext4 -O ^has_journal -L mariadb -d "$root" "$out/root.ext4" "${size_mb}M"
    echo "$key" > "$out/root.key"
    log "root disk $out/root.ext4: $size_mb MiB, $used_mb MiB of files"
fi

[ -n "${ROOT_ONLY:-}" ] || echo "$(cat "$out/initrd/cmdline") stagevm.test=mariadb" > "$out/cmdline"
log "done in $(($(date +%s) - t0)) s (kernel and /init $((t1 - t0)) s)"
