"""Serving ardea's trainer behind other training APIs (the layer between trainer and cli).

- :mod:`ardea.service.tinker_server`: the Tinker API (``ardea serve --tinker``), which the
  ``tinker`` SDK and tinker-cookbook recipes drive unchanged.
"""
