"""Attention for the engine: the paged-attention interface and its backends
(the plain-torch reference here; the Triton kernels in ``ironbatch.kernels``)."""
