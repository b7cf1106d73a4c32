"""transformer_jax: the Transformer of "Attention Is All You Need" in JAX and Flax.

Dimension key, used in tensor names (`q_BTNH`) and einsums across the package:
  B batch · T target/query length · S source/key length · D d_model · F d_ff
  N heads · H head dim (d_k = d_v) · V vocabulary · K beam · L layers
  C decoding-cache length · R search rows (B in greedy search, B·K in beam search)

The public API is listed in `__init__.pyi`, grouped by the paper's parts; each name is
imported from its module on first use (`tj.dot_product_attention` imports attention.py
and JAX), so `import transformer_jax` itself imports neither JAX nor Flax: the processes
that tokenize a large corpus import the package for its tokenizer alone
(data/parallel_encoding.py).
"""

import lazy_loader

from transformer_jax.provenance import package_version as _package_version

__version__ = _package_version()

__getattr__, _public_dir, __all__ = lazy_loader.attach_stub(__name__, __file__)


def __dir__():
    """The public API and the module's dunders: not the submodules that imports set as
    attributes, nor lazy_loader."""
    dunders = (name for name in globals()
               if name.startswith("__") and not name.startswith("__lazy"))  # lazy_loader's
    return sorted({*dunders, *_public_dir()})
