"""Translating with a trained run: a workdir's model, parameters and tokenizer.

    translator = Translator.from_workdir("runs/default", checkpoint="average:3")
    translator.translate(["dreihundertzweiundvierzig"])  # ["three hundred and forty-two"]
    translator.attention_maps("dreihundertzweiundvierzig", "three hundred and forty-two")

Beam search as in §6.1 unless the run's `config.decode` says otherwise: beam 4,
length penalty α = 0.6, outputs up to the input length + 50 tokens (its batch's padded
length: `predict`). The parts:
`trained_params.py` chooses and restores the parameters, `predict.py` searches in
batches, `bleu.py` scores. An empty line translates to an empty line, unsearched.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.data.vocabulary import other_tokenizer, tokenizer_path
from transformer_jax.model import Transformer
from transformer_jax.predict import position_rows, predict
from transformer_jax.run_config import SEARCH_SETTINGS, decode_fields
from transformer_jax.trained_params import CheckpointChoiceError, load_trained_params


class TranslationError(ValueError):
    """A workdir that cannot translate (no checkpoint, no tokenizer, a bad --checkpoint),
    or a sentence longer than the limit."""


class SentenceTooLongError(TranslationError):
    """A sentence of more tokens than a limit (max_input_length, an export's longest
    bucket): the others can still be translated."""


@dataclasses.dataclass
class Translator:
    """A trained model, its tokenizer, and the search settings of §6.1."""

    model: Transformer
    params: dict = dataclasses.field(repr=False)  # its arrays would fill a notebook's cell
    tokenizer: Tokenizer
    run_config: ml_collections.ConfigDict = dataclasses.field(repr=False)
    steps: list[int]

    @classmethod
    def from_workdir(cls, workdir: str, checkpoint: str | int = "latest") -> "Translator":
        """`workdir`'s parameters named by `checkpoint` (latest, a step, or average:N)."""
        try:
            trained = load_trained_params(workdir, checkpoint)
        except (CheckpointChoiceError, FileNotFoundError) as error:
            raise TranslationError(str(error)) from None
        # The workdir's own tokenizer: the path saved at training time may have moved.
        path = tokenizer_path(workdir)
        try:
            tokenizer = Tokenizer.load(path)
        except FileNotFoundError as error:
            raise TranslationError(str(error)) from None
        except OSError as error:
            raise TranslationError(f"cannot read {path}: {error.strerror or error}") from None
        if why := other_tokenizer(trained.metadata, tokenizer):
            raise TranslationError(f"{workdir}/checkpoints/{trained.steps[-1]} {why}")
        return cls(trained.model, trained.params, tokenizer,
                   ml_collections.ConfigDict(trained.metadata["config"]), trained.steps)

    def search_settings(self, **given) -> dict:
        """`search_settings` of this run's config: those `given`, else its decode group's."""
        return search_settings(self.run_config.get("decode"), **given)

    def translate(self, sentences: list[str], *, beam_size: int | None = None,
                  alpha: float | None = None, max_extra_length: int | None = None,
                  batch_size: int = 32, max_input_length: int | None = None,
                  progress: bool = False) -> list[str]:
        """Translations of `sentences`, in their order; beam_size 1 is greedy search.

        Search settings left None are the run's (`search_settings`). A setting that
        translate.py's flag would refuse is a ValueError in its words (`check_setting`);
        `sentences` as one str, a TypeError. An empty sentence, or one of whitespace
        alone, translates to "" without a search (`predict.skip_empty`).

        Sentences are searched in batches of similar length, each of at most `batch_size`
        rows and no more rows than it has sentences (rounded up to a power of two, so few
        shapes compile; `predict.predict`). A sentence of more than `max_input_length`
        tokens (EOS included; None: no limit) is a TranslationError before any search:
        the search's memory grows with the input's length times its output's. So is one
        longer than a learned position table (`predict.position_rows`).
        """
        search = self.search_settings(beam_size=beam_size, alpha=alpha,
                                      max_extra_length=max_extra_length)
        batch_size = check_setting("batch_size", batch_size)
        max_input_length = check_setting("max_input_length", max_input_length)
        ids = self.tokenizer.encode_batch(sentence_list(sentences), add_eos=True)
        check_lengths(ids, max_input_length)
        check_lengths(ids, position_rows(self.model.config),
                      limit="the {} rows of the model's learned position table",
                      advice="split it, or train with a larger config.model.max_length")
        outputs = predict(self.model, self.params, ids, batch_size=batch_size,
                          progress=progress, **search)
        return self.tokenizer.decode_batch(outputs)

    def attention_maps(self, source: str, target: str) -> dict:
        """Where the decoder looks in `source` while it reads `target` (teacher-forced).

        Returns a dict:
          "source"           the S source pieces, e.g. ["▁dreihundert", "zwei", "undvierzig",
                             "</s>"]
          "target"           the T target pieces, also ending with "</s>"
          "cross_attention"  float32 `(L, N, T, S)`: the encoder-decoder attention
                             weights of every layer and head; row t is the query that
                             predicts target piece t (it has read the pieces before t),
                             and every row sums to 1.

        `source` and `target` are one sentence each (str): a TypeError otherwise, and a
        ValueError for a blank one (its map would be the end of sentence's alone).
        """
        if not (isinstance(source, str) and isinstance(target, str)):
            raise TypeError(f"attention_maps takes a source and a target sentence, each a "
                            f"str, not {type(source).__name__} and {type(target).__name__}")
        blank = [name for name, text in (("source", source), ("target", target))
                 if not text.strip()]
        if blank:
            raise ValueError(f"attention_maps needs words in the source and the target; "
                             f"the {' and the '.join(blank)} {'is' if len(blank) == 1 else 'are'}"
                             f" blank")
        source_ids = self.tokenizer.encode(source, add_eos=True)
        target_ids = self.tokenizer.encode(target, add_eos=True)
        weights_LBNTS = cross_attention_weights(self.model, self.params,
                                                np.array([source_ids], np.int32),
                                                np.array([target_ids], np.int32))

        def pieces(ids):
            return [self.tokenizer.id_to_piece(i) for i in ids]

        return {"source": pieces(source_ids), "target": pieces(target_ids),
                "cross_attention": np.asarray(weights_LBNTS[:, 0])}


def search_settings(decode, **given) -> dict:
    """beam_size, alpha and max_extra_length: those `given` (not None), else those of a
    run's `decode` group (§6.1's beam 4, α 0.6, input length + 50, unless it was changed;
    None: a run without one, those). A given value that translate.py's flag would refuse
    is a ValueError (`check_setting`)."""
    decode = decode or decode_fields()
    return {key: decode[key] if given.get(key) is None else check_setting(key, given[key])
            for key in ("beam_size", "alpha", "max_extra_length")}


def check_setting(name: str, value):
    """`value` of setting `name` (a key of SEARCH_SETTINGS) as translate.py's --name takes it, or
    None (the default) as is; else a ValueError in the flag's words, e.g.
    "beam_size=0: 0 is not a positive integer", or a TypeError for a value of no number type."""
    if value is None:
        return None
    parser = SEARCH_SETTINGS[name]
    # NumPy's scalars and JAX's concrete ones as their number, as argument_checks takes them.
    scalar = getattr(value, "dtype", None) is not None and np.ndim(value) == 0
    number = value.item() if scalar else value
    try:
        return parser.parse(number)
    except TypeError:  # absl's words ("Expect argument to be a string or int") are the flag's
        raise TypeError(f"{name}={value!r}: must be {parser.syntactic_help}, not a "
                        f"{type(number).__name__}") from None
    except ValueError as error:
        raise ValueError(f"{name}={value!r}: {error}") from None


def sentence_list(sentences) -> list[str]:
    """`sentences` as a list, or a TypeError where it is one str (whose characters would
    be translated one by one) or holds something other than str. A sentence of whitespace
    alone becomes "": training never saw one (`sources.has_text` skips such pairs), and an
    empty sentence translates to "" without a search."""
    if isinstance(sentences, (str, bytes)):
        raise TypeError(f"translate takes a list of sentences, not one "
                        f"{type(sentences).__name__}: pass [sentence]")
    sentences = list(sentences)
    for line, sentence in enumerate(sentences, 1):
        if not isinstance(sentence, str):
            raise TypeError(f"sentence {line} is a {type(sentence).__name__}, not a str")
    return [sentence if sentence.strip() else "" for sentence in sentences]


def check_lengths(source_ids: list[list[int]], max_input_length: int | None, *,
                  limit: str = "max_input_length={}",
                  advice: str = "split it or raise the limit (--max_input_length)") -> None:
    """A SentenceTooLongError naming the first source of more than `max_input_length` ids
    (None: no limit), raised before any search: "sentence N has ... tokens, more than
    `limit` ...; `advice`" ("the sentence" when there is one)."""
    cap = max_input_length or float("inf")
    too_long = [(i, len(x)) for i, x in enumerate(source_ids) if len(x) > cap]
    if too_long:
        line, length = too_long[0]
        which, count = (("the sentence", "") if len(source_ids) == 1 else
                        (f"sentence {line + 1}", f" ({len(too_long)} sentence(s) too long)"))
        raise SentenceTooLongError(f"{which} has {length} tokens, more than "
                                   f"{limit.format(cap)}{count}; {advice}")


@functools.partial(jax.jit, static_argnames=("model",))
def cross_attention_weights(model: Transformer, params, inputs_BS, targets_BT):
    """The encoder-decoder attention weights of every decoder layer, `(L, B, N, T, S)`.

    One teacher-forced pass (the decoder reads `targets_BT` shifted right) with the
    "intermediates" collection mutable, so each `MultiHeadAttention` sows its
    weights. Padding keys (id 0) get weight 0.
    """
    _, state = model.apply({"params": params}, inputs_BS, targets_BT, mutable=["intermediates"])
    layers = state["intermediates"]["decoder"]
    return jnp.stack([layers[f"layer_{i}"]["cross_attention"]["attention_weights"][0]
                      for i in range(model.config.num_layers)])
