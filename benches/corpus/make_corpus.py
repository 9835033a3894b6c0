#!/usr/bin/env python3
"""Writes a large synthetic corpus file for `splitgrad train`, a chunk at a time.

    python benches/corpus/make_corpus.py --tokens 1000000000 --format compact --out big.npz

`--format int64` writes `token_ids` and `language_ids` as int64, as
`numpy.savez` does with default integer arrays (16 bytes a token);
`--format compact` writes what `splitgrad tokenize` writes: uint16 (or
uint32) token ids and one uint8 language per sequence. Each sequence is in
one language; its tokens follow a per-language Zipf law over the vocabulary
with a bigram dependence (each token shifts the next one's distribution),
so the file has (language, token) contexts worth splitting. Memory stays
at one chunk whatever the size; the archive is written as numpy writes a
large one (zip64, stored) to a temporary file, then renamed.
"""

import argparse
import os
import sys
import zipfile

import numpy as np

CHUNK = 1 << 24


def write_member(zf, name, dtype, n, chunks):
    """Streams `n` values of `dtype` from the `chunks` iterator as `name`.npy."""
    with zf.open(name + ".npy", "w", force_zip64=True) as f:
        header = {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": (n,)}
        np.lib.format.write_array_header_1_0(f, header)
        written = 0
        for chunk in chunks:
            f.write(np.ascontiguousarray(chunk, dtype=dtype).tobytes())
            written += len(chunk)
        assert written == n, (name, written, n)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--languages", type=int, default=4)
    ap.add_argument("--sequence-length", type=int, default=2048)
    ap.add_argument("--format", choices=["int64", "compact"], default="compact")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    n, v, l_, s = args.tokens, args.vocab, args.languages, args.sequence_length
    if n < 2 or v < 2 or l_ < 1 or s < 2 or l_ > 255:
        sys.exit("make_corpus: need --tokens ≥ 2, --vocab ≥ 2, 1 ≤ --languages ≤ 255, --sequence-length ≥ 2")
    if os.path.exists(args.out):
        sys.exit(f"make_corpus: {args.out} exists; remove it first")
    n_seq = (n + s - 1) // s
    starts = np.arange(n_seq, dtype=np.int64) * s
    seq_lang = (np.arange(n_seq) % l_).astype(np.uint8)
    # Per language, a permutation of the vocabulary: its Zipf ranks.
    rng0 = np.random.default_rng(args.seed)
    perms = np.stack([rng0.permutation(v) for _ in range(l_)])
    tok_dtype = np.int64 if args.format == "int64" else (np.uint16 if v <= 1 << 16 else np.uint32)

    def tokens():
        for c0 in range(0, n, CHUNK):
            c1 = min(n, c0 + CHUNK)
            rng = np.random.default_rng([args.seed, c0])
            ranks = np.minimum(rng.zipf(1.2, c1 - c0) - 1, v - 1)
            lang = seq_lang[np.arange(c0, c1) // s]
            t = perms[lang, ranks]
            # The bigram dependence: half the tokens are a function of the
            # one before (in the same language), the rest drawn afresh.
            follow = rng.random(c1 - c0) < 0.5
            t[1:][follow[1:]] = (t[:-1][follow[1:]] * 7 + 1 + lang[1:][follow[1:]]) % v
            yield t

    def languages():
        for c0 in range(0, n, CHUNK):
            c1 = min(n, c0 + CHUNK)
            yield seq_lang[np.arange(c0, c1) // s]

    tmp = args.out + ".tmp"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        write_member(zf, "token_ids", tok_dtype, n, tokens())
        if args.format == "int64":
            write_member(zf, "language_ids", np.int64, n, languages())
        else:
            write_member(zf, "sequence_languages", np.uint8, n_seq, iter([seq_lang]))
        write_member(zf, "sequence_starts", np.int64, n_seq, iter([starts]))
        for name, value in [("vocab_size", v), ("n_languages", l_)]:
            with zf.open(name + ".npy", "w") as f:
                np.lib.format.write_array(f, np.array(value, dtype=np.int64))
        with zf.open("language_names.npy", "w") as f:
            np.lib.format.write_array(f, np.array([f"lang{i}" for i in range(l_)]))
    os.replace(tmp, args.out)
    print(f"make_corpus: wrote {args.out}: {n} tokens, {n_seq} sequences, V {v}, L {l_}, {args.format} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
