#!/bin/sh
# A program under test that fails on a folder of more than one case, and
# otherwise runs "$PY" "$SCRIPT" on it (the numpy candidate).
n=$(ls "$1"/*/ | wc -l)
if [ "$n" -gt 1 ]; then
    echo "one_at_a_time.sh: $n cases" >&2
    exit 4
fi
exec "$PY" "$SCRIPT" "$1" "$2"
