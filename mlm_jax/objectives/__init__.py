"""Pretraining objectives as plug-ins: one module each, one line in registry.py.

  interface.py    the Objective protocol: every question the rest of the code asks an objective
  registry.py     name -> "module:attr" (the values `config.objective` takes), imported lazily
  mlm.py          masked LM (BERT / RoBERTa / XLM-R): the base the others build on
  sentence.py     MLM + BERT's next-sentence prediction / ALBERT's sentence order
  electra.py      ELECTRA's replaced-token detection (the pair model: electra_pair.py)
  sparse_loss.py  the vocabulary projection and cross-entropy over the prediction slots only

This file imports nothing: choices.py reads the registry, and model.py imports choices.
"""
