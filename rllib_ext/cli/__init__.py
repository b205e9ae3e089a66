"""The ``rllib-ext`` command line: ``train``, ``evaluate`` and ``doctor``.

Entry point: ``rllib_ext.cli.main:main``.
"""
