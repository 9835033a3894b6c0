#!/usr/bin/env python3
"""Time Python `tokenizers`' encode_batch on the files `splitgrad tokenize` reads.

    python benches/tokenize/encode_batch.py TOKENIZER.json DIR [DIR ...]

Every regular file under each DIR (sorted by path, hidden ones skipped), read
as UTF-8, is one input of encode_batch(add_special_tokens=False). Prints the
seconds of encode_batch alone (reading excluded) and the number of ids.
"""

import sys
import time
from pathlib import Path

from tokenizers import Tokenizer


def main():
    tok = Tokenizer.from_file(sys.argv[1])
    files = []
    for d in sys.argv[2:]:
        files += sorted(
            p for p in Path(d).rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(d).parts)
        )
    texts = [f.read_text(encoding="utf-8") for f in files]
    t0 = time.perf_counter()
    enc = tok.encode_batch(texts, add_special_tokens=False)
    t1 = time.perf_counter()
    print(f"encode_batch {t1 - t0:.3f} s, {len(files)} files, {sum(len(e.ids) for e in enc)} ids")


if __name__ == "__main__":
    main()
