#!/bin/sh
# The corpus-scale table of docs/bench.md: `train --steps 20` on corpora of
# 10^7, 10^8 and 10^9 tokens, as int64 (numpy's default) and compact files,
# alternating the two formats over ROUNDS rounds. Peak resident memory from
# GNU time; load time and tokens/s from train's own lines.
#
#   sh benches/corpus/scale.sh DIR [ROUNDS] [SIZES]
#
# DIR holds (or receives, from make_corpus.py) c<N>.npz and i<N>.npz.
set -eu
dir=$1
rounds=${2:-3}
sizes=${3:-"10000000 100000000 1000000000"}
bin=${SPLITGRAD:-target/release/splitgrad}
py=${PYTHON:-python3}
here=$(dirname "$0")
for n in $sizes; do
  [ -f "$dir/c$n.npz" ] || "$py" "$here/make_corpus.py" --tokens "$n" --format compact --out "$dir/c$n.npz"
  [ -f "$dir/i$n.npz" ] || "$py" "$here/make_corpus.py" --tokens "$n" --format int64 --out "$dir/i$n.npz"
done
echo "tokens format round file_bytes load_s peak_rss_kb tokens_per_s wall"
for n in $sizes; do
  for r in $(seq "$rounds"); do
    for f in i c; do
      file="$dir/$f$n.npz"
      cat "$file" > /dev/null   # a warm page cache
      out=$(mktemp -d)
      /usr/bin/time -v "$bin" train --corpus "$file" --steps 20 --out "$out/run" > "$out/stdout" 2> "$out/stderr"
      load=$(sed -n 's/^splitgrad: loaded .* in \([0-9.]*\) s:.*/\1/p' "$out/stderr")
      rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$out/stderr")
      wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$out/stderr")
      tps=$(sed -n 's/^ *\([0-9]*\) tokens\/s on.*/\1/p' "$out/stdout")
      echo "$n $f $r $(stat -L -c %s "$file") $load $rss $tps $wall"
      rm -rf "$out"
    done
  done
done
