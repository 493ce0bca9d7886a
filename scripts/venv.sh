#!/usr/bin/env bash
# Makes the virtualenv DIR (default .venv) unless it already has a python, from the best-built Python 3.11+ at hand:
# KIMI_PYTHON if set; else the operating system's own /usr/bin/python3; else python3 from PATH.
#
# Why the system's interpreter first: Debian, Ubuntu and Fedora build it with profile-guided and link-time
# optimisation, while version managers (pyenv, asdf) build without both unless asked to (pyenv:
# PYTHON_CONFIGURE_OPTS="--enable-optimizations --with-lto"). Nearly all of this project's work is short-lived Python
# processes (the program, Pulumi's language and provider hosts, the fake nodes), so the build shows: the
# README's "Run every test" gives the suite's CPU time with each.
set -euo pipefail
dir="${1:-.venv}"
[ -x "$dir/bin/python" ] && exit 0
if [ -n "${KIMI_PYTHON:-}" ]; then candidates=("$KIMI_PYTHON"); else candidates=(/usr/bin/python3 python3); fi
existed=0
[ -e "$dir" ] && existed=1
errors=""
for py in "${candidates[@]}"; do
    if ! command -v "$py" >/dev/null 2>&1; then errors+=$'\n'"  $py: not found"; continue; fi
    if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        errors+=$'\n'"  $py: $("$py" -V 2>&1), older than 3.11"; continue
    fi
    if out="$("$py" -m venv "$dir" 2>&1)"; then
        echo "$dir: $("$dir/bin/python" -V) from $py"
        exit 0
    fi
    errors+=$'\n'"  $py: venv failed: ${out//$'\n'/ }"
    # e.g. a Debian python3 without the python3-venv package: venv stops after making bin/python, before pip.
    [ "$existed" = 0 ] && rm -rf -- "$dir"
done
echo "scripts/venv.sh: no Python 3.11 or newer could make $dir (set KIMI_PYTHON to one that can):$errors" >&2
exit 1
