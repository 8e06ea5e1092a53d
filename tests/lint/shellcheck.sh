#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `just lint`'s check of our shell scripts: shellcheck (Debian's package,
# which `just setup` installs) on every tracked *.sh and every tracked file
# whose first line is a sh/bash shebang (./dev, .ci/run, the maintainer
# scripts in packaging/, ...), or on the files given as arguments. Nothing
# under a target/ directory or vendored code is checked; the justfile's
# shebang recipes are not either. Exits 1 on any finding. A finding that is
# meant stays, with `# shellcheck disable=SCxxxx # why` on the line before.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v shellcheck >/dev/null || { echo "shellcheck: not installed (just setup installs it)" >&2; exit 1; }

if [ $# -gt 0 ]; then
    scripts=("$@")
else
    candidates=()
    while IFS= read -r -d '' f; do
        case "$f" in
        target/* | */target/* | vendor/* | */vendor/* | third_party/* | */third_party/*) continue ;;
        esac
        [ -f "$f" ] && candidates+=("$f")
    done < <(git ls-files -z)
    # *.sh, and the first lines that run sh, bash or dash (directly or via env).
    mapfile -t scripts < <(awk '
        FILENAME ~ /\.sh$/ { print FILENAME; nextfile }
        FNR == 1 && /^#![ \t]*[^ \t]*\/(env[ \t]+)?(ba|da)?sh([ \t]|$)/ { print FILENAME }
        { nextfile }' "${candidates[@]}")
fi
shellcheck "${scripts[@]}"
