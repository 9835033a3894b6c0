#!/usr/bin/env python3
"""Train tests/data/tokenize/tokenizer.json on tests/data/tokenize/text/.

    python tests/data/tokenize/train_tokenizer.py     # with `tokenizers` 0.23 installed

A byte-level BPE with a vocabulary of 2000 (1 special token, the 256 byte
symbols and 1743 merges at most): normalizer NFC; pre-tokenizer ByteLevel
(add_prefix_space=False, the GPT-2 split regex); decoder ByteLevel;
post-processor ByteLevel (trim_offsets=False); special token
"<|endoftext|>" with id 0. It then checks that decode(encode(text)) == text
for every file, and prints the number of ids per language.
"""

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = Path(__file__).resolve().parent
VOCAB_SIZE = 2000


def main():
    files = sorted((HERE / "text").rglob("*.txt"))
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(f) for f in files], trainer)
    tok.save(str(HERE / "tokenizer.json"))

    tok = Tokenizer.from_file(str(HERE / "tokenizer.json"))
    counts = {}
    for f in files:
        text = f.read_text(encoding="utf-8")
        ids = tok.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids, skip_special_tokens=False) == text, f"round trip failed for {f}"
        lang = f.parent.name
        counts[lang] = counts.get(lang, 0) + len(ids)
    print(f"vocab {tok.get_vocab_size(with_added_tokens=True)}, ids per language {counts}")


if __name__ == "__main__":
    main()
