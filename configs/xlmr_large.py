"""XLM-R large: configs/xlmr_base.py with size=large (see its docstring for the recipe and hardware).

  # the store of xlmr_base (its docstring has the prepare command)
  python -m mlm_jax.train --config=configs/xlmr_large.py --workdir=gs://BUCKET/xlmr_large
"""
import importlib.util
import os

_spec = importlib.util.spec_from_file_location("xlmr_base", os.path.join(os.path.dirname(__file__), "xlmr_base.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)


def get_config():
  return _base.get_config("large")
