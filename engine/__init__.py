"""DFlash engine: model loading, the DFlash draft model, the decode loop, fallback, bench, training.

A leaf package: it imports torch and transformers, never another package of ours.
"""
