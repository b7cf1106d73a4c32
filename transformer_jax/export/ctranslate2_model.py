"""A trained run as a CTranslate2 model, and translation with it.

CTranslate2 is the inference engine that OpenNMT, fairseq and Marian models convert to.
Its `TransformerSpec` expresses our model as it is (§3): post-layer-norm layers (or
pre-LN with the final norms), ReLU feed-forward, the shared embedding multiplied by
√d_model (its `scale_embeddings`), and the tied output projection: the same matrix in
the three places, which CTranslate2 stores once (it aliases equal variables). Our
interleaved sinusoidal table (§3.5) is written as the position encodings, so
CTranslate2's own (concatenated) table is never used.

Two things differ from our search, by design of the engines:
- the length penalty: CTranslate2 divides log P(Y) by |Y|^α, §6.1 (and `decoding.py`)
  by ((5 + |Y|) / 6)^α; greedy search and α = 0 are unaffected;
- when a beam search stops: §6.1's (`decoding.beam_search`) once no live hypothesis can
  beat the best finished one; CTranslate2's once `beam_size × patience` hypotheses have
  finished. At its default patience 1 it made 570 of the 2,000 numbers test outputs
  shorter than ours (BLEU 90.5 against our 98.2); at patience 4 all 2,000 were ours, so
  `translate_ids` passes `PATIENCE` = 4 (docs/serving.md);
- the padding id: our decoder never emits it (`Transformer.decode_step` sets its logit to
  the lowest float); here the projection's bias does the same, -65504 (float16's lowest,
  finite in every compute type) on id 0 and 0 elsewhere;
- at the output limit: `decoding.beam_search` prefers any finished hypothesis to one cut
  at max_length, CTranslate2 returns its best, cut or not; `translate_ids` asks for every
  hypothesis of the beam and takes the best finished one, as ours does.

Our sources end with EOS (§3.1's encoder input, `Tokenizer.encode(add_eos=True)`); the
model's config.json says so (`add_source_eos`), so any CTranslate2 client that passes the
SentencePiece pieces alone gets the translations we do.
"""

import dataclasses
import json
import os

import numpy as np
import tqdm

from transformer_jax.export import MAX_POSITIONS, QUANTIZATIONS
from transformer_jax.export.manifest import ExportError, read_manifest
from transformer_jax.model_config import ModelConfig
from transformer_jax.positional import sinusoidal_encoding
from transformer_jax.predict import BUCKET
from transformer_jax.token_ids import BOS_ID, DECODER_START_ID, EOS_ID, PAD_ID, UNK_ID
from transformer_jax.translation import (check_lengths, check_setting, search_settings,
                                         sentence_list)

PATIENCE = 4  # CTranslate2's beam search patience that gives §6.1's hypotheses (above)
_NEVER = -65504.0  # float16's lowest: the padding logit in every compute type


def check_options(quantization: str | None = None, max_positions: int = MAX_POSITIONS) -> dict:
    """The options of `export_ctranslate2` as given, or an ExportError naming the first that
    is wrong; also one when the ctranslate2 package is missing."""
    _ctranslate2()
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ExportError(f"quantization={quantization!r}: choose one of "
                          f"{', '.join(QUANTIZATIONS)}")
    if not isinstance(max_positions, (int, np.integer)) or isinstance(max_positions, bool) \
            or max_positions < 1:
        raise ExportError(f"max_positions must be a positive integer, got {max_positions!r}")
    return {"quantization": quantization, "max_positions": int(max_positions)}


def export_ctranslate2(trained, pieces: list[str], directory: str, *, search: dict,
                       quantization: str | None = None,
                       max_positions: int = MAX_POSITIONS) -> dict:
    """Writes `trained` (a `TrainedParams`) with the vocabulary `pieces` as a CTranslate2
    model into `directory`; returns export.json's keys of this format, among them the
    `translate_batch` arguments that search as `search` (the run's §6.1 settings) does."""
    spec = transformer_spec(trained.model.config, trained.params, pieces,
                            max_positions=max_positions)
    save_model(spec, directory, quantization)
    return {"quantization": quantization or "float32", "max_positions": max_positions,
            "ctranslate2_version": _ctranslate2().__version__,
            "ctranslate2_options": {"beam_size": search["beam_size"], "patience": PATIENCE,
                                    "length_penalty": search["alpha"],
                                    "min_decoding_length": 0}}


def _ctranslate2():
    """The ctranslate2 module; an ExportError that says how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise ExportError("the ctranslate2 format needs the ctranslate2 package: pip "
                          "install 'transformer_jax[serve]' (or pip install ctranslate2)") \
            from None
    return ctranslate2


def check_expressible(config: ModelConfig, max_positions: int) -> None:
    """An ExportError naming the setting, for what a CTranslate2 Transformer cannot hold.

    Attention dropout, the dtype and the attention implementation only matter in
    training or for speed, and are dropped.
    """
    if config.positional_encoding == "learned" and max_positions > config.max_length:
        raise ExportError(
            f"model.positional_encoding='learned' has a table of model.max_length="
            f"{config.max_length} positions; CTranslate2 cannot go beyond it: pass "
            f"--max_positions={config.max_length} or less")


def transformer_spec(config: ModelConfig, params: dict, pieces: list[str], *,
                     max_positions: int = MAX_POSITIONS):
    """The `ctranslate2.specs.TransformerSpec` of a model with parameters `params` and
    the vocabulary `pieces` (id i is `pieces[i]`); positions up to `max_positions`."""
    TransformerSpec = _ctranslate2().specs.TransformerSpec

    check_expressible(config, max_positions)
    params = _numpy(params)
    spec = TransformerSpec.from_config(config.num_layers, config.num_heads,
                                       pre_norm=config.pre_layer_norm)
    table_VD = params["embedder"]["table"]["embedding"]
    for side, stack in (("encoder", spec.encoder), ("decoder", spec.decoder)):
        stack.scale_embeddings = True  # ×√d_model (§3.4)
        stack.position_encodings.encodings = _positions(config, params[side], max_positions)
        if config.pre_layer_norm:
            _norm(stack.layer_norm, params[side]["final_norm"])
    spec.encoder.embeddings[0].weight = table_VD
    spec.decoder.embeddings.weight = table_VD
    spec.decoder.projection.weight = table_VD  # tied (§3.4)
    spec.decoder.projection.bias = np.zeros(config.vocab_size, np.float32)
    spec.decoder.projection.bias[PAD_ID] = _NEVER
    for i, layer in enumerate(spec.encoder.layer):
        p = params["encoder"][f"layer_{i}"]
        _attention(layer.self_attention, p["self_attention"], p["self_attention_norm"],
                   fused=True)
        _feed_forward(layer.ffn, p["ffn"], p["ffn_norm"])
    for i, layer in enumerate(spec.decoder.layer):
        p = params["decoder"][f"layer_{i}"]
        _attention(layer.self_attention, p["self_attention"], p["self_attention_norm"],
                   fused=True)
        _attention(layer.attention, p["cross_attention"], p["cross_attention_norm"],
                   fused=False)
        _feed_forward(layer.ffn, p["ffn"], p["ffn_norm"])
    vocabulary = _vocabulary(pieces, config.vocab_size)
    spec.register_source_vocabulary(vocabulary)
    spec.register_target_vocabulary(vocabulary)
    spec.config.layer_norm_epsilon = config.layer_norm_epsilon
    spec.config.unk_token, spec.config.bos_token = vocabulary[UNK_ID], vocabulary[BOS_ID]
    spec.config.eos_token = vocabulary[EOS_ID]
    spec.config.decoder_start_token = vocabulary[DECODER_START_ID]  # shifted right (§3.1)
    spec.config.add_source_eos = True  # our sources end with EOS: any client gets them so
    return spec


def save_model(spec, directory: str, quantization: str | None = None) -> None:
    """Validates, quantizes (None: float32 as trained) and writes `spec` into `directory`
    (which exists and is empty): CTranslate2's `Converter.convert`, without its CLI."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ExportError(f"quantization={quantization!r}: choose one of "
                          f"{', '.join(QUANTIZATIONS)}")
    spec.validate()
    spec.optimize(quantization=quantization)
    spec.save(directory)


def _numpy(tree):
    return {k: _numpy(v) if isinstance(v, dict) else np.array(v, np.float32)  # writable:
            for k, v in tree.items()}  # quantizing scales in place


def _positions(config: ModelConfig, params: dict, max_positions: int) -> np.ndarray:
    """The P = `max_positions` rows `(P, D)` the model adds to its embeddings (§3.5)."""
    if config.positional_encoding == "learned":
        return params["positions"]["table"][:max_positions]
    if config.positional_encoding == "none":
        return np.zeros((max_positions, config.d_model), np.float32)
    # A copy: NumPy's view of a JAX array is read-only, and CTranslate2's bfloat16 quantizing
    # passes it to torch.from_numpy, which warns about such arrays.
    return np.array(sinusoidal_encoding(np.arange(max_positions), config.d_model), np.float32)


def _linear(spec, kernel_in_out, bias_out) -> None:
    """A `LinearSpec` from a Flax kernel `(in..., out...)`: CTranslate2 stores `(out, in)`."""
    bias = bias_out.reshape(-1)
    spec.weight = kernel_in_out.reshape(-1, bias.size).T.copy()
    spec.bias = bias


def _norm(spec, p) -> None:
    spec.gamma, spec.beta = p["scale"], p["bias"]


def _attention(spec, p, norm, *, fused: bool) -> None:
    """Multi-head attention (§3.2.2): self-attention's Q, K, V projections are fused into
    one `(3D, D)` linear, encoder-decoder attention's K and V into one `(2D, D)`."""
    D = p["out"]["kernel"].shape[-1]

    def kernel(name):  # (D, N, H) -> (D, D)
        return p[name]["kernel"].reshape(D, D)

    def bias(name):  # zeros where the model has none (ModelConfig.attention_bias False)
        return p[name]["bias"].reshape(D) if "bias" in p[name] else np.zeros(D, np.float32)

    names = ("query", "key", "value") if fused else ("key", "value")
    if not fused:
        _linear(spec.linear[0], kernel("query"), bias("query"))
    _linear(spec.linear[0 if fused else 1], np.concatenate([kernel(n) for n in names], 1),
            np.concatenate([bias(n) for n in names]))
    _linear(spec.linear[-1], p["out"]["kernel"], bias("out"))  # W^O: (N, H, D)
    _norm(spec.layer_norm, norm)


def _feed_forward(spec, p, norm) -> None:
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (§3.3)."""
    _linear(spec.linear_0, p["wi"]["kernel"], p["wi"]["bias"])
    _linear(spec.linear_1, p["wo"]["kernel"], p["wo"]["bias"])
    _norm(spec.layer_norm, norm)


def _vocabulary(pieces: list[str], vocab_size: int) -> list[str]:
    """The tokenizer's pieces, padded with never-used names to the model's V rows."""
    if len(pieces) > vocab_size:
        raise ExportError(f"the tokenizer has {len(pieces)} pieces, more than the model's "
                          f"vocab_size={vocab_size}")
    return list(pieces) + [f"<unused_{i}>" for i in range(len(pieces), vocab_size)]


@dataclasses.dataclass
class CTranslate2Translator:
    """Translation with an exported CTranslate2 model and its SentencePiece tokenizer."""

    translator: object  # ctranslate2.Translator
    pieces: list[str]  # the vocabulary: id i is pieces[i]
    search: dict  # the run's beam_size, alpha, max_extra_length
    tokenizer: object = None  # transformer_jax.data.tokenizer.Tokenizer, for text
    max_positions: int = MAX_POSITIONS  # the export's position table: the longest in or out
    adds_eos: bool = False  # the model appends EOS to each source (exports since add_source_eos)

    @classmethod
    def from_export(cls, directory: str, *, device: str = "cpu", compute_type: str = "default",
                    threads: int = 0) -> "CTranslate2Translator":
        """The model exported to `directory`; `threads` 0 lets CTranslate2 choose."""
        manifest = read_manifest(directory, "ctranslate2")
        tokenizer = _exported_tokenizer(directory, manifest)
        ctranslate2 = _ctranslate2()  # its own error, not "CTranslate2 cannot load DIR"
        try:
            translator = ctranslate2.Translator(directory, device=device,
                                                   compute_type=compute_type,
                                                   intra_threads=threads)
            with open(os.path.join(directory, "shared_vocabulary.json"), encoding="utf-8") as f:
                pieces = json.load(f)
            with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
                adds_eos = bool(json.load(f).get("add_source_eos"))
        except (RuntimeError, ValueError, OSError) as error:
            raise ExportError(f"CTranslate2 cannot load {directory}: {error}") from None
        if pieces[:tokenizer.vocab_size] != [tokenizer.id_to_piece(i)
                                            for i in range(tokenizer.vocab_size)]:
            raise ExportError(f"{directory}'s tokenizer.model has other pieces than its "
                              f"model's vocabulary; export again")
        # Exports made by `export()` without max_positions have the default table.
        return cls(translator, pieces, manifest["search"], tokenizer,
                   manifest.get("max_positions", MAX_POSITIONS), adds_eos)

    def translate_ids(self, source_ids: list[list[int]], *, beam_size: int, alpha: float,
                      max_extra_length: int, batch_size: int = 32, patience: int = PATIENCE,
                      progress: bool = False) -> list[list[int]]:
        """The output ids of each source (EOS-terminated ids), in the sources' order.

        Batches as `predict.predict` makes them (sorted by length, `batch_size` at a
        time), with the same output limit: the batch's longest source rounded up to a
        multiple of `predict.BUCKET`, plus `max_extra_length` tokens, and no more than the
        position table's `max_positions` (CTranslate2 fails past its end). Of the beam's
        hypotheses, the best that ended with EOS, else the best (as `decoding.beam_search`).
        """
        ids = {piece: i for i, piece in enumerate(self.pieces)}
        order = sorted(range(len(source_ids)), key=lambda i: len(source_ids[i]))
        outputs: list[list[int]] = [[] for _ in source_ids]
        starts = range(0, len(order), batch_size)
        eos = self.pieces[EOS_ID]
        # A `with`: an error or Ctrl-C ends the bar's line at once (as predict.py's).
        with tqdm.tqdm(starts, desc="translating", unit="batch", disable=not progress) as bar:
            for start in bar:
                chosen = order[start:start + batch_size]
                tokens = [[self.pieces[i] for i in source_ids[j]] for j in chosen]
                longest = -(-max(map(len, tokens)) // BUCKET) * BUCKET
                if self.adds_eos:  # the model appends the EOS our ids end with
                    tokens = [t[:-1] if t and t[-1] == eos else t for t in tokens]
                results = self.translator.translate_batch(
                    tokens, beam_size=beam_size, patience=patience, length_penalty=alpha,
                    max_input_length=0, min_decoding_length=0,  # ours may end at once
                    max_decoding_length=min(longest + max_extra_length, self.max_positions),
                    num_hypotheses=beam_size, return_end_token=True)
                for j, result in zip(chosen, results):
                    finished = [h for h in result.hypotheses if h and h[-1] == eos]
                    outputs[j] = [ids[p] for p in (finished or result.hypotheses)[0]]
        return outputs

    def translate(self, sentences: list[str], *, beam_size: int | None = None,
                  alpha: float | None = None, max_extra_length: int | None = None,
                  batch_size: int = 32, max_input_length: int | None = None,
                  progress: bool = False) -> list[str]:
        """Translations of `sentences`, as `Translator.translate` (same settings, same
        errors); settings left None are the exported run's."""
        search = search_settings(self.search, beam_size=beam_size, alpha=alpha,
                                 max_extra_length=max_extra_length)
        batch_size = check_setting("batch_size", batch_size)
        ids = self.tokenizer.encode_batch(sentence_list(sentences), add_eos=True)
        check_lengths(ids, check_setting("max_input_length", max_input_length))
        check_lengths(ids, self.max_positions, limit="the export's max_positions={}",
                      advice="split it or export with a larger --max_positions")
        outputs = self.translate_ids(ids, batch_size=batch_size, progress=progress, **search)
        return self.tokenizer.decode_batch(outputs)


def _exported_tokenizer(directory: str, manifest: dict):
    """The export's tokenizer.model, or an ExportError where it is missing, damaged or not
    the one exported (another model's ids would translate into nonsense, silently)."""
    from transformer_jax.data.tokenizer import Tokenizer, proto_sha256
    from transformer_jax.data.vocabulary import TOKENIZER_FILE

    path = os.path.join(directory, TOKENIZER_FILE)
    if not os.path.isfile(path):
        raise ExportError(f"{directory} has no {TOKENIZER_FILE}; export again")
    with open(path, "rb") as f:
        proto = f.read()
    # The bytes first, as the stablehlo engine does: another model, whole or not, is named
    # so; "damaged" where the export has no SHA-256 to compare (older exports).
    sha256 = proto_sha256(proto)
    if manifest.get("tokenizer_sha256", sha256) != sha256:
        raise ExportError(f"{path} is not the tokenizer this model was exported with "
                          f"(SHA-256 {sha256[:12]}..., exported "
                          f"{manifest['tokenizer_sha256'][:12]}...); export again")
    try:
        return Tokenizer(proto)
    except ValueError:
        raise ExportError(f"{path} is damaged (not the SentencePiece model exported); "
                          f"export again") from None
