"""examples/bible/build_corpus.py: cleaning, alignment and the chapter split, on hand-written
markup (the artefacts found in the real modules) and synthetic verses; no pysword, no SWORD
modules. And config.py: train.py's checks, and the checkpoints it averages."""

import collections
import functools
import importlib.util
import json
import pathlib
import random
import sys
import types

import pytest

from transformer_jax.config_checks import check_config
from transformer_jax.data.sources import read_folder_split

_PATH = pathlib.Path(__file__).parent.parent / "examples" / "bible" / "build_corpus.py"
_SPEC = importlib.util.spec_from_file_location("bible_build_corpus", _PATH)
bible = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bible)


# --- Cleaning -------------------------------------------------------------------------------

@pytest.mark.parametrize("markup, text", [
    # John 3:16 (WEB): pysword's plain text reads "only bornSon" where a footnote was.
    ('<w lemma="strong:G3439">only</w> born</q><note placement="foot"><reference type="anno'
     'tateRef">3:16 </reference>The phrase “only born” is from the Greek word.</note><q mark'
     'er="" who="Jesus"><w lemma="strong:G5207">Son</w>, that',
     "only born Son, that"),
    # Gen 1:1 and Matt 1:1: "Godcreated", "Christ,the".
    ('<w lemma="strong:H0430">God</w><note placement="foot">The Hebrew word is “אֱלֹהִ֑ים”.'
     '</note><w lemma="strong:H1254">created</w>', "God created"),
    ('<w>Christ</w>,<note placement="foot">Messiah</note><w>the</w> son', "Christ, the son"),
    # A footnote before punctuation or a space leaves nothing behind.
    ('<w>offspring</w>,<note placement="foot">or, seed</note> <w>who</w>', "offspring, who"),
    ('<w>cornerstone</w>.<note placement="foot">Literally, <rdg type="alternate">head of the'
     ' corner</rdg></note><l eID="a" level="2"/>', "cornerstone."),
    ('<w>him</w><note type="crossReference"><reference>Exodus 30:12</reference></note>.',
     "him."),
    # Song 1:2: speaker labels are not in the Spanish.
    ('<speaker>Beloved</speaker> <lg sID="g1"/> <l level="1" sID="g2"/>Let him kiss me',
     "Let him kiss me"),
    # Psalm titles stay (the Spanish has them in verse 1); other headings go.
    ('<div type="x-milestone" subType="x-preverse" sID="p"/><title canonical="true" type="'
     'psalm">A Psalm by David, when he fled.</title> <lg sID="g"/>Yahweh, how',
     "A Psalm by David, when he fled. Yahweh, how"),
    ('<title canonical="true" type="psalm">ALEPH</title> <l level="1" sID="a"/>'
     '<w lemma="strong:H0835">Blessed</w> are', "ALEPH. Blessed are"),
    ('Amen. <title level="1" type="main">Glossary</title>', "Amen."),
    # Rev 22:21 (WEB): the glossary that follows the last verse.
    ('the saints. Amen.  <chapter eID="Rev.22"/> <div sID="g" type="glossary"/> <list> '
     '<item><seg type="keyword">Abaddon</seg> Abaddon is Hebrew</item>', "the saints. Amen."),
    # Poetry lines flush against each other, spaces twice and at the ends.
    ('  increased!<l eID="a" level="1"/><l level="2" sID="b"/>Many  are  ', "increased! Many are"),
    ("Tom &amp; Jerry", "Tom & Jerry"),
    # Strong's numbers live in attributes and go with the tags.
    ('<w lemma="strong:H7225">EN el principio</w> <w lemma="strong:H1254 H0430">crió</w>',
     "EN el principio crió"),
])
def test_clean_osis_removes_markup_and_keeps_words_apart(markup, text):
    assert bible.clean_osis(markup) == text


@pytest.mark.parametrize("markup, text", [
    # Added words (<transChange>) flush against tagged words: a space, ...
    ('<w>gentes</w><transChange type="added">lo</transChange><w>oyeron</w>', "gentes lo oyeron"),
    ('<w>allí</w><transChange type="added">también</transChange> <w>hay</w>',
     "allí también hay"),
    ('<w>Estas</w><transChange type="added"><w>son las medidas</w> <w>de que</w>'
     '</transChange><w>Salomón</w> <w>fundó</w>', "Estas son las medidas de que Salomón fundó"),
    ('<w>Josué</w><transChange type="added">los</transChange> circuncidó',
     "Josué los circuncidó"),
    # ... but an added clitic pronoun joins the verb before it ...
    ('<w>Y</w> <w>oyéndo</w><transChange type="added">lo</transChange><w>Jesús</w>',
     "Y oyéndolo Jesús"),
    ('<w>sacar</w><transChange type="added">la</transChange>', "sacarla"),
    ('<w>Dad</w><transChange type="added">me</transChange> <w>varones</w>', "Dadme varones"),
    # ... and the parts of one tagged word stay together.
    ('<w>al pythón</w>, preguntándo<transChange type="added">le</transChange>, ',
     "al pythón, preguntándole,"),
])
def test_clean_osis_spaces_added_spanish_words(markup, text):
    assert bible.clean_osis(markup) == text


@pytest.mark.parametrize("text, fixed", [
    ("EN el principio crió Dios", "En el principio crió Dios"),
    ("Y DESPUÉS movió el pueblo", "Y después movió el pueblo"),
    ("Y JACOB se fué su camino", "Y Jacob se fué su camino"),  # never seen in lowercase
    ("DE SIETE años era Joas", "De siete años era Joas"),
    ("Al Músico principal: Salmo de David. OYE, oh Dios", "Al Músico principal: Salmo de "
     "David. Oye, oh Dios"),
    ("Salmo de David. ¡OH Jehová, cuánto", "Salmo de David. ¡Oh Jehová, cuánto"),
    ("ALEPH. BIENAVENTURADOS los perfectos", "ALEPH. Bienaventurados los perfectos"),
    ("este nombre glorioso y terrible, JEHOVÁ TU DIOS,",  # capitals in the text stay
     "este nombre glorioso y terrible, JEHOVÁ TU DIOS,"),
    ("Dios dijo: Hágase la luz", "Dios dijo: Hágase la luz"),
])
def test_fix_drop_cap(text, fixed):
    lowercase = {"en", "después", "siete", "oye", "oh", "bienaventurados", "estrella"}
    assert bible.fix_drop_cap(text, lowercase) == fixed


def test_drop_subscription_only_after_the_last_amen():
    assert bible.drop_subscription(
        "La gracia sea con todos vosotros. Amén. Fué escrita á los Hebreos desde Italia con "
        "Timoteo.") == "La gracia sea con todos vosotros. Amén."
    kept = "Amén. Y la tierra fué escrita en el libro de la vida, y enviada."
    assert bible.drop_subscription(kept + " Otra frase más.") == kept + " Otra frase más."


def test_artefact_counts_flag_the_plain_text_of_pysword():
    plain = ["that he gave his only bornSon, that ", "Jesus Christ,the son of David",
             "<w>Dios</w>", "ver 3:16", "Beloved\u00b6 said"]
    counts = bible.artefact_counts(plain)
    assert counts["word joined to a capital (bornSon)"] == 1
    assert counts["punctuation then letter (Christ,the)"] == 1
    assert counts["space twice, or at an end"] == 1
    assert counts["markup < >"] == 1 and counts["digit"] == 1
    assert counts["brackets, pilcrow, section sign"] == 1
    assert set(bible.artefact_counts(["In the beginning, God created."]).values()) == {0}


# --- Alignment ------------------------------------------------------------------------------

def verse(book, chapter, number, text):
    return bible.make_verse((book, chapter, number), text)


def test_build_lexicon_pairs_words_that_occur_together():
    spanish = ["perro", "gato", "casa", "agua", "sol", "luna", "pan", "vino", "mar", "monte"]
    english = ["dog", "cat", "house", "water", "sun", "moon", "bread", "wine", "sea", "hill"]
    rng, pairs = random.Random(0), []
    for i in range(200):
        chosen = rng.sample(range(10), 2)
        pairs.append((verse("Gen", 1, i, "y " + " ".join(spanish[k] for k in chosen)),
                      verse("Gen", 1, i, "and " + " ".join(english[k] for k in chosen))))
    lexicon = bible.build_lexicon(pairs, max_share=0.5)
    assert all(lexicon[e] == {f} for e, f in zip(spanish, english))
    assert "y" not in lexicon  # in every verse: it co-occurs with everything
    assert bible.similarity({"perro", "sol", "ballena"}, {"dog", "sun"}, lexicon) == 1.0
    assert bible.similarity({"perro", "sol"}, {"dog", "the"}, lexicon) == 0.5
    assert bible.similarity({"gato"}, {"dog"}, lexicon) == 0.0
    assert bible.similarity({"ballena"}, {"whale"}, lexicon) == 0.5  # no evidence


def test_align_verses_follows_the_words_not_the_numbers():
    """A book numbered as the Spanish module numbers Num 12-13: English 12:16 is Spanish
    13:1, and the Spanish 13:10 holds two verses (the module appends the extra verse to the
    chapter's last). Verse k's words are wk / tk, all of one length."""
    lexicon = {f"w{k:02d}": frozenset({f"t{k:02d}"}) for k in range(40)}
    en = [verse("Num", 12, v, f"t{v:02d} xx") for v in range(1, 17)]
    en += [verse("Num", 13, v, f"t{16 + v:02d} xx") for v in range(1, 11)]
    es = [verse("Num", 12, v, f"w{v:02d} xx") for v in range(1, 16)]
    es += [verse("Num", 13, v, f"w{15 + v:02d} yy") for v in range(1, 10)]
    es.append(verse("Num", 13, 10, "w25 zz w26 zz"))
    beads = bible.align_verses(es, en, lexicon)
    words = [([v.text[1:3] for v in e], [v.text[1:3] for v in f]) for e, f in beads]
    assert words == [([f"{k:02d}"], [f"{k:02d}"]) for k in range(1, 25)] + [(["25"], ["25", "26"])]
    assert ([v.ref for v in beads[15][0]], [v.ref for v in beads[15][1]]) == (
        [("Num", 13, 1)], [("Num", 12, 16)])  # the verse that moved across the chapter break


def test_align_verses_joins_verses_of_one_chapter_only():
    """One Spanish verse holding the words of two English ones: joined within a chapter, not
    across a chapter break (a held-out chapter must not share a pair with another)."""
    lexicon = {"w1": frozenset({"t1"}), "w2": frozenset({"t2"})}
    es = [verse("Acts", 19, 40, "w1 aaaa w2 bbbb")]
    def refs(beads):
        return [([v.ref[1:] for v in e], [v.ref[1:] for v in f]) for e, f in beads]

    same_chapter = [verse("Acts", 19, 40, "t1 aaaa"), verse("Acts", 19, 41, "t2 bbbb")]
    assert refs(bible.align_verses(es, same_chapter, lexicon)) == [([(19, 40)],
                                                                    [(19, 40), (19, 41)])]
    two_chapters = [verse("Acts", 19, 40, "t1 aaaa"), verse("Acts", 20, 1, "t2 bbbb")]
    assert refs(bible.align_verses(es, two_chapters, lexicon)) == [([(19, 40)], [(19, 40)]),
                                                                   ([], [(20, 1)])]


def test_align_verses_keeps_agreeing_numbers_without_evidence():
    es = [verse("Ps", 1, v, f"uno dos tres {v}") for v in range(1, 7)]
    en = [verse("Ps", 1, v, f"one two three {v}") for v in range(1, 7)]
    beads = bible.align_verses(es, en, {})
    assert [(e[0].ref, f[0].ref) for e, f in beads] == [(v.ref, v.ref) for v in es]


# --- Split ----------------------------------------------------------------------------------

def synthetic_chapter_sizes(seed=3):
    rng = random.Random(seed)
    return {(f"B{b:02d}", c): rng.randint(3, 60) for b in range(40) for c in range(1, 31)}


def test_split_chapters_holds_out_whole_chapters_near_the_asked_sizes():
    sizes = synthetic_chapter_sizes()
    split_of = bible.split_chapters(sizes, seed=0)
    assert set(split_of) == set(sizes) and set(split_of.values()) == {"train", "validation",
                                                                      "test"}
    pairs = collections.Counter()
    for chapter, split in split_of.items():
        pairs[split] += sizes[chapter]
    assert 1000 - 60 < pairs["test"] <= 1000 and 500 - 60 < pairs["validation"] <= 500
    assert pairs["train"] == sum(sizes.values()) - pairs["test"] - pairs["validation"]


def test_split_chapters_is_fixed_by_the_seed():
    sizes = synthetic_chapter_sizes()
    def test(seed):
        return {c for c, s in bible.split_chapters(sizes, seed=seed).items() if s == "test"}

    assert test(0) == test(0) and test(1) == test(1)
    assert test(0) != test(1)


def test_write_corpus_gives_the_folder_layout_with_no_chapter_in_two_splits(tmp_path):
    sizes = synthetic_chapter_sizes()
    pairs = [((book, chapter), f"es {book} {chapter} {i}", f"en {book} {chapter} {i}")
             for (book, chapter), n in sizes.items() for i in range(n)]
    counts = bible.write_corpus(str(tmp_path), pairs, bible.split_chapters(sizes, seed=7))
    splits_of = collections.defaultdict(set)
    for split in ("train", "validation", "test"):
        read = read_folder_split(str(tmp_path), split, "es", "en")  # as folder:PATH reads it
        assert len(read) == counts[split]
        for pair in read:
            _, book, chapter, _ = pair["source"].split()
            assert pair["target"] == "en" + pair["source"][2:]
            splits_of[book, int(chapter)].add(split)
    assert len(splits_of) == len(sizes) and all(len(s) == 1 for s in splits_of.values())
    assert sum(counts.values()) == len(pairs)


def test_an_output_that_cannot_be_made_stops_before_any_reading(tmp_path, monkeypatch):
    monkeypatch.setattr(bible, "read_modules", lambda path: pytest.fail("read the modules"))
    (tmp_path / "a_file").write_text("")
    for output in (tmp_path / "a_file", tmp_path / "a_file" / "corpus"):
        with pytest.raises(SystemExit) as exit_info:
            bible.main([f"--output={output}"])
        assert exit_info.value.code == (f"error: cannot make --output={output}: "
                                        f"{tmp_path / 'a_file'} is not a folder")


def test_a_run_that_stops_early_leaves_no_empty_output(tmp_path, monkeypatch):
    """The folder was made first, so a run without pysword or the modules left it empty
    (and train.py then read "holds: nothing"); it is made when the corpus is written."""
    def no_modules(path):
        raise SystemExit(f"error: SWORD module spaRV1909eb not found in {path}")

    monkeypatch.setattr(bible, "read_modules", no_modules)
    with pytest.raises(SystemExit):
        bible.main([f"--output={tmp_path / 'new' / 'corpus'}", f"--sword_path={tmp_path}"])
    assert list(tmp_path.iterdir()) == []


def test_a_module_without_its_text_is_one_line(tmp_path, monkeypatch):
    """pysword finds the module's .conf, then fails to open its text: an OSError traceback.
    (pysword 0.2.8's own words, from a stand-in: pysword is not a test dependency.)"""
    class SwordModules:
        def __init__(self, path):
            pass

        def parse_modules(self):
            return {name: {} for name, _ in bible.MODULES.values()}

        def get_bible_from_module(self, name):
            raise OSError("Could not open OT or NT for module")

    canon = {"kjv": {"ot": [("Genesis", "Gen", "Gen", [2])], "nt": []}}
    monkeypatch.setitem(sys.modules, "pysword", types.ModuleType("pysword"))
    monkeypatch.setitem(sys.modules, "pysword.canons", types.SimpleNamespace(canons=canon))
    monkeypatch.setitem(sys.modules, "pysword.modules",
                        types.SimpleNamespace(SwordModules=SwordModules))
    (tmp_path / "mods.d").mkdir()
    for name, _ in bible.MODULES.values():  # as Debian's: comments, then the name
        (tmp_path / "mods.d" / f"{name}.conf").write_text(
            f"## Sword module configuration file\n\n[{name}]\nDataPath=./modules/\n")
    with pytest.raises(SystemExit) as exit_info:
        bible.read_modules(str(tmp_path))
    assert exit_info.value.code == (
        f"error: SWORD module spaRV1909eb in {tmp_path} cannot be read (Could not open OT or "
        f"NT for module); reinstall it with: apt-get install --reinstall sword-text-sparv")


def test_what_is_missing_is_said_at_once(tmp_path, monkeypatch):
    """Without pysword and the modules, one line names all three installs; before, each
    was named only once the one before it was installed. A module whose .conf names it
    counts as there, whatever the file is called."""
    monkeypatch.setitem(sys.modules, "pysword", None)  # an import of it fails
    (tmp_path / "mods.d").mkdir()
    with pytest.raises(SystemExit) as exit_info:
        bible.read_modules(str(tmp_path))
    assert exit_info.value.code == (
        f"error: pysword is not installed; install it with: pip install pysword; SWORD modules "
        f"spaRV1909eb and engWEB2015eb not found in {tmp_path}; install them with: apt-get "
        f"install sword-text-sparv sword-text-web (or give --sword_path)")
    (tmp_path / "mods.d" / "web.conf").write_text("# a comment\n[engWEB2015eb]\n")
    assert bible._missing(str(tmp_path)) == [
        "pysword is not installed; install it with: pip install pysword",
        f"SWORD module spaRV1909eb not found in {tmp_path}; install it with: apt-get install "
        f"sword-text-sparv (or give --sword_path)"]


def fake_pysword(monkeypatch, tmp_path, books: dict, text_of) -> None:
    """pysword as build_corpus uses it, over `books` ({name: (osis, verses per chapter)})
    and `text_of(lang, osis, chapter, verse)`: a verse's markup, or None for one the
    module's versification lacks (pysword's ValueError). The modules' .conf files in
    `tmp_path`/mods.d. (A stand-in: pysword and the SWORD modules are not test
    dependencies.)"""
    lang_of = {name: lang for lang, (name, _) in bible.MODULES.items()}
    osis_of = {name: osis for name, (osis, _) in books.items()}

    class Bible:
        def __init__(self, lang):
            self.lang = lang

        def get(self, books, chapters, verses, clean):
            assert not clean  # build_corpus cleans the OSIS markup itself
            text = text_of(self.lang, osis_of[books], chapters, verses)
            if text is None:
                raise ValueError("verse not in the versification")
            return text

    class SwordModules:
        def __init__(self, path):
            assert path == str(tmp_path)

        def parse_modules(self):
            return {name: {"version": "1.0", "description": f"{name} text"}
                    for name in lang_of}

        def get_bible_from_module(self, name):
            return Bible(lang_of[name])

    canon = {"kjv": {"ot": [(name, osis, osis, lengths) for name, (osis, lengths)
                            in books.items()], "nt": []}}
    monkeypatch.setitem(sys.modules, "pysword", types.ModuleType("pysword"))
    monkeypatch.setitem(sys.modules, "pysword.canons", types.SimpleNamespace(canons=canon))
    monkeypatch.setitem(sys.modules, "pysword.modules",
                        types.SimpleNamespace(SwordModules=SwordModules))
    (tmp_path / "mods.d").mkdir()
    for name in lang_of:
        (tmp_path / "mods.d" / f"{name}.conf").write_text(f"[{name}]\n")


def test_the_script_reads_cleans_aligns_and_holds_out_whole_chapters(tmp_path, monkeypatch):
    """main() end to end over two books of 4 chapters of 12 verses, three words each drawn
    from 100 pairs (Spanish wK, English tK; footnotes in the English markup). The Spanish
    Exodus 2 is numbered as the module numbers Num 13: its verse v holds English verse
    v + 1, and it has no verse 12. Each pair written holds one verse's words on both sides,
    but Spanish Exodus 2:1, which English 2:1 and 2:2 are joined to (English 2:1 has no
    Spanish verse of its own); the held-out chapters (2 for test, 1 for validation, sizes
    in pairs) are whole."""
    rng = random.Random(0)
    books = {"Genesis": ("Gen", [12] * 4), "Exodus": ("Exod", [12] * 4)}
    words = {(osis, c, v): rng.sample(range(100), 3) for osis, lengths in books.values()
             for c, n in enumerate(lengths, 1) for v in range(1, n + 1)}

    def text_of(lang, osis, chapter, verse):
        if lang == "en":
            first, *rest = words[osis, chapter, verse]
            return (f'<w lemma="strong:H1">t{first}</w><note placement="foot">or, t{first}'
                    f'</note><w>{" ".join(f"t{k}" for k in rest)}</w>')
        if (osis, chapter) == ("Exod", 2):
            return None if verse == 12 else " ".join(f"w{k}" for k in words[osis, 2, verse + 1])
        return " ".join(f"w{k}" for k in words[osis, chapter, verse])

    fake_pysword(monkeypatch, tmp_path, books, text_of)
    monkeypatch.setattr(bible, "split_chapters", functools.partial(
        bible.split_chapters, sizes={"test": 24, "validation": 12}))
    output = tmp_path / "corpus"
    bible.main([f"--output={output}", f"--sword_path={tmp_path}", "--seed=1"])
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["alignment"] == {"1-1, same reference": 84, "1-1, realigned": 10,
                                     "1-2, realigned": 1}
    assert manifest["pairs"] == {"train": 59, "validation": 12, "test": 24}
    assert manifest["chapters"] == {"train": 5, "validation": 1, "test": 2}
    assert manifest["sources"]["es"]["module"] == "spaRV1909eb"
    split_of = {tuple(name.split()): split for split, names
                in manifest["held_out_chapters"].items() for name in names}
    chapter_of = {tuple(sorted(k)): (osis, str(c)) for (osis, c, _), k in words.items()}
    joined = sorted(words["Exod", 2, 1] + words["Exod", 2, 2])
    for split in ("train", "validation", "test"):
        for pair in read_folder_split(str(output), split, "es", "en"):
            es = tuple(sorted(int(w.removeprefix("w")) for w in pair["source"].split()))
            en = sorted(int(w.removeprefix("t")) for w in pair["target"].split())  # no notes
            assert en == (joined if es == tuple(sorted(words["Exod", 2, 2])) else list(es))
            assert split_of.get(chapter_of[es], "train") == split


# --- The config -----------------------------------------------------------------------------

def test_the_config_checks_and_averages_the_steps_its_comments_name():
    """config.py passes train.py's checks, and `--checkpoint=average:5` at its end averages
    steps 2,000 to 6,000, the steps the README names: the run ends where validation BLEU was
    highest in the H100's 12,000 steps. The steps saved are the trainer's rule's."""
    from transformer_jax.trainer import _Periodic

    spec = importlib.util.spec_from_file_location(
        "bible_config", _PATH.parent / "config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    check_config(config)
    checkpoints = _Periodic(config.checkpoint_every_steps, run=None, on_stop=True)
    saved = [step for step in range(1, config.num_train_steps + 1)
             if checkpoints.due(step, config.num_train_steps, stopped=False)]
    assert saved[-config.checkpoints_to_keep:] == [2000, 3000, 4000, 5000, 6000]
    assert config.data.dataset == "folder:examples/bible/corpus"
