"""The trainer's front door: what the login side reads of the trainer, without torch, transformers or numpy.

The config models (``config``, ``data_config``), the data sources' checks (``data_sources``), the parallel layout
(``layout``), the check every rank runs first (``run_check``), the trainer's module and keys (``interface``) and the
tokenizer's files (``tokenizer``).
"""
