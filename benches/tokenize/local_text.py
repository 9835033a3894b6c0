#!/usr/bin/env python3
"""Write a folder per language of real text found on this machine (nothing is fetched).

    python benches/tokenize/local_text.py OUT [--max-mb 4]

OUT/<lang>/ gets the manual pages of /usr/share/man/<lang>/ (gunzipped roff
source, one file per page; those that are not UTF-8 are skipped), and OUT/en/
also the licence texts of /usr/share/common-licenses and the English pages of
/usr/share/man/man*/, each language cut at --max-mb megabytes of text.
Languages with less than 100 kB of text are left out.
"""

import argparse
import gzip
from pathlib import Path

MAN = Path("/usr/share/man")
LICENSES = Path("/usr/share/common-licenses")


def text_of(path: Path):
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--max-mb", type=float, default=4.0)
    args = ap.parse_args()
    limit = int(args.max_mb * 1e6)
    sources = {"en": sorted(LICENSES.glob("*")) + sorted(MAN.glob("man*/*"))}
    for d in sorted(MAN.iterdir()):
        if d.is_dir() and not d.name.startswith("man"):
            sources[d.name] = sorted(p for p in d.rglob("*") if p.is_file())
    for lang, files in sources.items():
        texts, size = [], 0
        for f in files:
            if size >= limit:
                break
            if f.is_symlink() or not f.is_file():
                continue
            t = text_of(f)
            if t:
                texts.append((f, t))
                size += len(t.encode())
        if size < 100_000:
            continue
        dest = args.out / lang
        dest.mkdir(parents=True, exist_ok=True)
        for i, (f, t) in enumerate(texts):
            (dest / f"{i:05d}-{f.name.removesuffix('.gz')}.txt").write_text(t, encoding="utf-8")
        print(f"{lang}: {len(texts)} files, {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
