"""Pretraining objectives as plug-ins: one module each and one line in registry.py (interface.py says how).

mlm (the base the others subclass), sentence (NSP / SOP), electra (+ electra_model), with masking and
sparse_loss shared. This file imports nothing, so importing the registry loads no objective.
"""
