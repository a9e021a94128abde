"""ironbatch's Triton kernels (``shared/spec/kernels.md``): the KV-cache
write (``reshape_and_cache``) and one paged-attention kernel for batches that
mix chunked prefills, prefix-hit continuations and decodes
(``unified_attention``). Importing this package needs torch and triton.

Under ``TRITON_INTERPRET=1`` (set before this package is imported) the
kernels run on the CPU for tests; the interpreter computes bf16 wrongly, so
loads are cast to fp32 there.
"""

from ironbatch.kernels.reshape_and_cache import reshape_and_cache
from ironbatch.kernels.unified_attention import unified_attention

__all__ = ["reshape_and_cache", "unified_attention"]
