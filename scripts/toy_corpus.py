#!/usr/bin/env python3
"""Write a small synthetic translation corpus, deterministically (the quickstart's data).

The source is English-like; the target is an invented language that differs from it the way
real language pairs do, so the model must translate, not copy:

- vocabulary: every word maps to an unrelated target stem;
- agreement: target determiners and adjectives take the noun's gender (fixed per noun, not
  visible in the source) and number; the verb agrees with the subject's number;
- reordering: adjectives follow the noun (in reverse order), the verb goes to the end of its
  clause (subject-object-verb), and a prepositional phrase moves to the front as a
  postpositional phrase.

    the clever keys open the poor lamp.
    los nagien tegu-kes la lera dono-zu veran.
    the small strong gardens meet the singers above the lamp.
    la lera page los tokuen nita-kes noni-kes las ruleen pozen.
    (PP "la lera page" first, subject, object, verb "poze" + plural "n")

    python scripts/toy_corpus.py --out-dir runs/toy   # train/valid/test .src/.tgt
"""

import argparse
import os
import random
import sys

NOUNS = """cat dog bird horse house tree river car boat girl boy farmer teacher doctor king
queen friend child apple flower garden city road bridge window door table chair book letter
song lamp key ship island mountain forest village market student painter baker
soldier singer hunter sailor mirror basket bottle candle coat hat shoe ring wall tower""".split()
ADJECTIVES = """small big red green old young happy sad tall quiet brave clever strong warm cold
dark bright heavy light quick slow rich poor kind wild""".split()
VERBS = """see like find help follow paint visit call meet hold want need bring open""".split()
PREPOSITIONS = "near behind under above beside inside".split()
DETERMINERS = {"the": ("lo", "la", "los", "las"), "a": ("un", "una", "unos", "unas")}
SOURCE_PLURAL_INDEFINITE = "some"  # "a" has no plural in English


def invented_words(n: int, seed: int):
    """n distinct pronounceable target stems, the same on every run."""
    rng = random.Random(seed)
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    words = []
    while len(words) < n:
        word = "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(2))
        if word not in words:
            words.append(word)
    return words


STEMS = dict(
    zip(
        NOUNS + ADJECTIVES + VERBS + PREPOSITIONS,
        invented_words(len(NOUNS) + len(ADJECTIVES) + len(VERBS) + len(PREPOSITIONS), seed=7),
    )
)
GENDER = {noun: i % 2 for i, noun in enumerate(NOUNS)}  # 0 masculine, 1 feminine


def noun_phrase(rng):
    """(source words, target words, plural?) of a random noun phrase."""
    noun, plural = rng.choice(NOUNS), rng.random() < 0.4
    definite = rng.random() < 0.5
    adjectives = rng.sample(ADJECTIVES, rng.choice([0, 0, 1, 1, 2]))
    gender = GENDER[noun]
    det_src = "the" if definite else (SOURCE_PLURAL_INDEFINITE if plural else "a")
    det_tgt = DETERMINERS["the" if definite else "a"][gender + 2 * plural]
    src = [det_src, *adjectives, noun + ("s" if plural else "")]
    adj_tgt = [STEMS[a] + ("-ke", "-zu")[gender] + ("s" if plural else "") for a in reversed(adjectives)]
    tgt = [det_tgt, STEMS[noun] + ("en" if plural else ""), *adj_tgt]
    return src, tgt, plural


def clause(rng):
    subj_src, subj_tgt, subj_plural = noun_phrase(rng)
    obj_src, obj_tgt, _ = noun_phrase(rng)
    verb = rng.choice(VERBS)
    src = [*subj_src, verb if subj_plural else verb + "s", *obj_src]
    tgt = [*subj_tgt, *obj_tgt, STEMS[verb] + ("n" if subj_plural else "t")]
    if rng.random() < 0.4:
        prep = rng.choice(PREPOSITIONS)
        pp_src, pp_tgt, _ = noun_phrase(rng)
        src += [prep, *pp_src]
        tgt = [*pp_tgt, STEMS[prep], *tgt]
    return src, tgt


def sentence_pair(rng):
    src, tgt = clause(rng)
    if rng.random() < 0.2:
        src2, tgt2 = clause(rng)
        src, tgt = src + ["and", *src2], tgt + ["e", *tgt2]
    return " ".join(src) + ".", " ".join(tgt) + "."  # detokenized, as raw text is


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", required=True, help="folder for {train,valid,test}.{src,tgt}")
    parser.add_argument("--train", type=int, default=20000, help="training sentence pairs (default %(default)s)")
    parser.add_argument("--valid", type=int, default=500, help="validation sentence pairs (default %(default)s)")
    parser.add_argument("--test", type=int, default=500, help="test sentence pairs (default %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="corpus seed (default %(default)s)")
    args = parser.parse_args(argv)
    if min(args.train, args.valid, args.test) < 1:
        parser.error("--train, --valid and --test must be at least 1")

    os.makedirs(args.out_dir, exist_ok=True)
    rng = random.Random(args.seed)
    for split in ("train", "valid", "test"):
        pairs = [sentence_pair(rng) for _ in range(getattr(args, split))]
        for side, lang in ((0, "src"), (1, "tgt")):
            with open(os.path.join(args.out_dir, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(pair[side] + "\n" for pair in pairs)
    print(
        f"toy_corpus.py: wrote {args.train}/{args.valid}/{args.test} sentence pairs to {args.out_dir}", file=sys.stderr
    )


if __name__ == "__main__":
    main()
