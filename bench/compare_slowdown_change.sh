#!/bin/sh
# Thin wrapper: the Debian interpreter (tomllib needs Python 3.11, Debian 12 has it).
exec /usr/bin/python3 "$(dirname "$0")/compare_slowdown_change.py" "$@"
