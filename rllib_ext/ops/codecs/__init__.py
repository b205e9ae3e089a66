"""Gradient codecs: the arithmetic of the compressed all-reduces, one module per codec.

=============  ===============================================  ===============================
module         what the hook calls                              reference (tests compare)
=============  ===============================================  ===============================
``cast``       ``cast_compress``, ``round_to_bf16``,            ``cast_reference``
               ``bf16_bytes``/``bf16_mean_of_bytes``
``onebit``     ``encode`` (with error feedback), ``decode_mean``  ``onebit_reference``
``powersgd``   ``add_error_and_p``, ``compute_qt``,             ``powersgd_reference``
               ``decode_with_error``
=============  ===============================================  ===============================

Each function holds its math once, with torch ops and (1-bit, PowerSGD) the fused numba kernels
of :mod:`~rllib_ext.ops.codecs._numba` behind it; :func:`select_kernels` is the one rule that
picks between them (``kernel="auto"|"numba"|"torch"``). No ``torch.distributed``, no Ray: the
hooks in :mod:`rllib_ext.distributed` move the bytes.
"""

from __future__ import annotations

from rllib_ext.ops.codecs._select import KERNEL_CHOICES, check_kernel, select_kernels

__all__ = ["KERNEL_CHOICES", "check_kernel", "select_kernels"]
