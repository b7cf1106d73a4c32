"""Translating with a trained run: load a workdir, search with the cache, score with sacreBLEU.

    translator = Translator.from_workdir("runs/default", checkpoint="average:3")
    translator.translate(["dreihundertzweiundvierzig"])  # ["three hundred and forty-two"]
    translator.attention_maps("dreihundertzweiundvierzig", "three hundred and forty-two")

Beam search as in §6.1: beam 4, length penalty α = 0.6, outputs up to the input
length + 50 tokens. Sentences are sorted by length and batched, so similar
lengths share a compiled search; the results come back in input order.
"""

import dataclasses
import functools
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import sacrebleu
import tqdm

from transformer_jax.checkpoint import Checkpointer, DamagedCheckpointError
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.data.vocabulary import tokenizer_path
from transformer_jax.decoding import beam_search, greedy_search
from transformer_jax.model import Transformer
from transformer_jax.model_config import ModelConfig
from transformer_jax.optim import optimizer_from_config
from transformer_jax.run_config import decode_fields
from transformer_jax.steps import TrainState
from transformer_jax.token_ids import EOS_ID, PAD_ID

BUCKET = 8  # source lengths are rounded up to a multiple of this: fewer compilations


class TranslationError(ValueError):
    """A workdir that cannot translate (no checkpoint, no tokenizer, a bad --checkpoint)."""


def _checkpoint_steps(checkpointer: Checkpointer, which: str) -> list[int]:
    """`latest`, a step number, or `average:N` (the last N steps)."""
    steps = checkpointer.all_steps()
    if not steps:
        raise TranslationError(f"no checkpoint in {checkpointer.directory}; train first "
                               f"(python train.py --workdir=...)")
    if which == "latest":
        return steps[-1:]
    if which.startswith("average:"):
        count = which.removeprefix("average:")
        if not count.isdigit():
            raise TranslationError(f"checkpoint {which!r}: average:N needs a number of "
                                   f"checkpoints N, e.g. average:5")
        n = int(count)
        if not 1 <= n <= len(steps):
            raise TranslationError(f"average:{n} needs {n} checkpoints; there are "
                                   f"{len(steps)} ({', '.join(map(str, steps))})")
        return steps[-n:]
    if which.isdigit() and int(which) in steps:
        return [int(which)]
    listed = ", ".join(map(str, steps))
    raise TranslationError(f"checkpoint {which!r}: use latest, a step ({listed}) or average:N")


def average_params(param_trees):
    """The element-wise mean of several parameter trees (§6.1: checkpoint averaging)."""
    return jax.tree.map(lambda *leaves: sum(leaves) / len(leaves), *param_trees)


def _restore_params(checkpointer: Checkpointer, step: int, model, metadata: dict):
    tx = optimizer_from_config(metadata["config"]["optim"], model.config.d_model).tx
    tokens = jnp.ones((1, 1), jnp.int32)
    abstract = jax.eval_shape(lambda: TrainState.create(
        apply_fn=model.apply, params=model.init(jax.random.key(0), tokens, tokens)["params"],
        tx=tx))
    return checkpointer.restore(step, abstract)[0].params


@dataclasses.dataclass
class Translator:
    """A trained model, its tokenizer, and the search settings of §6.1."""

    model: Transformer
    params: dict
    tokenizer: Tokenizer
    run_config: ml_collections.ConfigDict
    steps: list[int]

    @classmethod
    def from_workdir(cls, workdir: str, checkpoint: str = "latest") -> "Translator":
        directory = os.path.join(os.path.abspath(workdir), "checkpoints")
        if not os.path.isdir(directory):
            raise TranslationError(f"{workdir} has no checkpoints; train first "
                                   f"(python train.py --workdir={workdir})")
        checkpointer = Checkpointer(directory, keep=1_000_000)

        def read(step):
            metadata = checkpointer.metadata(step)
            model = Transformer(ModelConfig(**metadata["model"]))
            return metadata, model, _restore_params(checkpointer, step, model, metadata)

        try:
            steps = _checkpoint_steps(checkpointer, checkpoint)
            if checkpoint == "latest":  # the newest that restores; training moves damaged ones
                found = checkpointer.newest(read, move_aside=False)
                if found is None:
                    raise TranslationError(f"no checkpoint in {directory} can be read")
                steps, (metadata, model, params) = [found[0]], found[1]
            else:
                reads = [checkpointer.read(s, read) for s in steps]
                (metadata, model, _), params = reads[-1], average_params([r[2] for r in reads])
        except DamagedCheckpointError as error:
            raise TranslationError(f"{error}; --checkpoint=latest falls back to the newest "
                                   f"that restores") from None
        finally:
            checkpointer.close()
        try:  # the workdir's own copy: the path saved at training time may have moved
            tokenizer = Tokenizer.load(tokenizer_path(workdir))
        except FileNotFoundError as error:
            raise TranslationError(str(error)) from None
        return cls(model, params, tokenizer, ml_collections.ConfigDict(metadata["config"]), steps)

    def search_settings(self, **given) -> dict:
        """beam_size, alpha and max_extra_length: those `given` (not None), else the run's
        `config.decode` (§6.1's beam 4, α 0.6, input length + 50, unless it was changed)."""
        decode = self.run_config.get("decode") or decode_fields()
        return {key: decode[key] if given.get(key) is None else given[key]
                for key in ("beam_size", "alpha", "max_extra_length")}

    def translate(self, sentences: list[str], *, beam_size: int | None = None,
                  alpha: float | None = None, max_extra_length: int | None = None,
                  batch_size: int = 32, max_input_length: int | None = None,
                  progress: bool = False) -> list[str]:
        """Translations of `sentences`, in their order; beam_size 1 is greedy search.

        Search settings left None are the run's (`search_settings`).

        Sentences are searched in batches of similar length, each of at most `batch_size`
        rows and no more rows than it has sentences (rounded up to a power of two, so few
        shapes compile). A sentence of more than `max_input_length` tokens (EOS included;
        None: no limit) is a TranslationError before any search: the search's memory
        grows with the input's length times its output's.
        """
        search = self.search_settings(beam_size=beam_size, alpha=alpha,
                                      max_extra_length=max_extra_length)
        cap = max_input_length or float("inf")
        ids = self.tokenizer.encode_batch(sentences, add_eos=True)
        too_long = [(i, len(x)) for i, x in enumerate(ids) if len(x) > cap]
        if too_long:
            line, length = too_long[0]
            raise TranslationError(
                f"sentence {line + 1} has {length} tokens, more than max_input_length={cap} "
                f"({len(too_long)} sentence(s) too long); split it or raise the limit")
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = [""] * len(ids)
        batches = range(0, len(order), batch_size)
        for start in tqdm.tqdm(batches, desc="translating", unit="batch", disable=not progress):
            chosen = order[start:start + batch_size]
            length = -(-max(len(ids[i]) for i in chosen) // BUCKET) * BUCKET
            rows = min(batch_size, 1 << (len(chosen) - 1).bit_length())
            inputs_BS = np.full((rows, length), PAD_ID, np.int32)
            for row, i in enumerate(chosen):
                inputs_BS[row, :len(ids[i])] = ids[i]
            outputs_BT = _search(self.model, self.params, inputs_BS,
                                 beam_size=search["beam_size"], alpha=search["alpha"],
                                 max_length=length + search["max_extra_length"])
            for row, text in zip(chosen, self.tokenizer.decode_batch(np.asarray(outputs_BT))):
                out[row] = text
        return out

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
        """
        source_ids = self.tokenizer.encode(source, add_eos=True)
        target_ids = self.tokenizer.encode(target, add_eos=True)
        weights_LBNTS = cross_attention_weights(self.model, self.params,
                                                np.array([source_ids], np.int32),
                                                np.array([target_ids], np.int32))

        def pieces(ids):
            return [self.tokenizer.id_to_piece(i) for i in ids]

        return {"source": pieces(source_ids), "target": pieces(target_ids),
                "cross_attention": np.asarray(weights_LBNTS[:, 0])}


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


@functools.partial(jax.jit, static_argnames=("model", "beam_size", "max_length", "alpha"))
def _search(model, params, inputs_BS, *, beam_size: int, max_length: int, alpha: float):
    """Encode once, project the cross-attention keys once, then search step by step."""
    variables = {"params": params}
    memory_BSD = model.apply(variables, inputs_BS, method=Transformer.encode)
    cache = model.apply(variables, memory_BSD, inputs_BS, max_length,
                        method=Transformer.init_cache)
    step = functools.partial(model.apply, variables, method=Transformer.decode_step)
    batch = inputs_BS.shape[0]
    if beam_size == 1:
        return greedy_search(step, cache, batch_size=batch, max_length=max_length,
                             eos_id=EOS_ID)
    return beam_search(step, cache, batch_size=batch, beam_size=beam_size,
                       max_length=max_length, alpha=alpha, eos_id=EOS_ID)[0]


def score(hypotheses: list[str], references: list[str]) -> dict:
    """Cased sacreBLEU and chrF of detokenized text, with the BLEU signature."""
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    return {"bleu": bleu.corpus_score(hypotheses, [references]).score,
            "chrf": chrf.corpus_score(hypotheses, [references]).score,
            "signature": str(bleu.get_signature())}


def evaluate(translator: Translator, pairs: list[dict], **search) -> dict:
    """Translates the sources of `pairs` and scores them against their targets."""
    start = time.perf_counter()
    hypotheses = translator.translate([p["source"] for p in pairs], progress=True, **search)
    seconds = time.perf_counter() - start
    return dict(score(hypotheses, [p["target"] for p in pairs]), hypotheses=hypotheses,
                sentences_per_sec=len(pairs) / seconds)
