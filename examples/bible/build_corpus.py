"""Builds a Spanish-English corpus of Bible verses in the `folder:PATH` layout.

    python examples/bible/build_corpus.py --output=examples/bible/corpus [--seed=0]

Reads Debian's SWORD modules spaRV1909eb (Reina-Valera 1909) and engWEB2015eb (World
English Bible) with pysword, verse by verse over the KJV versification, and writes
OUTPUT/{train,validation,test}.{es,en} (one pair a line, aligned) and OUTPUT/manifest.json.

Three stages, each a few pure functions (they import without pysword, for the tests):

1. Cleaning. `clean_osis` turns a verse's OSIS markup into plain text (footnotes, cross
   references, Song of Songs speaker labels and WEB's glossary out; Psalm titles in, as the
   Spanish has them in its text; a space wherever the markup alone separated two words).
   `fix_drop_cap` and `drop_subscription` undo two habits of the printed Spanish.
2. Alignment. The Spanish module keeps the Spanish verse numbers in some chapters (Num 13,
   1 Sam 24, Job 39-40, Jonah 2, ...): a verse or two shifts, extra verses are appended to a
   chapter's last verse, missing ones are empty. `align_verses` pairs the verses of a book
   again by length and a word lexicon learnt from the other verses (`build_lexicon`), as
   Gale & Church (1993) align sentences; a pair may join two neighbouring verses of one
   chapter. Verses with no counterpart are dropped.
3. Split. `split_chapters` holds out whole chapters (by the English, KJV, reference) for
   test and validation, chosen by a seeded shuffle.
"""

import argparse
import collections
import functools
import glob
import html
import json
import math
import os
import random
import re
import subprocess
import sys
import zlib
from typing import NamedTuple

import tqdm

MODULES = {"es": ("spaRV1909eb", "sword-text-sparv"), "en": ("engWEB2015eb", "sword-text-web")}
SWORD_PATH = "/usr/share/sword"
SPLIT_SIZES = {"test": 1000, "validation": 500}  # pairs held out, in whole chapters

# --- 1. Cleaning ----------------------------------------------------------------------------

_NOTE = "\x00"  # where a footnote was: a space if it stood between two words, else nothing
_STRUCTURE = "l|lg|lb|p|div|chapter|list|item|milestone|br"  # tags that end a line or block
_CLITICS = {"me", "te", "se", "lo", "la", "le", "nos", "os", "los", "las", "les"}
_SHORT_VERBS = {"di", "da", "haz", "vi"}  # verbs that take enclitics with no accent or -r/-d
_NOT_VERBS = {"Jehová", "Josué", "ejército", "cuánto"}  # accented words that are not verbs


def clean_osis(markup: str) -> str:
    """Plain text of one verse of OSIS markup, on one line."""
    text = re.split(r'<div\b[^>]*type="glossary"', markup)[0]  # WEB appends it to Rev 22:21
    text = re.sub(r"<note\b.*?</note>", _NOTE, text, flags=re.S)
    text = re.sub(r"<speaker\b.*?</speaker>", " ", text, flags=re.S)  # "Beloved" (Song)
    text = re.sub(r'<title\b[^>]*canonical="true"[^>]*>(.*?)</title>', _title, text, flags=re.S)
    text = re.sub(r"<title\b.*?</title>", " ", text, flags=re.S)  # headings not in the text
    text = _space_added_words(text)
    text = re.sub(rf"</?(?:{_STRUCTURE})\b[^>]*>", " ", text)
    text = re.sub(r"<[^>]*>", "", text)  # inline tags: <w> (Strong's numbers), <q>, ...
    text = re.sub(rf"(?<=[^\s{_NOTE}]){_NOTE}+(?=[\w“‘(¿¡])", " ", text)  # "only born Son"
    return " ".join(html.unescape(text.replace(_NOTE, "")).split())


def _title(match) -> str:
    """A Psalm's title, kept as a sentence (the Spanish has it at the start of verse 1)."""
    title = " ".join(re.sub(r"<[^>]*>", "", match[1]).split())
    return f" {title}{'' if title.endswith(('.', '!', '?')) else '.'} " if title else " "


def _space_added_words(markup: str) -> str:
    """Spaces around the Spanish translators' added words (<transChange>), which the markup
    often writes flush against the tagged words: "oyéndo</w><transChange>lo</transChange>
    <w>Jesús" is "oyéndolo Jesús". An added clitic pronoun joins a verb before it (an
    infinitive, imperative, gerund or accented form: "díjole", "sacarla"); else a space.
    Inside one <w> ("preguntándo<transChange>le") the parts stay joined."""
    def boundary(m):
        word, tags, following = m[1], m[2], m[3]
        if "transChange" not in tags or not re.search(r"</?w\b", tags):
            return m[0]
        joined = tags.startswith("</w><transChange") and _is_enclitic(word, following)
        return f"{word}{tags}{'' if joined else ' '}"

    tags = r"(?:</?w\b[^>]*>|</?transChange\b[^>]*>)+"
    return re.sub(rf"(\w+)({tags})(?=(\w+))", boundary, markup)


def _is_enclitic(verb: str, pronoun: str) -> bool:
    verb_like = verb.lower() in _SHORT_VERBS or re.search(r"(?:r|d|ndo)$|[áéíóú]", verb)
    return pronoun.lower() in _CLITICS and bool(verb_like) and verb not in _NOT_VERBS


def fix_drop_cap(text: str, lowercase_words: set) -> str:
    """A chapter's first verse without the printed capitals of its first word or two: "EN
    el principio" -> "En el principio", "DE SIETE años" -> "De siete años", "Y DESPUÉS
    movió" -> "Y después movió" (mid-sentence, a word seen in lowercase elsewhere), "Y JACOB
    se fué" -> "Y Jacob se fué". The capitals must open a sentence or follow one word;
    "ALEPH." (a heading of Psalm 119) keeps them."""
    m = re.search(r"\b[A-ZÁÉÍÓÚÑÜ]{2,}(?: [A-ZÁÉÍÓÚÑÜ]{2,})?\b(?!\.)", text)
    if not m:
        return text
    opens = re.fullmatch(r"(?:.*[.!?:] )?[¡¿“‘(]*", text[:m.start()])
    if not opens and not re.fullmatch(r"(?:.*[.!?:] )?[¡¿“‘(]*\w+ ", text[:m.start()]):
        return text
    words = [w.capitalize() if (k == 0 and opens) or w.lower() not in lowercase_words
             else w.lower() for k, w in enumerate(m[0].split(" "))]
    return text[:m.start()] + " ".join(words) + text[m.end():]


def drop_subscription(text: str) -> str:
    """A Pauline epistle's last verse without the note the Spanish prints after "Amén."
    ("Fué escrita á los Hebreos desde Italia con Timoteo."); the English has none."""
    return re.sub(r"(?<=Amén\.)\s+[^.]*\b(?:escrita|enviada)\b[^.]*\.$", "", text)


ARTEFACTS = {  # what a clean verse never holds (or holds only as the text itself does)
    "markup < >": r"[<>]",
    "word joined to a capital (bornSon)": r"[a-zà-ÿ][A-ZÀ-Ý]",
    "punctuation then letter (Christ,the)": r"[,;:!?][^\W\d_]",
    "space twice, or at an end": r"\s\s|^\s|\s$",
    "digit": r"\d",
    "Strong's number": r"strong:|\b[HG]\d{4}\b",
    "brackets, pilcrow, section sign": r"[\[\]{}¶§]",
    "word in capitals (2+ letters)": r"\b[A-ZÁÉÍÓÚÑÜ]{2,}\b",
}


def artefact_counts(texts) -> dict:
    """Verses matching each pattern of ARTEFACTS."""
    texts = list(texts)
    return {name: sum(1 for t in texts if re.search(p, t)) for name, p in ARTEFACTS.items()}


# --- 2. Alignment ---------------------------------------------------------------------------


class Verse(NamedTuple):
    ref: tuple  # (book, chapter, verse), KJV numbering
    text: str
    words: frozenset  # lowercased word types


def make_verse(ref, text: str) -> Verse:
    return Verse(tuple(ref), text, frozenset(re.findall(r"\w+", text.lower())))


def build_lexicon(pairs, *, min_dice: float = 0.25, max_share: float = 0.05) -> dict:
    """Translations of Spanish words, from the verse pairs `(es, en)` given (those with the
    same reference): English words whose Dice coefficient of co-occurrence in a verse pair
    is at least `min_dice`. Words in more than `max_share` of the verses (y, the) are left
    out: they co-occur with everything."""
    es_count = collections.Counter(w for es, _ in pairs for w in es.words)
    en_count = collections.Counter(w for _, en in pairs for w in en.words)
    too_common = max_share * len(pairs)
    both = collections.Counter()
    for es, en in pairs:
        es_words = [w for w in es.words if 2 <= es_count[w] <= too_common]
        en_words = [w for w in en.words if 2 <= en_count[w] <= too_common]
        both.update((e, f) for e in es_words for f in en_words)
    lexicon = collections.defaultdict(set)
    for (e, f), n in both.items():
        if n >= 2 and 2 * n / (es_count[e] + en_count[f]) >= min_dice:
            lexicon[e].add(f)
    return {e: frozenset(fs) for e, fs in lexicon.items()}


def similarity(es_words, en_words, lexicon) -> float:
    """The share of the Spanish words in the lexicon that have a translation among the
    English words; 0.5 (no evidence) when none is in the lexicon."""
    known = [w for w in es_words if w in lexicon]
    return sum(1 for w in known if lexicon[w] & en_words) / len(known) if known else 0.5


# Bead (Spanish verses, English verses) -> -log prior: Gale & Church's shapes, with 1-1 far
# likelier than their 0.89 (verse numbers mostly agree) and a 2-2 for verses divided apart.
_BEADS = {(1, 1): -math.log(0.98), (1, 0): -math.log(0.001), (0, 1): -math.log(0.001),
          (2, 1): -math.log(0.005), (1, 2): -math.log(0.005), (2, 2): -math.log(0.002)}
_LEXICAL_WEIGHT = 6.0  # cost of a pair whose words do not translate each other at all
_SAME_REFERENCE = 1.0  # bonus of a 1-1 pair with equal references
_EN_PER_ES = math.exp(0.038)  # English characters per Spanish one (geometric mean, verses)
_VARIANCE = 6.8  # Gale & Church's s^2


def _length_cost(es_chars: int, en_chars: int) -> float:
    """-log P(lengths | a true pair), Gale & Church's delta under a normal law."""
    delta = (en_chars - es_chars * _EN_PER_ES) / math.sqrt(max(es_chars, 1) * _VARIANCE)
    return -math.log(max(math.erfc(abs(delta) / math.sqrt(2)), 1e-12))


def _bead_cost(es: list, en: list, lexicon) -> float:
    if not es or not en:
        return 0.0
    if len({v.ref[:2] for v in es}) > 1 or len({v.ref[:2] for v in en}) > 1:
        return math.inf  # joins verses of one chapter only (a chapter is held out whole)
    cost = _length_cost(sum(len(v.text) for v in es), sum(len(v.text) for v in en))
    cost += _LEXICAL_WEIGHT * (1 - similarity(frozenset().union(*(v.words for v in es)),
                                              frozenset().union(*(v.words for v in en)),
                                              lexicon))
    if len(es) == len(en) == 1 and es[0].ref == en[0].ref:
        cost -= _SAME_REFERENCE
    return cost


def align_verses(es: list, en: list, lexicon, *, band: int = 10) -> list:
    """The cheapest monotone pairing of two lists of verses (one book), as (es_verses,
    en_verses) beads of the shapes in _BEADS; a bead with an empty side is a verse left out.
    Dynamic programming over (i, j), |i - j| <= band."""
    cost, back = {(0, 0): 0.0}, {}
    for i in range(len(es) + 1):
        for j in range(max(0, i - band), min(len(en), i + band) + 1):
            for (a, b), prior in _BEADS.items():
                if (i - a, j - b) in cost and (i, j) != (0, 0):
                    c = cost[i - a, j - b] + prior + _bead_cost(es[i - a:i], en[j - b:j], lexicon)
                    if c < cost.get((i, j), math.inf):
                        cost[i, j], back[i, j] = c, (i - a, j - b)
    beads, (i, j) = [], (len(es), len(en))
    while (i, j) != (0, 0):
        pi, pj = back[i, j]
        beads.append((es[pi:i], en[pj:j]))
        i, j = pi, pj
    return beads[::-1]


# --- 3. Split -------------------------------------------------------------------------------


def split_chapters(chapter_sizes: dict, *, seed: int, sizes: dict = SPLIT_SIZES) -> dict:
    """{chapter: "train" | "validation" | "test"}: chapters in a shuffled order (fixed by
    `seed`) fill each held-out split up to its size in pairs (`sizes`, in order), each
    chapter only where it still fits; all others train."""
    order = list(chapter_sizes)
    random.Random(seed).shuffle(order)
    split_of = {}
    for split, size in sizes.items():
        filled = 0
        for chapter in order:
            if chapter not in split_of and filled + chapter_sizes[chapter] <= size:
                split_of[chapter] = split
                filled += chapter_sizes[chapter]
    return {chapter: split_of.get(chapter, "train") for chapter in chapter_sizes}


# --- Reading the modules, writing the corpus ------------------------------------------------


def read_modules(sword_path: str) -> tuple[dict, dict]:
    """{lang: [(ref, OSIS markup)]} over the KJV versification, and {lang: module info}."""
    if missing := _missing(sword_path):
        sys.exit(f"error: {'; '.join(missing)}")
    from pysword.canons import canons
    from pysword.modules import SwordModules

    modules = SwordModules(sword_path)
    found = modules.parse_modules()
    books = [(name, osis, lengths) for testament in ("ot", "nt")
             for name, osis, _, lengths in canons["kjv"][testament]]
    verses, info = {}, {}
    for lang, (name, package) in MODULES.items():
        try:  # a module whose .conf is there but whose text is not, or is damaged
            bible = modules.get_bible_from_module(name)
            if hasattr(bible, "_decompressed_text"):  # pysword unzips a whole book per verse
                bible._decompressed_text = functools.lru_cache(maxsize=4)(
                    bible._decompressed_text)
            verses[lang] = [((osis, c, v), _verse(bible, book, c, v))
                            for book, osis, lengths in books
                            for c, count in enumerate(lengths, 1) for v in range(1, count + 1)]
        except (OSError, ValueError, zlib.error) as error:
            sys.exit(f"error: SWORD module {name} in {sword_path} cannot be read ({error}); "
                     f"reinstall it with: apt-get install --reinstall {package}")
        conf = found[name]
        info[lang] = {"module": name, "description": conf.get("description"),
                      "version": conf.get("version"), "date": conf.get("swordversiondate"),
                      "versification": conf.get("versification"),
                      "license": conf.get("distributionlicense"),
                      "debian_package": package, "debian_version": _debian_version(package)}
        print(f"read {len(verses[lang]):,} verses of {name} {conf.get('version')}", flush=True)
    return verses, info


def _missing(sword_path: str) -> list[str]:
    """What to install before reading, all of it at once: pysword, and the modules that
    no `mods.d/*.conf` of `sword_path` names (in a line "[ModuleName]", after comments)."""
    missing = []
    try:
        import pysword  # noqa: F401
    except ImportError:
        missing.append("pysword is not installed; install it with: pip install pysword")
    named = set()
    for conf in glob.glob(os.path.join(sword_path, "mods.d", "*.conf")):
        with open(conf, encoding="utf-8", errors="replace") as f:
            named.update(re.findall(r"^\[([^\]]+)\]\s*$", f.read(), flags=re.MULTILINE))
    if absent := [(name, package) for name, package in MODULES.values() if name not in named]:
        missing.append(f"SWORD module{'s' * (len(absent) > 1)} "
                       f"{' and '.join(name for name, _ in absent)} not found in {sword_path}; "
                       f"install {'them' if len(absent) > 1 else 'it'} with: apt-get install "
                       f"{' '.join(package for _, package in absent)} (or give --sword_path)")
    return missing


def _verse(bible, book: str, chapter: int, verse: int) -> str:
    try:
        return bible.get(books=book, chapters=chapter, verses=verse, clean=False)
    except ValueError:  # a verse this module's versification lacks
        return ""


def _debian_version(package: str):
    try:
        return subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], text=True,
                              capture_output=True, check=True).stdout or None
    except (OSError, subprocess.CalledProcessError):
        return None


def clean_bible(raw: dict) -> dict:
    """{lang: [Verse]} of the verses with text, cleaned (the Spanish fixes included)."""
    texts = {lang: [(ref, clean_osis(markup)) for ref, markup in verses]
             for lang, verses in raw.items()}
    lowercase = {w for _, t in texts["es"] for w in re.findall(r"\w+", t) if w.islower()}
    texts["es"] = [(ref, drop_subscription(fix_drop_cap(t, lowercase) if ref[2] == 1 else t))
                   for ref, t in texts["es"]]
    return {lang: [make_verse(ref, t) for ref, t in pairs if t] for lang, pairs in texts.items()}


def align_bible(verses: dict) -> tuple[list, collections.Counter]:
    """Pairs (chapter, es text, en text) book by book, and how many beads of each kind."""
    by_ref = {v.ref: v for v in verses["en"]}
    lexicon = build_lexicon([(v, by_ref[v.ref]) for v in verses["es"] if v.ref in by_ref])
    books = collections.defaultdict(lambda: {"es": [], "en": []})
    for lang in ("es", "en"):
        for v in verses[lang]:
            books[v.ref[0]][lang].append(v)
    pairs, kinds = [], collections.Counter()
    for book in tqdm.tqdm(books.values(), desc="aligning", unit="book"):
        for es, en in align_verses(book["es"], book["en"], lexicon):
            same = len(es) == len(en) == 1 and es[0].ref == en[0].ref
            kinds["dropped es verse" if not en else "dropped en verse" if not es else
                  "1-1, same reference" if same else f"{len(es)}-{len(en)}, realigned"] += 1
            if es and en:
                pairs.append((en[0].ref[:2], " ".join(v.text for v in es),
                               " ".join(v.text for v in en)))
    return pairs, kinds


def check_writable(output: str) -> None:
    """Exits in one line unless `output` is a folder, or can be made, that this user may
    write. Nothing is made: a run that stops later (no pysword, no modules) leaves no
    empty folder behind."""
    path = os.path.abspath(output)
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        sys.exit(f"error: cannot make --output={output}: {path} is not a folder")
    if not os.access(path, os.W_OK | os.X_OK):
        sys.exit(f"error: cannot write into --output={output} ({path} is not writable)")


def write_corpus(output: str, pairs: list, split_of: dict) -> dict:
    """OUTPUT/{split}.{es,en}; the number of pairs in each split."""
    os.makedirs(output, exist_ok=True)
    counts = {}
    for split in ("train", "validation", "test"):
        chosen = [p for p in pairs if split_of[p[0]] == split]
        for index, lang in ((1, "es"), (2, "en")):
            with open(os.path.join(output, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(p[index] + "\n" for p in chosen)
        counts[split] = len(chosen)
    return counts


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", required=True, help="folder for the corpus")
    parser.add_argument("--seed", type=int, default=0, help="chooses the held-out chapters")
    parser.add_argument("--sword_path", default=os.environ.get("SWORD_PATH", SWORD_PATH),
                        help="SWORD library holding mods.d/ (default %(default)s)")
    args = parser.parse_args(argv)
    check_writable(args.output)  # now, not after the minute of reading and aligning
    raw, sources = read_modules(args.sword_path)
    verses = clean_bible(raw)
    print(f"with text: {len(verses['es']):,} Spanish and {len(verses['en']):,} English "
          f"verses; learning a lexicon, then aligning", flush=True)
    pairs, kinds = align_bible(verses)
    sizes = collections.Counter(chapter for chapter, _, _ in pairs)
    split_of = split_chapters(sizes, seed=args.seed)
    counts = write_corpus(args.output, pairs, split_of)
    held_out = {s: [f"{b} {c}" for (b, c), x in split_of.items() if x == s]
                for s in ("validation", "test")}
    manifest = {"sources": sources, "seed": args.seed, "pairs": counts,
                "chapters": {"train": sum(1 for x in split_of.values() if x == "train"),
                             **{s: len(c) for s, c in held_out.items()}},
                "held_out_chapters": held_out, "alignment": dict(kinds),
                "artefacts_left": {lang: artefact_counts(p[i] for p in pairs)
                                   for i, lang in ((1, "es"), (2, "en"))}}
    with open(os.path.join(args.output, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, ensure_ascii=False)
    print("alignment: " + ", ".join(f"{n:,} {kind}" for kind, n in sorted(kinds.items())))
    for split, n in counts.items():
        print(f"{split}: {n:,} pairs ({manifest['chapters'][split]} chapters)")
    print(f"wrote {args.output}/{{train,validation,test}}.{{es,en}} and manifest.json")


if __name__ == "__main__":
    main()
