"""Checks d9d's layers against splitgrad with splitgrad.testing and prints what it finds.

    python python/examples/check_d9d.py [--max-examples N] [--seed S] [--out DIR]

Runs ``check_split_token_embeddings`` on d9d's ``SplitTokenEmbeddings`` and,
where it can be imported (it needs the ``d9d[cce]`` extra), ``check_lm_head``
on d9d's ``SplitLanguageModellingHead``. After each difference found it runs
the check again without the kinds of case the shrunk case holds (say, ids out
of range), so as to find the next one, until a run passes. Each difference's
shrunk case is written under ``--out`` as a golden case file. Needs torch,
hypothesis and d9d.
"""

import argparse
import sys

from splitgrad import testing


def hunt(name, check, factory, args):
    """Runs ``check`` until it passes, leaving out what each difference needed."""
    without, found = set(), 0
    while True:
        try:
            n = check(factory, seed=args.seed, max_examples=args.max_examples, without=sorted(without), out_dir=args.out)
        except testing.Difference as e:
            found += 1
            print(f"{name}, difference {found}:")
            print(e)
            new = (e.features & set(testing.FEATURES[e.layer])) - without
            if not new:
                print(f"{name}: nothing left to leave out; stopping")
                return found
            without |= new
            print(f"\n{name}: again, without {', '.join(sorted(without))}")
            continue
        rest = f" (without {', '.join(sorted(without))})" if without else ""
        print(f"{name}: no difference in {n} cases{rest}")
        return found


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-examples", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="d9d-differences", help="folder for the shrunk cases (golden case files)")
    args = p.parse_args()

    from d9d.module.block.embedding import SplitTokenEmbeddings

    total = hunt("d9d SplitTokenEmbeddings", testing.check_split_token_embeddings, SplitTokenEmbeddings, args)
    print()
    try:
        from d9d.module.block.head import SplitLanguageModellingHead
    except ImportError as e:
        print(f"d9d SplitLanguageModellingHead: not checked, it cannot be imported here ({type(e).__name__}: {e})")
    else:
        total += hunt("d9d SplitLanguageModellingHead", testing.check_lm_head, SplitLanguageModellingHead, args)
    print(f"\n{total} difference(s) found; cases in {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
